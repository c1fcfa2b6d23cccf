import { createHash, randomBytes } from 'node:crypto';
import { crc32 } from 'node:zlib';
import type { AuthConfig } from '../../config/schema.js';

/**
 * API key format, after GitHub's tokens: `gth_` + 32 base62 characters of randomness
 * (~190 bits from crypto.randomBytes) + 6 base62 characters of CRC32 over the rest.
 * The fixed prefix lets secret scanners spot leaked keys; the checksum lets gatehouse
 * reject a mistyped or made-up key before any lookup.
 */
export const API_KEY_PREFIX = 'gth_';
const RANDOM_LENGTH = 32;
const CHECKSUM_LENGTH = 6;
const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
const KEY_PATTERN = new RegExp(`^${API_KEY_PREFIX}[0-9A-Za-z]{${RANDOM_LENGTH + CHECKSUM_LENGTH}}$`);
/** Longer keys are rejected unread: no need to hash megabytes a client sends. */
const MAX_KEY_LENGTH = 512;

function base62Checksum(text: string): string {
  let n = crc32(text);
  let out = '';
  for (let i = 0; i < CHECKSUM_LENGTH; i++) {
    out = BASE62[n % 62] + out;
    n = Math.floor(n / 62);
  }
  return out;
}

function randomBase62(length: number): string {
  let out = '';
  while (out.length < length) {
    for (const byte of randomBytes(length)) {
      // 248 = 4 * 62: rejecting the top bytes keeps every character equally likely.
      if (byte < 248 && out.length < length) out += BASE62[byte % 62];
    }
  }
  return out;
}

/** A new key in gatehouse's format. */
export function generateApiKey(): string {
  const body = API_KEY_PREFIX + randomBase62(RANDOM_LENGTH);
  return body + base62Checksum(body);
}

/** True for a well-formed gatehouse key whose checksum matches. */
export function hasValidKeyChecksum(key: string): boolean {
  if (!KEY_PATTERN.test(key)) return false;
  const body = key.slice(0, -CHECKSUM_LENGTH);
  return base62Checksum(body) === key.slice(-CHECKSUM_LENGTH);
}

/** The config form of a key's hash: `sha256:<hex>`. */
export function hashApiKey(key: string): string {
  return 'sha256:' + createHash('sha256').update(key, 'utf8').digest('hex');
}

/** What a configured key grants: its scopes and its own rate limit, if any. */
export interface ApiKeyGrant {
  id: string;
  scopes: readonly string[];
  rateLimit: { requests: number; per: number } | undefined;
}

export type ApiKeyCheck =
  { ok: true; id: string; grant: ApiKeyGrant } | { ok: false; reason: 'malformed' | 'unknown' | 'expired' };

/** The id under which the single plain `gateway.auth.apiKey` is reported upstream and in logs. */
export const PLAIN_API_KEY_ID = 'default';

/**
 * Checks presented keys against the configured ones by SHA-256 lookup: the plain key is
 * hashed once at build time, so no request compares secrets byte by byte.
 */
export class ApiKeyVerifier {
  private readonly byHash = new Map<string, { grant: ApiKeyGrant; expiresAt: number }>();

  constructor(auth: Pick<AuthConfig, 'apiKey' | 'apiKeys'>) {
    if (auth.apiKey !== undefined)
      this.byHash.set(hashApiKey(auth.apiKey), {
        grant: { id: PLAIN_API_KEY_ID, scopes: [], rateLimit: undefined },
        expiresAt: Infinity,
      });
    for (const entry of auth.apiKeys) {
      const grant = { id: entry.id, scopes: entry.scopes ?? [], rateLimit: entry.rateLimit };
      this.byHash.set(entry.hash, { grant, expiresAt: entry.expiresAt ? Date.parse(entry.expiresAt) : Infinity });
    }
  }

  get size(): number {
    return this.byHash.size;
  }

  verify(key: string, now: number = Date.now()): ApiKeyCheck {
    if (key.length > MAX_KEY_LENGTH || (key.startsWith(API_KEY_PREFIX) && !hasValidKeyChecksum(key))) {
      return { ok: false, reason: 'malformed' };
    }
    const entry = this.byHash.get(hashApiKey(key));
    if (!entry) return { ok: false, reason: 'unknown' };
    if (entry.expiresAt <= now) return { ok: false, reason: 'expired' };
    return { ok: true, id: entry.grant.id, grant: entry.grant };
  }
}
