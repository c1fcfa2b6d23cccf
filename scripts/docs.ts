// `npm run docs`: regenerates gateway.schema.json and docs/configuration.md from the zod schema
// (src/config/sections/*.ts), the one place each config key is described. test/config/reference.test.ts
// fails when either file differs from what this produces, or when a key has no description.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { configJsonSchema, describedConfigJsonSchema } from '../src/config/json-schema.js';

/** A JSON Schema node, as z.toJSONSchema writes them (only what the reference reads). */
interface Node {
  type?: string;
  description?: string;
  default?: unknown;
  const?: unknown;
  enum?: unknown[];
  properties?: Record<string, Node>;
  required?: string[];
  additionalProperties?: Node | boolean;
  items?: Node;
  anyOf?: Node[];
  oneOf?: Node[];
  minimum?: number;
  maximum?: number;
  exclusiveMinimum?: number;
  minLength?: number;
  minItems?: number;
  format?: string;
  docsType?: string;
  docsDefault?: string;
}

interface Row {
  key: string;
  type: string;
  fallback: string;
  description: string;
}

/** A table of keys: a section's own, or one branch of a union (`storage` with `driver: "postgres"`). */
interface Table {
  heading?: string;
  rows: Row[];
}

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
export const SCHEMA_FILE = path.join(ROOT, 'gateway.schema.json');
export const REFERENCE_FILE = path.join(ROOT, 'docs', 'configuration.md');

/** The two generated files' contents, exactly as `npm run docs` writes them. */
export function generatedFiles(): Record<string, string> {
  return {
    [SCHEMA_FILE]: JSON.stringify(configJsonSchema(), null, 2) + '\n',
    [REFERENCE_FILE]: configurationReference(describedConfigJsonSchema() as Node),
  };
}

/** Every key (a property at any depth, union branches and list items included) that has no description. */
export function undescribedKeys(schema: Node = describedConfigJsonSchema() as Node): string[] {
  const missing: string[] = [];
  const visit = (node: Node | undefined, at: string): void => {
    if (node === undefined) return;
    for (const [name, child] of Object.entries(node.properties ?? {})) {
      const key = at ? `${at}.${name}` : name;
      if (!child.description?.trim()) missing.push(key);
      visit(child, key);
    }
    visit(node.items, `${at}[]`);
    if (typeof node.additionalProperties === 'object') visit(node.additionalProperties, `${at}.<name>`);
    for (const branch of [...(node.anyOf ?? []), ...(node.oneOf ?? [])]) visit(branch, at);
  };
  visit(schema, '');
  return [...new Set(missing)];
}

export function configurationReference(schema: Node): string {
  const out = [
    '# Configuration reference',
    '',
    '<!-- Generated from the schema in src/config/ by scripts/docs.ts: do not edit; run `npm run docs`. -->',
    '',
    'Every key of the config file (`gateway.json5`): its type, its default and what it does. This page is',
    'generated from the schema gatehouse checks the file against (`src/config/sections/`), as is',
    '`gateway.schema.json`, the JSON Schema that gives editors completion and these descriptions on hover.',
    'Do not edit it: after a schema change, run `npm run docs`.',
    '',
    'The file format (JSON5), `${VAR}` references, `{ file }` secrets, relative paths, reloads and',
    '`gatehouse config check` are explained in [Config files](config-files.md).',
    '',
    'Keys are dotted paths: `[]` stands for any item of a list (`gateway.routes[].prefix`), `<name>` for a',
    'name you choose (`channels.<name>.kind`). **required**: the key must be given whenever the object',
    'holding it is; **—**: unset unless given (the description says what that means). Unknown keys are errors.',
    '',
    '## Top level',
    '',
    ...renderTable(
      Object.entries(schema.properties ?? {}).map(([name, node]) => ({
        key:
          node.properties || node.oneOf || node.additionalProperties
            ? `[\`${name}\`](#${name.toLowerCase()})`
            : `\`${name}\``,
        type: typeText(node),
        fallback: defaultText(node, schema.required?.includes(name) ?? false),
        description: node.description ?? '',
      })),
    ),
  ];
  for (const [name, node] of Object.entries(schema.properties ?? {})) {
    if (!(node.properties || node.oneOf || node.additionalProperties)) continue;
    const tables: Table[] = [{ rows: [] }];
    walk(node, name, tables, tables[0]!);
    out.push('', `## ${name}`, '', node.description ?? '');
    for (const table of tables) {
      if (table.rows.length === 0) continue;
      if (table.heading) out.push('', `### ${table.heading}`);
      out.push('', ...renderTable(table.rows));
    }
  }
  return out.join('\n') + '\n';
}

