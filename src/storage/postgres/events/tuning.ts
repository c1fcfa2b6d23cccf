/**
 * The PostgreSQL events store's tuning, in one options object (as Convoy's PostgresTuning):
 * every size, count and interval its parts use, with the measured reason beside each.
 */
export interface PostgresTuning {
  /** Accepts, or attempt records, in one statement at most. Convoy batches 64 rows; gatehouse's SQLite driver takes a whole tick. A bound keeps one statement's parameters sane. */
  maxBatch: number;
  /** A batch that meets a deadlock (two instances' batches locking keys in different orders) is run this many times in all. */
  batchTries: number;
  /** Events accepted here and leased to this process's deliverer in their INSERT, waiting in memory (the hand-over queue). */
  maxFreshEvents: number;
  maxFreshBytes: number;
  /** A fresh event is handed out as it is while this much of its lease is left (the deliverer renews at half); else its lease is extended first. */
  freshLeaseLeft: number;
  /**
   * How often a deliverer with nothing known to be waiting in the database still looks there: for
   * what no one announces (another instance's lease that ran out, its retries coming due).
   */
  dbLookMs: number;
  /** Accepts are leased to this process's deliverer only while it has claimed their action this recently. */
  claimingRecentlyMs: number;
  /**
   * An action's fresh queue holds at most what its deliverer takes in this long (at its recent
   * rate), and never less than freshMinEvents: accepts beyond that go to the database unleased
   * (and are announced), so other instances take them instead of waiting out this one's leases
   * behind a slow target, and an instance that dies strands little.
   */
  freshAheadMs: number;
  freshMinEvents: number;
  /** The longest a recount of the delivered events (for /metrics, in the background) is waited for. */
  deliveredCountTimeoutMs: number;
}

export const DEFAULT_POSTGRES_TUNING: Readonly<PostgresTuning> = Object.freeze({
  maxBatch: 500,
  batchTries: 3,
  maxFreshEvents: 5_000,
  maxFreshBytes: 32 * 1024 * 1024,
  freshLeaseLeft: 0.75,
  dbLookMs: 1_000,
  claimingRecentlyMs: 10_000,
  freshAheadMs: 2_000,
  freshMinEvents: 64,
  deliveredCountTimeoutMs: 10 * 60_000,
});
