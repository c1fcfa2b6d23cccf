import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import type { Logger } from 'pino';
import { parseConfig } from '../../src/config/load.js';
import type { Identity } from '../../src/gateway/credentials/authenticate.js';
import { compileRateLimiter, RateLimitState, TokenBuckets } from '../../src/gateway/rate-limit.js';
import { startRateLimitSync } from '../../src/gateway/rate-limit-sync.js';
import type { BucketSpend, RateLimitStore } from '../../src/storage/contracts/rate-limits.js';

// The local side of rate limits shared across instances (issue 16): what a process sends and how
// it takes the shared level back, with a clock moved by hand. The SQL arithmetic itself runs
// against real PostgreSQL in test/storage/postgres-rate-limits.test.ts.

function manualClock(start = 1_000_000) {
  let now = start;
  return { now: () => now, advance: (ms: number) => (now += ms) };
}

const key = (keyId: string): Identity => ({
  methods: ['api-key'],
  subject: keyId,
  keyId,
  scopes: [],
  claims: undefined,
  keyRateLimit: undefined,
});

/**
 * A store whose answers the test scripts: `levels` is what "the other instances" left in each
 * row; `down` makes it reject like an unreachable PostgreSQL. Records what it was sent.
 */
function scriptedStore() {
  const sent: { spends: BucketSpend[]; now: number }[] = [];
  const store = {
    down: false,
    shared: new Map<string, number>(),
    sent,
    async sync(spends: readonly BucketSpend[], now: number) {
      if (store.down) throw new Error('connect ECONNREFUSED 127.0.0.1:5432');
      sent.push({ spends: [...spends], now });
      const levels = new Map<string, number>();
      for (const s of spends) {
        const level = (store.shared.get(s.bucket) ?? s.capacity) - s.spent;
        store.shared.set(s.bucket, level);
        levels.set(s.bucket, level);
      }
      return levels;
    },
    async deleteFull() {
      return 0;
    },
    async close() {},
  } satisfies RateLimitStore & Record<string, unknown>;
  return store;
}

function logs() {
  const lines: [string, string][] = [];
  const logger = {
    warn: (_: unknown, msg: string) => void lines.push(['warn', msg]),
    info: (msg: string) => void lines.push(['info', msg]),
  } as unknown as Pick<Logger, 'warn' | 'info'>; // the two calls the sync makes
  return { lines, logger };
}

describe('token buckets: spend collected, shared level settled', () => {
  it('collects only what was taken since the last collection, and settles to the level less what was taken since', () => {
    const buckets = new TokenBuckets({ capacity: 10, refillPerMs: 1 / 1000 });
    for (let i = 0; i < 3; i++) buckets.take('a', 0, buckets.available('a', 0));
    buckets.take('b', 0, buckets.available('b', 0));
    const first: [string, number][] = [];
    buckets.collectSpent((k, n) => first.push([k, n]));
    assert.deepEqual(first, [
      ['a', 3],
      ['b', 1],
    ]);
    buckets.take('a', 100, buckets.available('a', 100)); // while the sync travels
    buckets.settle('a', 2, 0); // the shared level at collection time: others spent 5
    assert.equal(buckets.available('a', 0), 1, 'level 2 less the one taken in flight');
    assert.equal(buckets.available('a', 4_000), 5, 'refilled from the collection time');
    const second: [string, number][] = [];
    buckets.collectSpent((k, n) => second.push([k, n]));
    assert.deepEqual(second, [['a', 1]], 'the in-flight token goes with the next sync; b untouched is not sent');
    buckets.settle('gone', 0, 0);
    assert.equal(buckets.size, 2, 'settling a dropped key creates nothing');
  });
});

describe('rate limits synced through a store', () => {
  const limits = parseConfig({
    gateway: { upstream: { target: 'http://127.0.0.1:1' }, rateLimits: [{ by: 'key', requests: 10, per: '10s' }] },
  }).gateway.rateLimits;

  it('a debt left by other instances refuses here, with Retry-After from the shared level', async () => {
    const clock = manualClock();
    const state = new RateLimitState();
    const limiter = compileRateLimiter(limits, [], state, clock.now);
    const store = scriptedStore();
    const sync = startRateLimitSync(state, store, { now: clock.now, timer: false });
    assert.equal(limiter.check('GET', '/api/x', key('ci'), '1.1.1.1').refused, undefined);
    await sync.syncNow();
    const [bucket] = [...store.shared.keys()];
    assert.equal(store.sent.length, 1);
    assert.equal(store.sent[0]!.spends.length, 1);
    assert.equal(store.sent[0]!.spends[0]!.spent, 1);
    assert.equal(store.sent[0]!.spends[0]!.capacity, 10);
    assert.notEqual(bucket, 'ci', 'the row is a digest, not the key id');
    // Other instances spent 12 meanwhile: the row says −3 after this instance's next spend is merged.
    store.shared.set(bucket!, -2);
    assert.equal(
      limiter.check('GET', '/api/x', key('ci'), '1.1.1.1').refused,
      undefined,
      'decided locally (8 left here)',
    );
    await sync.syncNow();
    const refused = limiter.check('GET', '/api/x', key('ci'), '1.1.1.1').refused!;
    assert.equal(refused.code, 'rate_limited');
    assert.equal(refused.headers!['retry-after'], '4', 'from −3 to 1 token at 1 per second');
    assert.equal(refused.headers!.ratelimit, '"key";r=0;t=13');
    clock.advance(4_000);
    assert.equal(
      limiter.check('GET', '/api/x', key('ci'), '1.1.1.1').refused,
      undefined,
      'the refill pays the debt back',
    );
    await sync.close();
  });

  it('nothing is sent when nothing was taken', async () => {
    const state = new RateLimitState();
    compileRateLimiter(limits, [], state);
    const store = scriptedStore();
    const sync = startRateLimitSync(state, store, { timer: false });
    await sync.syncNow();
    assert.equal(store.sent.length, 0);
    await sync.close();
  });

  it('store unreachable: decisions stay local and exact for this process, logged once; sharing resumes when it is back', async () => {
    const clock = manualClock();
    const state = new RateLimitState();
    const limiter = compileRateLimiter(limits, [], state, clock.now);
    const store = scriptedStore();
    const { lines, logger } = logs();
    const sync = startRateLimitSync(state, store, { now: clock.now, timer: false, logger });
    store.down = true;
    const statuses: (string | undefined)[] = [];
    for (let i = 0; i < 12; i++) {
      statuses.push(limiter.check('GET', '/api/x', key('ci'), '1.1.1.1').refused?.code);
      await sync.syncNow(); // every round fails
    }
    assert.deepEqual(
      statuses,
      [...Array(10).fill(undefined), 'rate_limited', 'rate_limited'],
      'this process alone still allows exactly its bucket',
    );
    assert.equal(sync.shared, false);
    assert.deepEqual(lines, [
      ['warn', 'postgres unreachable: rate limits are counted by this process alone until it is back'],
    ]);

    store.down = false;
    clock.advance(1_000);
    assert.equal(limiter.check('GET', '/api/x', key('ci'), '1.1.1.1').refused, undefined);
    await sync.syncNow();
    assert.equal(sync.shared, true);
    assert.deepEqual(lines[1], ['info', 'postgres reachable again: rate limits are shared again']);
    assert.equal(store.sent.length, 1);
    assert.equal(store.sent[0]!.spends[0]!.spent, 1, 'spends of the outage are not replayed');
    await sync.close();
  });
});
