import { z } from 'zod';
import { FILE_REFERENCE_KEYS } from './load.js';
import { configSchema } from './schema.js';
import { writtenAs } from './sections/common.js';

/** A whole-string environment reference, as load.ts expands it (`${VAR}`, `${VAR:-default}`, …). */
const ENV_REFERENCE_PATTERN = '^\\$\\{[A-Za-z_][A-Za-z0-9_]*([:]?[-?][^}]*)?\\}$';
/** Metadata only docs/configuration.md reads (see sections/common.ts); kept out of gateway.schema.json. */
const DOCS_ONLY_KEYS = new Set(['docsType', 'docsDefault']);

const TO_JSON_SCHEMA: Parameters<typeof z.toJSONSchema>[1] = {
  io: 'input',
  target: 'draft-2020-12',
  // Refinements (CIDRs, templates, cross-field rules) have no JSON Schema form: `config check` has them.
  unrepresentable: 'any',
  override: ({ zodSchema, jsonSchema }) => {
    const shape = writtenAs.get(zodSchema);
    if (shape === undefined) return;
    const { $schema: _, ...written } = z.toJSONSchema(shape, TO_JSON_SCHEMA) as Record<string, unknown>;
    Object.assign(jsonSchema, written);
  },
};

/**
 * The config file's JSON Schema exactly as the zod schema states it: every key with its
 * description and default, plus the docs-only hints (`docsType`, `docsDefault`), and no `${VAR}`
 * or `{ file }` alternatives. What scripts/docs.ts turns into docs/configuration.md.
 */
export function describedConfigJsonSchema(): Record<string, unknown> {
  return impliedSqliteDriver(z.toJSONSchema(configSchema, TO_JSON_SCHEMA)) as Record<string, unknown>;
}

/**
 * The JSON Schema (draft 2020-12) of a config file as written, generated from the zod schema
 * (so every section, present and future, is in it): descriptions, defaults and constraints as zod
 * states them; wherever a value is a number, boolean or constrained string, a `${VAR}` reference is
 * also accepted, and secret keys also take `{ file }`, since load.ts expands those first.
 * `gatehouse config schema` prints it; gateway.schema.json is the committed copy (`npm run docs`).
 */
export function configJsonSchema(): Record<string, unknown> {
  return {
    ...(acceptReferences(describedConfigJsonSchema()) as Record<string, unknown>),
    $id: 'https://github.com/gatehouse/gatehouse/gateway.schema.json',
    title: 'gatehouse configuration (gateway.json5)',
  };
}

/** `storage: { path }` without a driver means sqlite (the schema's preprocess adds it): `driver` is not required there. */
function impliedSqliteDriver(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(impliedSqliteDriver);
  if (node === null || typeof node !== 'object') return node;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(node)) {
    out[k] =
      k === 'required' && Array.isArray(v) && isImpliedSqliteBranch(node as Record<string, unknown>)
        ? v.filter((name) => name !== 'driver')
        : impliedSqliteDriver(v);
  }
  return out;
}

function acceptReferences(node: unknown, key?: string): unknown {
  if (Array.isArray(node)) return node.map((item) => acceptReferences(item));
  if (node === null || typeof node !== 'object') return node;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(node)) {
    if (DOCS_ONLY_KEYS.has(k)) continue;
    if (k === 'properties' && v !== null && typeof v === 'object') {
      out[k] = Object.fromEntries(Object.entries(v).map(([name, child]) => [name, acceptReferences(child, name)]));
    } else {
      out[k] = acceptReferences(v);
    }
  }
  const type = out.type;
  const isLeaf =
    (type === 'integer' || type === 'number' || type === 'boolean' || type === 'string') &&
    out.const === undefined &&
    out.enum === undefined;
  const constrainedString =
    type === 'string' && Object.keys(out).some((k) => ['pattern', 'minLength', 'maxLength', 'format'].includes(k));
  const alternatives: Record<string, unknown>[] = [];
  if (isLeaf && (type !== 'string' || constrainedString))
    alternatives.push({ type: 'string', pattern: ENV_REFERENCE_PATTERN });
  if (key !== undefined && FILE_REFERENCE_KEYS.has(key) && type === 'string') {
    alternatives.push({
      type: 'object',
      properties: {
        file: {
          type: 'string',
          description:
            "A file holding the value (its content without the trailing newline), relative to the config file's folder.",
        },
      },
      required: ['file'],
      additionalProperties: false,
    });
  }
  if (alternatives.length === 0) return out;
  // What an editor shows on hover stays on the property, beside the alternatives.
  const { default: fallback, description, ...rest } = out;
  return {
    ...(fallback !== undefined ? { default: fallback } : {}),
    ...(description !== undefined ? { description } : {}),
    anyOf: [rest, ...alternatives],
  };
}

function isImpliedSqliteBranch(node: Record<string, unknown>): boolean {
  const driver = (node.properties as Record<string, { const?: unknown }> | undefined)?.driver;
  return driver?.const === 'sqlite';
}
