import type { RateLimitConfig } from '../config/schema.js';
import { HttpError } from '../errors.js';
import type { Identity } from './credentials/authenticate.js';
import { clientGroup } from '../http/lockout.js';
import { compileMethodSet, compilePathPatterns, type PathMatcher } from './path-pattern.js';

/** A bucket's shape: it holds up to `capacity` tokens and gains `refillPerMs` each millisecond. */
export interface BucketShape {
  capacity: number;
  refillPerMs: number;
}

interface Bucket {
  tokens: number;
  /** When `tokens` was last brought up to date (ms, the limiter's clock). */
  at: number;
  /** Tokens taken since the last `collectSpent` (what a shared store has not been told yet). */
  spent: number;
}

const DEFAULT_MAX_BUCKETS = 100_000;

/**
 * The token buckets of one limit, one per client key, O(1) per request. At most `maxBuckets`
 * keys are kept: past that the longest-held bucket is dropped (a client can then start full
 * again sooner; memory stays bounded against key or address spraying).
 */
export class TokenBuckets {
  private readonly buckets = new Map<string, Bucket>();

  constructor(
    readonly shape: BucketShape,
    private readonly maxBuckets = DEFAULT_MAX_BUCKETS,
  ) {}

  get size(): number {
    return this.buckets.size;
  }

  /** Tokens `key` holds at `now` (a new key holds a full bucket); updates nothing. */
  available(key: string, now: number): number {
    const bucket = this.buckets.get(key);
    if (bucket === undefined) return this.shape.capacity;
    return Math.min(this.shape.capacity, bucket.tokens + (now - bucket.at) * this.shape.refillPerMs);
  }

  /** Takes one token from `key` (the caller checked `available` ≥ 1); returns what is left. */
  take(key: string, now: number, available: number): number {
    const left = available - 1;
    const bucket = this.buckets.get(key);
    if (bucket !== undefined) {
      bucket.tokens = left;
      bucket.at = now;
      bucket.spent++;
    } else {
      if (this.buckets.size >= this.maxBuckets) this.buckets.delete(this.buckets.keys().next().value!);
      this.buckets.set(key, { tokens: left, at: now, spent: 1 });
    }
    return left;
  }

  /** Hands `visit` every key with tokens taken since the last call, and how many; starts counting again. */
  collectSpent(visit: (key: string, spent: number) => void): void {
    for (const [key, bucket] of this.buckets) {
      if (bucket.spent === 0) continue;
      visit(key, bucket.spent);
      bucket.spent = 0;
    }
  }

  /**
   * Puts in `key`'s bucket the shared `level` it had at `at` (when its spend was collected), less
   * what was taken here since (not yet sent: it goes with the next collection). A key dropped
   * meanwhile stays dropped.
   */
  settle(key: string, level: number, at: number): void {
    const bucket = this.buckets.get(key);
    if (bucket === undefined) return;
    bucket.tokens = Math.min(this.shape.capacity, level) - bucket.spent;
    bucket.at = at;
  }
}

/**
 * The buckets that outlive one config: reload builds a new limiter and asks here for the
 * buckets of each limit by its signature (what it counts and how), so an unchanged limit keeps
 * its buckets and a changed one starts afresh. `retain` drops the limits no config uses any more.
 */
export class RateLimitState {
  private readonly limits = new Map<string, TokenBuckets>();

  /** `share` (1/N under gateway.workers: N) scales every bucket of this process. */
  constructor(private readonly share = 1) {}

  bucketsFor(signature: string, shape: BucketShape): TokenBuckets {
    let buckets = this.limits.get(signature);
    if (buckets === undefined) {
      // At least one token per worker: a bucket smaller than one would refuse every request.
      buckets = new TokenBuckets({
        capacity: Math.max(1, shape.capacity * this.share),
        refillPerMs: shape.refillPerMs * this.share,
      });
      this.limits.set(signature, buckets);
    }
    return buckets;
  }

  /** Every limit's buckets, by signature (what a shared store syncs). */
  entries(): IterableIterator<[string, TokenBuckets]> {
    return this.limits.entries();
  }

  /** Keeps only the limits named in `signatures` (those of the config now in force). */
  retain(signatures: ReadonlySet<string>): void {
    for (const signature of this.limits.keys()) if (!signatures.has(signature)) this.limits.delete(signature);
  }
}

type By = RateLimitConfig['by'];

interface CompiledLimit {
  by: By;
  paths: PathMatcher | undefined;
  methods: ReadonlySet<string> | undefined;
  buckets: TokenBuckets;
  /** This limit's RateLimit-Policy item and the start of its RateLimit item, built once. */
  policy: string;
  name: string;
}

/** A request's answer from the limits: go on (with headers for the answer), or the 429. */
export type RateLimitOutcome = { headers: Record<string, string> | undefined; refused: HttpError | undefined };

export interface RateLimiter {
  /** Counts the request against every limit that applies; refuses it if any bucket is empty (then none is charged). */
  check(method: string, path: string, identity: Identity, clientIp: string): RateLimitOutcome;
  /** The signatures of this config's limits (RateLimitState.retain after the swap). */
  signatures: ReadonlySet<string>;
}

/** Tokens are fractions: what is within this of a whole number counts as that number (no 5.000000001 s → 6). */
const EPSILON = 1e-6;
const ceilSeconds = (ms: number) => Math.max(0, Math.ceil(ms / 1000 - EPSILON));

const NOT_LIMITED: RateLimitOutcome = { headers: undefined, refused: undefined };

