import { z } from 'zod';
import { FILE_REFERENCE_KEYS } from './load.js';
import { configSchema } from './schema.js';

/** A whole-string environment reference, as load.ts expands it (`${VAR}`, `${VAR:-default}`, …). */
const ENV_REFERENCE_PATTERN = '^\\$\\{[A-Za-z_][A-Za-z0-9_]*([:]?[-?][^}]*)?\\}$';

/**
 * The JSON Schema (draft 2020-12) of a config file as written, generated from the zod schema
 * (so every section, present and future, is in it): defaults and constraints as zod states
 * them; wherever a value is a number, boolean or constrained string, a `${VAR}` reference is
 * also accepted, and secret keys also take `{ file }`, since load.ts expands those first.
 * `gatehouse config schema` prints it; gateway.schema.json is the committed copy.
 */
export function configJsonSchema(): Record<string, unknown> {
  const schema = z.toJSONSchema(configSchema, {
    io: 'input',
    target: 'draft-2020-12',
    // Refinements (CIDRs, templates, cross-field rules) have no JSON Schema form: `config check` has them.
    unrepresentable: 'any',
  }) as Record<string, unknown>;
  return {
    ...(acceptReferences(schema) as Record<string, unknown>),
    $id: 'https://github.com/gatehouse/gatehouse/gateway.schema.json',
    title: 'gatehouse configuration (gateway.json5)',
  };
}

function acceptReferences(node: unknown, key?: string): unknown {
  if (Array.isArray(node)) return node.map((item) => acceptReferences(item));
  if (node === null || typeof node !== 'object') return node;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(node)) {
    if (k === 'properties' && v !== null && typeof v === 'object') {
      out[k] = Object.fromEntries(Object.entries(v).map(([name, child]) => [name, acceptReferences(child, name)]));
    } else if (k === 'required' && Array.isArray(v) && isImpliedSqliteBranch(node as Record<string, unknown>)) {
      // `storage: { path }` without a driver means sqlite (the schema's preprocess adds it).
      out[k] = v.filter((name) => name !== 'driver');
    } else {
      out[k] = acceptReferences(v);
    }
  }
  const type = out.type;
  const isLeaf = (type === 'integer' || type === 'number' || type === 'boolean' || type === 'string') && out.const === undefined && out.enum === undefined;
  const constrainedString = type === 'string' && Object.keys(out).some((k) => ['pattern', 'minLength', 'maxLength', 'format'].includes(k));
  const alternatives: Record<string, unknown>[] = [];
  if (isLeaf && (type !== 'string' || constrainedString)) alternatives.push({ type: 'string', pattern: ENV_REFERENCE_PATTERN });
  if (key !== undefined && FILE_REFERENCE_KEYS.has(key) && type === 'string') {
    alternatives.push({ type: 'object', properties: { file: { type: 'string' } }, required: ['file'], additionalProperties: false });
  }
  if (alternatives.length === 0) return out;
  const { default: fallback, description, ...rest } = out;
  return { ...(fallback !== undefined ? { default: fallback } : {}), ...(description !== undefined ? { description } : {}), anyOf: [rest, ...alternatives] };
}

function isImpliedSqliteBranch(node: Record<string, unknown>): boolean {
  const driver = (node.properties as Record<string, { const?: unknown }> | undefined)?.driver;
  return driver?.const === 'sqlite';
}
