import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AuthConfig, Config } from '../config/schema.js';
import { HttpError } from '../errors.js';
import { PLAIN_API_KEY_ID } from '../gateway/credentials/api-key.js';
import { limitParameter, queryParameters, requireMethod, sendJson } from './json.js';

const DEFAULT_LIMIT = 200;
const MAX_LIMIT = 1_000;
const KEY_ID = /^[A-Za-z0-9._:-]{1,64}$/;

/**
 * One API key as the admin API shows it: what it is called and what it grants. Built field by
 * field from the config's entry, so a secret (the hash, the plain key) cannot slip in.
 */
export interface KeyView {
  id: string;
  /** What the upstream gets in X-Gatehouse-Subject when this key alone authenticates: its id. */
  subject: string;
  scopes: readonly string[];
  expiresAt: string | null;
  expired: boolean;
  rateLimit: { requests: number; perSeconds: number } | null;
  /** `apiKeys` (hashed, one entry each) or `apiKey` (the single plain key, id `default`). */
  source: 'apiKeys' | 'apiKey';
}

/** A configured key, without its secret. */
type Entry = Omit<KeyView, 'expiresAt' | 'expired'> & { expiresAt: number | null };

/** The keys of one config, sorted by id; cached per config (100,000 keys sort in tens of ms). */
const sortedKeys = new WeakMap<AuthConfig, Entry[]>();

function entriesOf(auth: AuthConfig): Entry[] {
  let entries = sortedKeys.get(auth);
  if (entries) return entries;
  entries = auth.apiKeys.map((key) => ({
    id: key.id,
    subject: key.id,
    scopes: key.scopes ?? [],
    expiresAt: key.expiresAt === undefined ? null : Date.parse(key.expiresAt),
    rateLimit: key.rateLimit ? { requests: key.rateLimit.requests, perSeconds: key.rateLimit.per } : null,
    source: 'apiKeys' as const,
  }));
  if (auth.apiKey !== undefined)
    entries.push({
      id: PLAIN_API_KEY_ID,
      subject: PLAIN_API_KEY_ID,
      scopes: [],
      expiresAt: null,
      rateLimit: null,
      source: 'apiKey',
    });
  entries.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  sortedKeys.set(auth, entries);
  return entries;
}

/** The index of the first entry whose id comes after `id` (binary search: the entries are sorted). */
function indexAfter(entries: Entry[], id: string): number {
  let low = 0;
  let high = entries.length;
  while (low < high) {
    const middle = (low + high) >>> 1;
    if (entries[middle]!.id <= id) low = middle + 1;
    else high = middle;
  }
  return low;
}

/**
 * `GET /admin/api/keys`: the configured API keys (gateway.auth.apiKeys, and the plain apiKey as
 * id `default`) in force now, by id, `limit` at a time (`cursor`: the last id of the page before,
 * as `nextCursor` gives it). Never a hash, never a key.
 */
export function keysApi(options: { config: () => Config; now?: () => number }) {
  const now = options.now ?? Date.now;
  return async function handleKeysApi(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    if (url.pathname !== '/admin/api/keys') throw new HttpError('not_found', `no admin route ${url.pathname}`);
    requireMethod(req, url, 'GET');
    const query = queryParameters(url, ['limit', 'cursor']);
    const limit = limitParameter(query.get('limit'), DEFAULT_LIMIT, MAX_LIMIT);
    const cursor = query.get('cursor');
    if (cursor !== undefined && !KEY_ID.test(cursor)) throw new HttpError('invalid_cursor', 'not a key id');
    const entries = entriesOf(options.config().gateway.auth);
    // Keyset paging by id: a reload that adds or removes keys shifts no later page.
    const from = cursor === undefined ? 0 : indexAfter(entries, cursor);
    const at = now();
    const keys = entries
      .slice(from, from + limit)
      .map(({ id, subject, scopes, expiresAt, rateLimit, source }): KeyView => ({
        id,
        subject,
        scopes,
        expiresAt: expiresAt === null ? null : new Date(expiresAt).toISOString(),
        expired: expiresAt !== null && expiresAt <= at,
        rateLimit,
        source,
      }));
    const more = from + limit < entries.length;
    sendJson(res, 200, { keys, nextCursor: more ? keys[keys.length - 1]!.id : null, total: entries.length });
  };
}
