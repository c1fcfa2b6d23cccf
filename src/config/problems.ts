import type { z } from 'zod';

/*
 * Config problems as a person reads them: one line each, `path: what and why`, naming the key of
 * another branch or the known key nearest to a misspelt one.
 */

/** `["gateway","auth","allowedIPs",2]` → `gateway.auth.allowedIPs[2]`. */
export function formatPath(at: readonly PropertyKey[]): string {
  let out = '';
  for (const part of at) {
    if (typeof part === 'number') out += `[${part}]`;
    else if (/^[A-Za-z_$][\w$]*$/.test(String(part))) out += (out ? '.' : '') + String(part);
    else out += `[${JSON.stringify(String(part))}]`;
  }
  return out || '(root)';
}

export function formatIssues(
  issues: readonly z.core.$ZodIssue[],
  schema: z.ZodType,
  input: unknown,
  at: (string | number)[],
  wholeReferences: Map<string, string>,
): string[] {
  return issues.flatMap((issue) => {
    const where = [...at, ...(issue.path as (string | number)[])];
    if (issue.code === 'unrecognized_keys') {
      const node = schemaAt(schema, input, issue.path as (string | number)[]);
      const known = knownKeys(node, getAt(input, issue.path as (string | number)[]));
      return issue.keys.map((key) => {
        // A key of another branch (`path` under driver "postgres"): which one it belongs to says more than a near name.
        const branches = branchesWithKey(node, getAt(input, issue.path as (string | number)[]), key);
        const nearest = nearestKey(key, known);
        const hint =
          branches.length > 0
            ? ` (only with ${branches.join(' or ')})`
            : nearest
              ? ` (did you mean "${nearest}"?)`
              : '';
        return `${formatPath([...where, key])}: unknown key${hint}`;
      });
    }
    const value = getAt(input, issue.path as (string | number)[]);
    // zod's default for a missing value reads "Invalid input: expected string, received undefined".
    const message =
      value === undefined && issue.code === 'invalid_type' && issue.message.startsWith('Invalid input:')
        ? `required (expected ${issue.expected})`
        : issue.message;
    // A value from the environment: which variable gave it (found by a newcomer: PORT=abc said only
    // "expected number"). Its name only, never the default written beside it (that may be a
    // secret); the text only where a number or boolean was wanted, and only a short plain one (a
    // miswired DATABASE_URL or token is not echoed).
    const variable = wholeReferences.get(JSON.stringify(where));
    const plain = typeof value === 'string' && /^[\w.+ -]{0,12}$/.test(value);
    const shown =
      issue.code === 'invalid_type' && ['number', 'boolean'].includes(issue.expected) && plain
        ? ` is ${JSON.stringify(value)}`
        : '';
    const source = variable === undefined ? '' : shown ? ` (${variable}${shown})` : ` (from ${variable})`;
    return [`${formatPath(where)}: ${message}${source}`];
  });
}

/**
 * The schema at `at` as declared (wrappers and unions still on it), following the input's
 * branch of each union on the way: every section is covered, read from the schema itself.
 */
function schemaAt(schema: z.ZodType, input: unknown, at: readonly (string | number)[]): z.core.$ZodType | undefined {
  let here: z.core.$ZodType | undefined = schema as unknown as z.core.$ZodType;
  for (let i = 0; here && i < at.length; i++) {
    const def = unwrap(here, getAt(input, at.slice(0, i)))?._zod.def as unknown as Record<string, any> | undefined;
    if (def?.type === 'object') here = def.shape[at[i]!];
    else if (def?.type === 'array') here = def.element;
    else if (def?.type === 'record') here = def.valueType;
    else return undefined;
  }
  return here;
}

/** The keys the schema `node` allows for `value` (a discriminated union: the value's branch). */
function knownKeys(node: z.core.$ZodType | undefined, value: unknown): string[] {
  const def = (node && unwrap(node, value))?._zod.def as unknown as Record<string, any> | undefined;
  return def?.type === 'object' ? Object.keys(def.shape) : [];
}

