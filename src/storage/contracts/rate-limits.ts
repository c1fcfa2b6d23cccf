/**
 * The rate-limit buckets several gatehouse instances share (PostgreSQL: see
 * src/storage/postgres/rate-limits.ts). SQLite and a single instance need none: their buckets
 * live in memory only (src/gateway/rate-limit.ts).
 */

/** What one instance spent from one bucket since it last synced that bucket. */
export interface BucketSpend {
  /** The row's identity: a digest of the limit's definition and the client key (never a raw key). */
  bucket: string;
  /** Tokens taken locally since the last sync (whole requests). */
  spent: number;
  /** The bucket's full size and refill rate (a new row starts full). */
  capacity: number;
  refillPerMs: number;
}

export interface RateLimitStore {
  /**
   * In one statement, for every bucket in `spends`: refills the shared level from its stored time
   * to `now` (capped at `capacity`), subtracts `spent` (the level may go below zero, down to
   * −capacity: a debt the refill pays back), and returns the new levels as of `now`, by bucket.
   * Rejects when the store cannot be reached (the caller keeps counting locally).
   */
  sync(spends: readonly BucketSpend[], now: number): Promise<Map<string, number>>;
  /** Deletes up to `limit` rows that are full again by `now` (a missing row is a full bucket). */
  deleteFull(now: number, limit: number): Promise<number>;
  close(): Promise<void>;
}