/** Adds the rows under `node` (at `at`) to `table`, and a table of its own for each branch of a union. */
function walk(node: Node, at: string, tables: Table[], table: Table): void {
  for (const [name, child] of Object.entries(node.properties ?? {})) {
    const key = `${at}.${name}`;
    table.rows.push({
      key: `\`${key}\``,
      type: typeText(child),
      fallback: defaultText(child, node.required?.includes(name) ?? false),
      description: child.description ?? '',
    });
    walk(child, key, tables, table);
  }
  if (node.items) walk(node.items, `${at}[]`, tables, table);
  if (typeof node.additionalProperties === 'object' && isObjectLike(node.additionalProperties)) {
    const value = node.additionalProperties;
    table.rows.push({
      key: `\`${at}.<name>\``,
      type: typeText(value),
      fallback: '—',
      description: value.description ?? '',
    });
    walk(value, `${at}.<name>`, tables, table);
  }
  const discriminator = discriminatorOf(node);
  if (discriminator) {
    for (const branch of node.oneOf ?? node.anyOf ?? []) {
      const value = JSON.stringify(branch.properties![discriminator]!.const);
      const own: Table = { heading: `\`${at}\` with \`${discriminator}: ${value}\``, rows: [] };
      tables.push(own);
      walk(branch, at, tables, own);
    }
  }
}

/** The key every branch of a union of objects sets to its own constant (`driver`, `type`, `kind`). */
function discriminatorOf(node: Node): string | undefined {
  const branches = node.oneOf ?? node.anyOf;
  if (!branches?.length || !branches.every((b) => b.properties)) return undefined;
  return Object.keys(branches[0]!.properties!).find((key) =>
    branches.every((b) => b.properties![key]?.const !== undefined),
  );
}

function isObjectLike(node: Node): boolean {
  return node.properties !== undefined || discriminatorOf(node) !== undefined;
}

/** The type as a reader would write it: `integer ≥ 1`, `"sqlite" | "postgres"`, `string[]`. */
function typeText(node: Node): string {
  if (node.docsType) return node.docsType;
  if (node.const !== undefined) return JSON.stringify(node.const);
  if (node.enum) return node.enum.map((value) => JSON.stringify(value)).join(' | ');
  const discriminator = discriminatorOf(node);
  if (discriminator) return `object, by \`${discriminator}\` (below)`;
  const alternatives = node.oneOf ?? node.anyOf;
  if (alternatives) return [...new Set(alternatives.map(typeText))].join(' | ');
  switch (node.type) {
    case 'integer':
    case 'number':
      return numberText(node);
    case 'string':
      if (node.format === 'email') return 'email address';
      if (node.format === 'date-time') return 'ISO 8601 date-time';
      return node.minLength !== undefined && node.minLength > 1 ? `string (≥ ${node.minLength} characters)` : 'string';
    case 'boolean':
      return 'boolean';
    case 'array': {
      const item = node.items ? typeText(node.items) : 'any';
      const list = /^[\w"]+$/.test(item) ? `${item}[]` : `list of ${item}`;
      return node.minItems ? `${list}, not empty` : list;
    }
    case 'object':
      if (typeof node.additionalProperties === 'object' && !node.properties)
        return `object (name → ${typeText(node.additionalProperties)})`;
      return 'object';
    default:
      return 'any';
  }
}

function numberText(node: Node): string {
  const word = node.type === 'integer' ? 'integer' : 'number';
  let min = node.minimum;
  if (node.exclusiveMinimum !== undefined)
    min = node.type === 'integer' ? node.exclusiveMinimum + 1 : node.exclusiveMinimum;
  const max = node.maximum !== undefined && node.maximum < Number.MAX_SAFE_INTEGER ? node.maximum : undefined;
  if (min !== undefined && max !== undefined) return `${word} ${min}–${max}`;
  if (min !== undefined) return `${word} ≥ ${min}`;
  if (max !== undefined) return `${word} ≤ ${max}`;
  return word;
}

function defaultText(node: Node, required: boolean): string {
  if (node.docsDefault) return node.docsDefault;
  if (node.default !== undefined) return `\`${valueText(node.default)}\``;
  return required ? 'required' : '—';
}

/** A value as JSON, with a space after each comma of a list (`["bot", "applications.commands"]`). */
function valueText(value: unknown): string {
  return Array.isArray(value) ? `[${value.map(valueText).join(', ')}]` : JSON.stringify(value);
}

function renderTable(rows: Row[]): string[] {
  const cell = (text: string) => text.replaceAll('|', '\\|');
  return [
    '| key | type | default | description |',
    '|---|---|---|---|',
    ...rows.map((row) => `| ${row.key} | ${cell(row.type)} | ${cell(row.fallback)} | ${cell(row.description)} |`),
  ];
}

if (process.argv[1] !== undefined && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  for (const [file, content] of Object.entries(generatedFiles())) {
    writeFileSync(file, content);
    console.log(`wrote ${path.relative(ROOT, file)}`);
  }
}
