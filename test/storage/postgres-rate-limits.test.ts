import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import type { PostgresStorageConfig } from '../../src/config/schema.js';
import { RateLimitState } from '../../src/gateway/rate-limit.js';
import { sharedBucketId, startRateLimitSync } from '../../src/gateway/rate-limit-sync.js';
import { migrate } from '../../src/storage/postgres/migrations.js';
import { createPool } from '../../src/storage/postgres/pool.js';
import { PostgresRateLimitStore } from '../../src/storage/postgres/rate-limits.js';
import { postgresDatabases, type PostgresDatabases } from '../helpers/postgres.js';

// The rate-limit buckets shared on PostgreSQL (issue 16): the merge arithmetic of one sync
// statement, at times the test chooses (no sleeps), and two gateway processes' buckets
// converging through one database.

const cluster = await postgresDatabases();
const skip = 'skip' in cluster ? cluster.skip : false;
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

const storage = (url: string): PostgresStorageConfig =>
  ({ driver: 'postgres', url, pool: { max: 2 } }) as PostgresStorageConfig;
/** 10 tokens, refilled at 1 per second. */
const SHAPE = { capacity: 10, refillPerMs: 1 / 1000 };
const T = 1_700_000_000_000;
const assertNear = (actual: number, expected: number, message?: string) =>
  assert.ok(Math.abs(actual - expected) < 1e-9, `${message ?? ''}: ${actual} ≠ ${expected}`);

describe('PostgresRateLimitStore: one sync statement', { skip }, () => {
  let url: string;
  let store: PostgresRateLimitStore;
  let db: pg.Client;
  const spend = (bucket: string, spent: number, now: number) =>
    store.sync([{ bucket, spent, ...SHAPE }], now).then((levels) => levels.get(bucket));

  before(async () => {
    url = await (cluster as PostgresDatabases).createDatabase();
    const pool = createPool(storage(url));
    await migrate(pool);
    await pool.end();
    store = new PostgresRateLimitStore(storage(url));
    db = new pg.Client({ connectionString: url });
    await db.connect();
  });
  after(async () => {
    await store?.close();
    await db?.end();
  });

  it('a new bucket starts full less the spend; refills by elapsed time × rate, capped at capacity', async () => {
    assert.equal(await spend('a', 3, T), 7);
    assert.equal(await spend('a', 2, T + 1_500), 6.5, '7 + 1.5 s × 1/s − 2');
    assert.equal(await spend('a', 0, T + 60_000), 10, 'never above capacity');
    assert.equal(await spend('a', 4, T + 60_000), 6);
  });

  it('a time behind the stored one refills nothing (a lagging clock adds no tokens); the stored time never goes back', async () => {
    assert.equal(await spend('b', 5, T + 10_000), 5);
    assert.equal(await spend('b', 1, T + 9_000), 4, 'no refill from a clock 1 s behind');
    assert.equal(await spend('b', 0, T + 11_000), 5, 'refilled from T+10 s, not from T+9 s');
  });

  it('an overdraft (instances that spent at once) is a debt down to −capacity, paid back by the refill', async () => {
    assert.equal(await spend('c', 14, T), -4);
    assert.equal(await spend('c', 0, T + 2_000), -2);
    assert.equal(await spend('c', 100, T + 2_000), -10, 'floored at −capacity');
  });

  it('many buckets in one statement, each by its own row; full rows are deleted', async () => {
    const levels = await store.sync(
      [
        { bucket: 'm2', spent: 2, ...SHAPE },
        { bucket: 'm1', spent: 1, capacity: 4, refillPerMs: 4 / 60_000 },
      ],
      T,
    );
    assert.deepEqual([levels.get('m1'), levels.get('m2')], [3, 8]);
    const full = await db.query<{ bucket: string; full_at: string }>(
      "SELECT bucket, full_at FROM rate_limit_buckets WHERE bucket IN ('m1', 'm2') ORDER BY bucket",
    );
    assert.deepEqual(
      full.rows.map((r) => [r.bucket, Number(r.full_at)]),
      [
        ['m1', T + 15_000],
        ['m2', T + 2_000],
      ],
    );
    assert.equal((await store.deleteFull(T + 2_001, 1_000)) >= 1, true);
    const left = await db.query<{ bucket: string }>(
      "SELECT bucket FROM rate_limit_buckets WHERE bucket IN ('m1', 'm2')",
    );
    assert.deepEqual(
      left.rows.map((r) => r.bucket),
      ['m1'],
      'm2 was full again at T+2 s; m1 is not until T+15 s',
    );
  });

  it('two processes on one database converge within one sync each', async () => {
    const clock = { now: T + 100_000 };
    const now = () => clock.now;
    const [a, b] = [new RateLimitState(), new RateLimitState()];
    const signature = JSON.stringify(['limit', 'key', 10, 60, 10, null, null]);
    const shape = { capacity: 10, refillPerMs: 10 / 60_000 };
    const [bucketsA, bucketsB] = [a.bucketsFor(signature, shape), b.bucketsFor(signature, shape)];
    const syncA = startRateLimitSync(a, new PostgresRateLimitStore(storage(url)), { now, timer: false });
    const syncB = startRateLimitSync(b, new PostgresRateLimitStore(storage(url)), { now, timer: false });
    try {
      const takeN = (buckets: typeof bucketsA, n: number) => {
        for (let i = 0; i < n; i++) buckets.take('client', now(), buckets.available('client', now()));
      };
      takeN(bucketsA, 6);
      takeN(bucketsB, 3);
      assert.deepEqual(
        [bucketsA.available('client', now()), bucketsB.available('client', now())],
        [4, 7],
        'each decides locally',
      );
      await syncA.syncNow();
      await syncB.syncNow();
      assert.equal(bucketsB.available('client', now()), 1, 'B has both spends after its sync');
      takeN(bucketsA, 1); // A spends on its stale 4 (the bound: what it holds locally)...
      await syncA.syncNow();
      assert.equal(bucketsA.available('client', now()), 0, '...and has every spend after its next sync');
      const stored = await db.query<{ tokens: number }>('SELECT tokens FROM rate_limit_buckets WHERE bucket = $1', [
        sharedBucketId(signature, 'client'),
      ]);
      assert.equal(stored.rows[0]!.tokens, 0);
      const raw = await db.query<{ n: string }>(
        "SELECT count(*) AS n FROM rate_limit_buckets WHERE bucket LIKE '%client%'",
      );
      assert.equal(Number(raw.rows[0]!.n), 0, 'no client key stored in the clear');

      // What is taken while a sync travels stays charged: taken after the collection, sent next time.
      clock.now += 12_000; // two tokens back: B holds 1 + 2 locally, the row 0 + 2
      takeN(bucketsB, 1);
      const travelling = syncB.syncNow(); // collects B's spend of 1 at once, then waits for Postgres
      takeN(bucketsB, 1);
      await travelling;
      const level = async () =>
        (
          await db.query<{ tokens: number }>('SELECT tokens FROM rate_limit_buckets WHERE bucket = $1', [
            sharedBucketId(signature, 'client'),
          ])
        ).rows[0]!.tokens;
      assertNear(await level(), 1, 'the row: 0 + 2 − 1');
      assertNear(bucketsB.available('client', now()), 0, 'B: the row less the token taken while the sync travelled');
      await syncB.syncNow();
      assertNear(await level(), 0, 'that token reached the row with the next sync');
      assertNear(bucketsB.available('client', now()), 0);
      assert.equal(syncA.shared && syncB.shared, true);
    } finally {
      await syncA.close();
      await syncB.close();
    }
  });
});
