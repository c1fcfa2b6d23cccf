import { createHash } from 'node:crypto';
import type { Logger } from 'pino';
import type { BucketSpend, RateLimitStore } from '../storage/contracts/rate-limits.js';
import type { RateLimitState, TokenBuckets } from './rate-limit.js';

/**
 * How often a gateway process sends what it spent and takes the shared levels back. What
 * another process spent reaches this one within two intervals (it syncs, then this one does):
 * 500 ms keeps that under a second, as Kong's `sync_rate` of 1 s would not.
 */
export const SYNC_INTERVAL_MS = 500;
/** Full rows are deleted this often (every 120th sync), this many at a time. */
const CLEANUP_EVERY = 120;
const CLEANUP_BATCH = 1_000;

/** The row a (limit, client key) bucket is stored under: a digest, so no API key id or address is stored. */
export function sharedBucketId(signature: string, key: string): string {
  return createHash('sha256').update(signature).update('\0').update(key).digest('base64url');
}

export interface RateLimitSync {
  /** One round now (the timer's, or a test's): resolves when the levels are applied or the round gave up. */
  syncNow(): Promise<void>;
  /** Whether the last round reached the store (false: counting locally). */
  readonly shared: boolean;
  /** Stops the timer, waits for a round in flight, closes the store. */
  close(): Promise<void>;
}

/**
 * Shares `state`'s buckets with every gatehouse process on `store`, off the request path: each
 * request is decided from the local bucket alone; every SYNC_INTERVAL_MS the tokens taken from
 * each bucket touched since the last round are sent in one statement, and each of those local
 * buckets is set to the shared level that comes back (less what was taken while it travelled).
 * Untouched buckets cost nothing. One round at a time: a slow store skips ticks, never queues them.
 *
 * The store unreachable: logged once; the spend of that round is dropped, and every bucket keeps
 * counting locally (this process alone, as without sharing); nothing reaches the request path.
 * The next round that succeeds logs it, and sharing resumes (spends meanwhile are not replayed).
 */
export function startRateLimitSync(
  state: RateLimitState,
  store: RateLimitStore,
  options: { logger?: Pick<Logger, 'warn' | 'info'>; now?: () => number; intervalMs?: number; timer?: boolean } = {},
): RateLimitSync {
  const now = options.now ?? Date.now;
  const { logger } = options;
  let reachable = true;
  let closed = false;
  let rounds = 0;
  let spentSinceCleanup = false;
  let running: Promise<void> | undefined;

  async function round(): Promise<void> {
    const at = now();
    const spends: BucketSpend[] = [];
    const targets: { buckets: TokenBuckets; key: string }[] = [];
    for (const [signature, buckets] of state.entries()) {
      const { capacity, refillPerMs } = buckets.shape;
      buckets.collectSpent((key, spent) => {
        spends.push({ bucket: sharedBucketId(signature, key), spent, capacity, refillPerMs });
        targets.push({ buckets, key });
      });
    }
    try {
      if (spends.length > 0) {
        const levels = await store.sync(spends, at);
        for (let i = 0; i < spends.length; i++) {
          const level = levels.get(spends[i]!.bucket);
          if (level !== undefined) targets[i]!.buckets.settle(targets[i]!.key, level, at);
        }
        spentSinceCleanup = true;
      }
      // Only after spends: an instance without rate limits never queries (nor logs an outage).
      if (++rounds % CLEANUP_EVERY === 0 && spentSinceCleanup) {
        spentSinceCleanup = false;
        await store.deleteFull(at, CLEANUP_BATCH);
      }
      if (!reachable && spends.length > 0) {
        reachable = true;
        logger?.info('postgres reachable again: rate limits are shared again');
      }
    } catch (err) {
      if (reachable && !closed) {
        reachable = false;
        logger?.warn(
          { err: (err as Error).message },
          'postgres unreachable: rate limits are counted by this process alone until it is back',
        );
      }
    }
  }

  function syncNow(): Promise<void> {
    running ??= round().finally(() => (running = undefined));
    return running;
  }

  const timer =
    options.timer === false ? undefined : setInterval(() => void syncNow(), options.intervalMs ?? SYNC_INTERVAL_MS);
  timer?.unref();

  return {
    syncNow,
    get shared() {
      return reachable;
    },
    async close() {
      closed = true;
      clearInterval(timer);
      await running;
      await store.close();
    },
  };
}
