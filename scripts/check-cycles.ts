/**
 * `npm run lint` (part): no value-level import cycle under src/. A cycle between modules that
 * import values makes evaluation order decide whether a binding is initialised yet (a TDZ error
 * or `undefined` at start), and it means two layers lean on each other. `import type` and
 * `export type` vanish at compile time and are not counted; neither are dynamic `import()`s.
 */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const SRC = fileURLToPath(new URL('../src/', import.meta.url));
// Static imports and re-exports with a relative specifier, minus the type-only forms.
const STATIC_IMPORT = /^\s*(import|export)\s+(type\s+)?(?:[^'";]*?\s+from\s+)?['"](\.{1,2}\/[^'"]+)['"]/gm;

function modules(): string[] {
  return readdirSync(SRC, { recursive: true, encoding: 'utf8' })
    .filter((f) => f.endsWith('.ts') && !f.endsWith('.d.ts'))
    .map((f) => path.join(SRC, f));
}

/** Each module's value imports (absolute .ts paths). */
export function importGraph(files: readonly string[] = modules()): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const file of files) {
    const edges: string[] = [];
    for (const match of readFileSync(file, 'utf8').matchAll(STATIC_IMPORT)) {
      if (match[2]) continue; // import type / export type
      // `import { type A, type B } from` (no default import beside it) imports nothing at run time either.
      const onlyTypes = /^\s*(?:import|export)\s*\{([^}]*)\}/
        .exec(match[0])?.[1]
        ?.split(',')
        .every((n) => n.trim() === '' || n.trim().startsWith('type '));
      if (onlyTypes) continue;
      edges.push(path.resolve(path.dirname(file), match[3]!).replace(/\.js$/, '.ts'));
    }
    graph.set(file, edges);
  }
  return graph;
}

/** The strongly connected components with more than one module, or a module importing itself (Tarjan). */
export function cycles(graph: Map<string, string[]>): string[][] {
  let counter = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (node: string) => {
    index.set(node, counter);
    low.set(node, counter++);
    stack.push(node);
    onStack.add(node);
    for (const next of graph.get(node) ?? []) {
      if (!graph.has(next)) continue;
      if (!index.has(next)) {
        visit(next);
        low.set(node, Math.min(low.get(node)!, low.get(next)!));
      } else if (onStack.has(next)) {
        low.set(node, Math.min(low.get(node)!, index.get(next)!));
      }
    }
    if (low.get(node) === index.get(node)) {
      const component: string[] = [];
      let member: string;
      do {
        member = stack.pop()!;
        onStack.delete(member);
        component.push(member);
      } while (member !== node);
      if (component.length > 1 || (graph.get(node) ?? []).includes(node)) found.push(component);
    }
  };
  for (const node of graph.keys()) if (!index.has(node)) visit(node);
  return found;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const found = cycles(importGraph());
  for (const component of found) {
    process.stderr.write(
      `import cycle: ${component
        .map((f) => path.relative(SRC, f))
        .sort()
        .join(' ↔ ')}\n`,
    );
  }
  if (found.length > 0) process.exit(1);
  process.stdout.write('no import cycles under src/\n');
}
