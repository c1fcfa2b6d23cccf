import pg from 'pg';
import type { PostgresStorageConfig } from '../../config/schema.js';
import type { BucketSpend, RateLimitStore } from '../contracts/rate-limits.js';
import { connectionOptions } from './pool.js';

/** A sync runs in the background, once per interval: it gives up soon rather than pile up. */
const QUERY_TIMEOUT_MS = 2_000;

/**
 * Refill to `$5` (now), subtract the spend, floor at −capacity; `full_at` is when the level is
 * back at capacity (past it the row says nothing a missing row would not). Rows are taken in
 * bucket order, so two instances syncing overlapping buckets lock them in the same order (no
 * deadlock). A time behind the stored one refills nothing (a lagging clock never adds tokens).
 */
const SYNC_SQL = `
INSERT INTO rate_limit_buckets AS b (bucket, tokens, at, capacity, refill_per_ms, spent, full_at)
SELECT d.bucket, GREATEST(d.capacity - d.spent, -d.capacity), $5::bigint, d.capacity, d.rate, d.spent,
       $5::bigint + ceil((d.capacity - GREATEST(d.capacity - d.spent, -d.capacity)) / d.rate)::bigint
FROM unnest($1::text[], $2::float8[], $3::float8[], $4::float8[]) AS d (bucket, spent, capacity, rate)
ORDER BY d.bucket
ON CONFLICT (bucket) DO UPDATE SET (tokens, at, capacity, refill_per_ms, spent, full_at) = (
  SELECT level, at, EXCLUDED.capacity, EXCLUDED.refill_per_ms, EXCLUDED.spent,
         at + ceil((EXCLUDED.capacity - level) / EXCLUDED.refill_per_ms)::bigint
  FROM (SELECT GREATEST(LEAST(EXCLUDED.capacity, b.tokens + GREATEST(0, EXCLUDED.at - b.at) * EXCLUDED.refill_per_ms) - EXCLUDED.spent, -EXCLUDED.capacity) AS level,
               GREATEST(b.at, EXCLUDED.at) AS at) AS next
)
RETURNING bucket, tokens`;

/**
 * The shared token buckets on PostgreSQL (table `rate_limit_buckets`, migration 4), on a pool of
 * one connection of its own: one statement per sync interval per gateway process, never on the
 * request path. Opening connects nothing (the first sync does): a gateway worker that starts
 * while PostgreSQL is down still starts, counting locally.
 */
export class PostgresRateLimitStore implements RateLimitStore {
  private readonly pool: pg.Pool;

  constructor(storage: PostgresStorageConfig) {
    this.pool = new pg.Pool({
      ...connectionOptions(storage.url),
      connectionTimeoutMillis: QUERY_TIMEOUT_MS,
      query_timeout: QUERY_TIMEOUT_MS,
      max: 1,
      idleTimeoutMillis: 30_000,
    });
    this.pool.on('error', () => {}); // an idle connection lost: the next sync opens another (and reports)
  }

  async sync(spends: readonly BucketSpend[], now: number): Promise<Map<string, number>> {
    const levels = new Map<string, number>();
    if (spends.length === 0) return levels;
    const { rows } = await this.pool.query<{ bucket: string; tokens: number }>(SYNC_SQL, [
      spends.map((s) => s.bucket),
      spends.map((s) => s.spent),
      spends.map((s) => s.capacity),
      spends.map((s) => s.refillPerMs),
      Math.floor(now),
    ]);
    for (const row of rows) levels.set(row.bucket, row.tokens);
    return levels;
  }

  async deleteFull(now: number, limit: number): Promise<number> {
    const { rowCount } = await this.pool.query(
      'DELETE FROM rate_limit_buckets WHERE bucket IN (SELECT bucket FROM rate_limit_buckets WHERE full_at < $1::bigint LIMIT $2)',
      [Math.floor(now), limit],
    );
    return rowCount ?? 0;
  }

  async close(): Promise<void> {
    await this.pool.end().catch(() => {});
  }
}