/** Where `node` is a discriminated union: the branches other than `value`'s that have `key` (its own), as `driver "sqlite"`. */
function branchesWithKey(node: z.core.$ZodType | undefined, value: unknown, key: string): string[] {
  let here = node;
  for (let i = 0; here && i < 20; i++) {
    const def = here._zod.def as unknown as Record<string, any>;
    if (['optional', 'default', 'prefault', 'nullable', 'readonly', 'catch', 'nonoptional'].includes(def.type))
      here = def.innerType;
    else if (def.type === 'pipe') here = def.in._zod.def.type === 'transform' ? def.out : def.in;
    else break;
  }
  const def = here?._zod.def as unknown as Record<string, any> | undefined;
  const discriminator = def?.discriminator as string | undefined;
  if (def?.type !== 'union' || discriminator === undefined) return [];
  return (def.options as z.core.$ZodType[]).flatMap((option) => {
    const shape = (unwrap(option, undefined)?._zod.def as any)?.shape;
    const values: unknown[] = shape?.[discriminator]?._zod.def.values ?? [];
    const chosen =
      value !== null && typeof value === 'object' ? (value as Record<string, unknown>)[discriminator] : undefined;
    // Own keys only: `toString` or `constructor` is in every shape's prototype chain, in no branch.
    return shape && Object.hasOwn(shape, key)
      ? values.filter((v) => v !== chosen).map((v) => `${discriminator} ${JSON.stringify(v)}`)
      : [];
  });
}

function unwrap(schema: z.core.$ZodType, value: unknown): z.core.$ZodType | undefined {
  let here: z.core.$ZodType | undefined = schema;
  for (let i = 0; here && i < 20; i++) {
    const def = here._zod.def as unknown as Record<string, any>;
    if (['optional', 'default', 'prefault', 'nullable', 'readonly', 'catch', 'nonoptional'].includes(def.type))
      here = def.innerType;
    else if (def.type === 'pipe') here = def.in._zod.def.type === 'transform' ? def.out : def.in;
    else if (def.type === 'union') {
      const options = def.options as z.core.$ZodType[];
      const discriminator = def.discriminator as string | undefined;
      const chosen =
        discriminator && value !== null && typeof value === 'object'
          ? options.find((o) => {
              const shape = (unwrap(o, undefined)?._zod.def as any)?.shape;
              return shape?.[discriminator]?._zod.def.values?.includes(
                (value as Record<string, unknown>)[discriminator],
              );
            })
          : undefined;
      here = chosen ?? options.find((o) => (unwrap(o, undefined)?._zod.def as any)?.type === 'object');
      if (here === undefined) return undefined;
    } else return here;
  }
  return here;
}

/** The closest known key within edit distance 2 (or a third of the longer name) of `key`, if one is that close. */
function nearestKey(key: string, known: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestScore = Infinity;
  for (const candidate of known) {
    const distance = editDistance(key.toLowerCase(), candidate.toLowerCase());
    // Relative to the longer name: "timout" → "timeoutMs" (3 edits in 9) is close, "foo" → "host" is not.
    const allowed = Math.max(2, Math.floor(Math.max(key.length, candidate.length) / 3));
    if (distance <= allowed && distance < bestScore) [best, bestScore] = [candidate, distance];
  }
  return best;
}

function editDistance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++)
      next[j] = Math.min(row[j]! + 1, next[j - 1]! + 1, row[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    row = next;
  }
  return row[b.length]!;
}

/** The value at a path into parsed input (undefined where it stops). */
export function getAt(value: unknown, at: readonly (string | number)[]): unknown {
  let here = value;
  for (const part of at) {
    if (here === null || typeof here !== 'object') return undefined;
    here = (here as Record<string | number, unknown>)[part];
  }
  return here;
}