/**
 * Compiles `gateway.rateLimits` (and the keys' own `rateLimit`) once per config. Per request:
 * O(limits). A limit applies when its paths and methods match and the request has what it
 * counts by: `key` needs an API key, `subject` a subject (JWT `sub` or key id), `ip` always
 * (IPv6 per /64). A key with its own `rateLimit` is counted by that instead of the `by: "key"`
 * limits. Headers follow draft-ietf-httpapi-ratelimit-headers: `RateLimit-Policy` (`q` the
 * configured requests, `w` the period in seconds) and `RateLimit` (`r` requests left, `t`
 * seconds until the bucket is full again), one item per limit that applies.
 */
export function compileRateLimiter(
  limits: readonly RateLimitConfig[],
  keyQuotas: readonly ({ requests: number; per: number } | undefined)[],
  state: RateLimitState,
  now: () => number = Date.now,
): RateLimiter {
  const signatures = new Set<string>();
  const counts = new Map<By, number>();
  for (const limit of limits) counts.set(limit.by, (counts.get(limit.by) ?? 0) + 1);
  const compiled = limits.map((limit, index): CompiledLimit => {
    const capacity = limit.burst ?? limit.requests;
    const signature = JSON.stringify([
      'limit',
      limit.by,
      limit.requests,
      limit.per,
      capacity,
      limit.paths ?? null,
      limit.methods ?? null,
    ]);
    signatures.add(signature);
    // Policy names: the `by`, with its place in rateLimits when several count by the same thing.
    const name = counts.get(limit.by)! > 1 ? `${limit.by}-${index}` : limit.by;
    return {
      by: limit.by,
      paths: limit.paths ? compilePathPatterns(limit.paths) : undefined,
      methods: compileMethodSet(limit.methods),
      buckets: state.bucketsFor(signature, { capacity, refillPerMs: limit.requests / (limit.per * 1000) }),
      policy: `"${name}";q=${limit.requests};w=${limit.per}`,
      name,
    };
  });
  const ownKeyLimits = new Map<string, CompiledLimit>();
  /** A key's own limit: one set of buckets per distinct quota, keyed by key id. */
  function ownKeyLimit(quota: { requests: number; per: number }): CompiledLimit {
    const signature = JSON.stringify(['key', quota.requests, quota.per]);
    let limit = ownKeyLimits.get(signature);
    if (limit === undefined) {
      signatures.add(signature);
      limit = {
        by: 'key',
        paths: undefined,
        methods: undefined,
        buckets: state.bucketsFor(signature, {
          capacity: quota.requests,
          refillPerMs: quota.requests / (quota.per * 1000),
        }),
        policy: `"key";q=${quota.requests};w=${quota.per}`,
        name: 'key',
      };
      ownKeyLimits.set(signature, limit);
    }
    return limit;
  }
  // Built now, not at a key's first request: `signatures` must be complete before the swap.
  // By the config's own quota object (the one the key's grant carries): no signature per request.
  const byQuota = new Map<object, CompiledLimit>();
  for (const quota of keyQuotas) if (quota !== undefined) byQuota.set(quota, ownKeyLimit(quota));
  const applying: CompiledLimit[] = [];
  const keys: string[] = [];
  const availables: number[] = [];

  function check(method: string, path: string, identity: Identity, clientIp: string): RateLimitOutcome {
    applying.length = 0;
    keys.length = 0;
    availables.length = 0;
    for (const limit of compiled) {
      let key: string | undefined;
      if (limit.by === 'key') key = identity.keyRateLimit === undefined ? identity.keyId : undefined;
      else if (limit.by === 'subject') key = identity.subject;
      else key = clientGroup(clientIp);
      if (key === undefined) continue;
      if (limit.methods !== undefined && !limit.methods.has(method)) continue;
      if (limit.paths !== undefined && !limit.paths(path)) continue;
      applying.push(limit);
      keys.push(key);
    }
    if (identity.keyRateLimit !== undefined && identity.keyId !== undefined) {
      applying.push(byQuota.get(identity.keyRateLimit) ?? ownKeyLimit(identity.keyRateLimit));
      keys.push(identity.keyId);
    }
    if (applying.length === 0) return NOT_LIMITED;

    const at = now();
    let refusedBy = -1;
    let waitMs = 0;
    for (let i = 0; i < applying.length; i++) {
      const available = applying[i]!.buckets.available(keys[i]!, at);
      availables.push(available);
      if (available < 1 - EPSILON) {
        const wait = (1 - available) / applying[i]!.buckets.shape.refillPerMs;
        if (wait > waitMs) {
          waitMs = wait;
          refusedBy = i;
        }
      }
    }
    const policies: string[] = [];
    const states: string[] = [];
    for (let i = 0; i < applying.length; i++) {
      const limit = applying[i]!;
      const left = refusedBy === -1 ? limit.buckets.take(keys[i]!, at, availables[i]!) : availables[i]!;
      const { capacity, refillPerMs } = limit.buckets.shape;
      policies.push(limit.policy);
      states.push(
        `"${limit.name}";r=${Math.max(0, Math.floor(left + EPSILON))};t=${ceilSeconds((capacity - left) / refillPerMs)}`,
      );
    }
    const headers = { 'ratelimit-policy': policies.join(', '), ratelimit: states.join(', ') };
    if (refusedBy === -1) return { headers, refused: undefined };
    const limit = applying[refusedBy]!;
    const retryAfter = String(Math.max(1, ceilSeconds(waitMs)));
    return {
      headers: undefined,
      refused: new HttpError('rate_limited', `rate limit "${limit.name}" (${keys[refusedBy]}) exhausted`, {
        ...headers,
        'retry-after': retryAfter,
      }),
    };
  }

  return { check, signatures };
}
