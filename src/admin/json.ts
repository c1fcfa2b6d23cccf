import type { IncomingMessage, ServerResponse } from 'node:http';
import { HttpError } from '../errors.js';

/**
 * JSON as the admin API answers it, and as the CLI's `--json` prints its records: one rule for
 * times in both (ISO 8601 strings), and the API's method and parameter checks.
 */

/** Time fields of gatehouse's own records: `at`, `…At`, `…Expiration` (epoch milliseconds inside gatehouse). */
const TIME_FIELD = /^(at|.+At|.*[eE]xpiration)$/;

/** JSON with every time field as an ISO 8601 string (null stays null), one rule for every command and route. */
export function toJsonWithIsoDates(value: unknown): string {
  return JSON.stringify(value, (key, field: unknown) =>
    typeof field === 'number' && TIME_FIELD.test(key) ? new Date(field).toISOString() : field,
  );
}

/** Answers `value` as JSON, never cached. */
export function sendJson(
  res: ServerResponse,
  status: number,
  value: unknown,
  headers: Record<string, string> = {},
): void {
  sendJsonText(res, status, JSON.stringify(value), headers);
}

/** Answers JSON already written (e.g. by toJsonWithIsoDates), never cached. */
export function sendJsonText(
  res: ServerResponse,
  status: number,
  body: string,
  headers: Record<string, string> = {},
): void {
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    'cache-control': 'no-store',
    // JSON that carries senders' text (envelopes): never sniffed as anything else.
    'x-content-type-options': 'nosniff',
    ...headers,
  });
  res.end(body);
}

/** 405 with `Allow` unless the request's method is `allowed`. */
export function requireMethod(req: IncomingMessage, url: URL, allowed: 'GET' | 'POST' | 'DELETE'): void {
  if (req.method !== allowed)
    throw new HttpError('method_not_allowed', `${req.method} ${url.pathname}`, { allow: allowed });
}

/**
 * The query's parameters, each given at most once and among `known`: 400 `invalid_parameter`
 * naming the first that is not (a route that takes none passes `[]`).
 */
export function queryParameters(url: URL, known: readonly string[]): Map<string, string> {
  const parameters = new Map<string, string>();
  for (const name of new Set(url.searchParams.keys())) {
    const values = url.searchParams.getAll(name);
    if (!known.includes(name)) throw new HttpError('invalid_parameter', `${name.slice(0, 100)}: unknown parameter`);
    if (values.length > 1) throw new HttpError('invalid_parameter', `${name}: given more than once`);
    parameters.set(name, values[0]!);
  }
  return parameters;
}

/** A `limit` parameter: an integer from 1 to `max`, `fallback` when not given. */
export function limitParameter(value: string | undefined, fallback: number, max: number): number {
  if (value === undefined) return fallback;
  const limit = /^\d{1,7}$/.test(value) ? Number(value) : NaN;
  if (!(limit >= 1 && limit <= max)) throw new HttpError('invalid_parameter', `limit: an integer from 1 to ${max}`);
  return limit;
}
