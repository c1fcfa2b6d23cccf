import type { WebhookAction } from '../config/schema.js';

/**
 * Message templates: `{{sender.name}}`, `{{items[0].title}}`. Placeholders are property paths
 * looked up in the webhook body (own properties only), never code. A missing path renders
 * empty; a non-string value renders as JSON (numbers and booleans as themselves). Rendering
 * never throws: a value JSON cannot represent renders empty too.
 */
const PLACEHOLDER = /\{\{\s*([^{}]*?)\s*\}\}/g;
const PATH = /^[A-Za-z0-9_$-]+(?:\.[A-Za-z0-9_$-]+|\[\d+\])*$/;
const SEGMENT = /[A-Za-z0-9_$-]+|\[\d+\]/g;

type Part = string | (string | number)[];
export type CompiledTemplate = readonly Part[];

/** Compiles once at config load; throws with the offending placeholder when a path is invalid. */
export function compileTemplate(template: string): CompiledTemplate {
  const parts: Part[] = [];
  let last = 0;
  for (const match of template.matchAll(PLACEHOLDER)) {
    const path = match[1]!;
    if (!PATH.test(path))
      throw new Error(
        `invalid placeholder "{{${path}}}": use a property path like {{sender.name}} or {{items[0].title}}`,
      );
    parts.push(template.slice(last, match.index));
    parts.push(path.match(SEGMENT)!.map((s) => (s.startsWith('[') ? Number(s.slice(1, -1)) : s)));
    last = match.index! + match[0].length;
  }
  parts.push(template.slice(last));
  return parts.filter((p) => p !== '');
}

export function renderTemplate(template: CompiledTemplate, data: unknown): string {
  let out = '';
  for (const part of template) out += typeof part === 'string' ? part : stringify(lookup(data, part));
  return out;
}

function lookup(data: unknown, path: readonly (string | number)[]): unknown {
  let current = data;
  for (const key of path) {
    if (current === null || typeof current !== 'object') return undefined;
    if (typeof key === 'number' ? !Array.isArray(current) : Array.isArray(current)) return undefined;
    if (!Object.hasOwn(current, key)) return undefined;
    current = (current as Record<string | number, unknown>)[key];
  }
  return current;
}

function stringify(value: unknown): string {
  if (value === undefined || value === null) return '';
  if (typeof value === 'string') return value;
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  try {
    return JSON.stringify(value) ?? '';
  } catch {
    // A cycle, a BigInt, or nesting past the call stack. A webhook body has none of these (the
    // receiver bounds its depth before parsing), so this is a guard, not worth a log line: a
    // message is a convenience, and the target still gets the whole payload.
    return '';
  }
}

export interface EnvelopeInfo {
  action: WebhookAction;
  endpoint: string;
  receivedAt: number;
  template?: CompiledTemplate;
  extra?: Record<string, unknown>;
}

/**
 * Builds the envelope a target receives: `{ id, action, endpoint, receivedAt, …extra, message?, payload }`
 * (`extra`: what an integration adds, e.g. a channel's `channel`, `from`, `text`). `message`: the endpoint's template rendered against the body, else
 * the body's own string `message` field, else absent.
 * `rawBody` is the sender's JSON text: it is embedded as is, so `payload` is byte-identical.
 */
export function buildEnvelope(id: string, info: EnvelopeInfo, body: Record<string, unknown>, rawBody: string): string {
  return prepareEnvelope(info, body, rawBody)(id);
}

/**
 * buildEnvelope in two steps: everything but the id now (the template rendered, the fields
 * serialised), then the id by string concatenation alone. The receiver does the first step
 * before handing the event to the store, so the store's callback (inside its transaction)
 * cannot fail on the body.
 */
export function prepareEnvelope(
  info: EnvelopeInfo,
  body: Record<string, unknown>,
  rawBody: string,
): (id: string) => string {
  const message = info.template
    ? renderTemplate(info.template, body)
    : typeof body.message === 'string'
      ? body.message
      : undefined;
  const fields = JSON.stringify({
    action: info.action,
    endpoint: info.endpoint,
    receivedAt: new Date(info.receivedAt).toISOString(),
    ...info.extra,
    ...(message !== undefined ? { message } : {}),
  });
  const rest = `${fields.slice(1, -1)},"payload":${rawBody.trim()}}`;
  return (id) => `{"id":${JSON.stringify(id)},${rest}`;
}
