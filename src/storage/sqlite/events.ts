import { randomUUID } from 'node:crypto';
import type Database from 'better-sqlite3';
import type { Logger } from 'pino';
import { webhookActions, type WebhookAction } from '../../config/schema.js';
import { openDatabase } from './database.js';
import { acquireWriterLock, type WriterLock } from './writer-lock.js';
import { HandOverQueue } from '../hand-over-queue.js';
import { exportEvents } from './export.js';
import { inChunks, prepareStatements, toAttempt, type Deliverable, type Statements } from './statements.js';
import { SqliteEventQueries } from './event-queries.js';
import {
  DeliveredCounts,
  IDEMPOTENCY_WINDOW_MS,
  lastErrorOf,
  newEventId,
  requeueInChunks,
  toEvent,
  type AcceptResult,
  type EventFilter,
  type EventListing,
  type EventPageKey,
  type RequeueOptions,
  type RequeueTarget,
  type AttemptOutcome,
  type AttemptRecord,
  type ClaimedEvent,
  type DeliveryStatus,
  type EventDetail,
  type EventStore,
  type ExportedEvent,
  type NewEvent,
  type PurgeResult,
  type QueueStats,
  type StoreStatus,
  type StoredEvent,
} from '../contracts/events.js';
/** The SQLite driver's tuning, in one place. */
export interface SqliteTuning {
  /** The hand-over queue's bounds: events this process accepted, waiting in memory for its deliverer (beyond them, for a scan). */
  maxFreshEvents: number;
  maxFreshBytes: number;
  /** Index entries per step of the delivered count (measured: ~5 ms of the event loop at 20,000). */
  deliveredCountStep: number;
  /** A /readyz write that worked stands this long. */
  probeReuseMs: number;
  /** exportAll's batches: this many events at most, and about this many bytes of envelopes (a batch is one multi-row insert on the other side). */
  exportBatchEvents: number;
  exportBatchBytes: number;
}

export const DEFAULT_SQLITE_TUNING: Readonly<SqliteTuning> = Object.freeze({
  maxFreshEvents: 10_000,
  maxFreshBytes: 32 * 1024 * 1024,
  deliveredCountStep: 20_000,
  probeReuseMs: 1_000,
  exportBatchEvents: 500,
  exportBatchBytes: 8 * 1024 * 1024,
});

export { SQLITE_SCHEMA_VERSION } from './migrations.js';
export { PURGE_CHUNK_SQL, PURGE_RECENT_PAGE_SQL } from './statements.js';

interface Lease {
  until: number;
  claimId: string;
}

interface PendingWrite {
  run: () => unknown;
  resolve: (result: any) => void;
  reject: (err: unknown) => void;
}

/**
 * SQLite (better-sqlite3, WAL, synchronous=FULL) store. Group commit: the writes (accepts and
 * attempt records) that arrive in the same turn of the event loop share one transaction, and
 * each resolves after that single fsync, so durability costs one commit per batch rather than
 * per request. One failing write fails alone (see flush).
 *
 * Leases live in this process's memory: reading due events never writes, and a restart after
 * a crash starts with none, so everything undelivered is due again. One delivering process per
 * SQLite file (the server takes src/storage/sqlite/writer-lock.ts to make sure).
 */
export class SqliteEventStore implements EventStore {
  private readonly db: Database.Database;
  private pending: PendingWrite[] = [];
  private flushScheduled = false;
  /** Event id → its current lease (kept past its end until settled or claimed again: the token still fences). */
  private readonly leases = new Map<string, Lease>();
  /**
   * Events this process accepted and no deliverer has claimed yet, per action: handed out
   * without reading them back from the file. Bounded; beyond it, events wait for a scan.
   */
  private readonly fresh: HandOverQueue<Deliverable>;
  private readonly tuning: Readonly<SqliteTuning>;
  private readonly statements: Statements;
  private readonly queries: SqliteEventQueries;

  private readonly writerLock: WriterLock | undefined;
  private readonly delivered: DeliveredCounts;
  /** /readyz's write: the one under way, and when one last worked. */
  private probing: Promise<void> | undefined;
  private probedOkAt: number | undefined;

  /**
   * `mustExist`: open an existing store only (the CLI), rather than create an empty one at a
   * mistyped path. `singleWriter`: the server's store, refused while another server has the file
   * (see acquireWriterLock); released by close(). `deliveredCountStep`: see countDelivered (tests
   * take small steps). `tuning`: beside DEFAULT_SQLITE_TUNING. `logger`: where a failed count of
   * the delivered events is said. The file's schema is migrated (see openDatabase).
   */
  constructor(
    file: string,
    options: {
      mustExist?: boolean;
      singleWriter?: boolean;
      deliveredCountStep?: number;
      tuning?: Partial<SqliteTuning>;
      logger?: Pick<Logger, 'warn'>;
    } = {},
  ) {
    this.tuning = {
      ...DEFAULT_SQLITE_TUNING,
      ...options.tuning,
      ...(options.deliveredCountStep !== undefined && { deliveredCountStep: options.deliveredCountStep }),
    };
    this.fresh = new HandOverQueue({ maxEvents: this.tuning.maxFreshEvents, maxBytes: this.tuning.maxFreshBytes });
    this.delivered = new DeliveredCounts(
      () => this.countDelivered(),
      (err) =>
        this.db.open &&
        options.logger?.warn(
          { err: (err as Error).message },
          'metrics: could not count the delivered events; the last count stands',
        ),
    );
    this.writerLock = options.singleWriter ? acquireWriterLock(file) : undefined;
    try {
      this.db = openDatabase(file, options);
    } catch (err) {
      this.writerLock?.release();
      throw err;
    }
    this.statements = prepareStatements(this.db);
    this.queries = new SqliteEventQueries(this.db);
  }

  async accept(event: NewEvent): Promise<AcceptResult> {
    const { stored, ...result } = await this.write(() => this.insertOne(event));
    if (stored) this.handOver(stored);
    return result;
  }

  /**
   * Runs `work` in the next group commit, inside a savepoint of its own: the events it accepts
   * and what it writes to its own tables (an integration's cursor) are committed together, or
   * not at all. Resolves once durable. For integrations that keep their state in this file.
   */
  async atomically<T>(work: (tx: { accept(event: NewEvent): AcceptResult; db: Database.Database }) => T): Promise<T> {
    const storedEvents: StoredEvent[] = [];
    const accept = (event: NewEvent): AcceptResult => {
      const { stored, ...result } = this.insertOne(event);
      if (stored) storedEvents.push(stored);
      return result;
    };
    // A nested better-sqlite3 transaction is a SAVEPOINT: a throw undoes this work alone.
    const result = await this.write(() => this.db.transaction(() => work({ accept, db: this.db }))());
    for (const stored of storedEvents) this.handOver(stored);
    return result;
  }

  /** The SQLite connection, for an integration's own tables (created in its constructor). */
  get database(): Database.Database {
    return this.db;
  }

  /** A committed event goes to the deliverer from memory, while the fresh queue has room. */
  private handOver(stored: StoredEvent): void {
    if (this.fresh.fits(stored.envelope.length)) this.fresh.push(stored);
  }

  /** Queues a write for the next group commit; resolves once it is durable. */
  private write<T>(run: () => T): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.pending.push({ run, resolve, reject });
      if (!this.flushScheduled) {
        this.flushScheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.flushScheduled = false;
    const batch = this.pending;
    this.pending = [];
    const outcomes: ({ ok: true; value: unknown } | { ok: false; err: unknown })[] = [];
    try {
      this.db.transaction(() => {
        for (const w of batch) {
          // No savepoint per write (they cost more than the inserts): SQLite undoes a failing
          // statement alone and the transaction goes on, so each write fails alone as long as
          // its statements are ordered with the one that can fail (a key conflict) first.
          try {
            outcomes.push({ ok: true, value: w.run() });
          } catch (err) {
            // SQLITE_FULL, IOERR, BUSY… roll the whole transaction back: then the batch as a whole fails.
            if (!this.db.inTransaction) throw err;
            outcomes.push({ ok: false, err });
          }
        }
      })();
    } catch (err) {
      for (const w of batch) w.reject(err); // the commit itself failed: nothing in the batch is stored
      return;
    }
    batch.forEach((w, i) => {
      const outcome = outcomes[i]!;
      if (outcome.ok) w.resolve(outcome.value);
      else w.reject(outcome.err);
    });
  }

  private insertOne(event: NewEvent): AcceptResult & { stored?: Deliverable } {
    const seen =
      event.idempotencyKey !== undefined
        ? this.statements.findByKey.get(event.endpoint, event.idempotencyKey)
        : undefined;
    if (seen && seen.received_at > event.receivedAt - IDEMPOTENCY_WINDOW_MS) return { id: seen.id, duplicate: true };
    const replayed =
      event.replayKey !== undefined ? this.statements.findByReplayKey.get(event.endpoint, event.replayKey) : undefined;
    if (replayed) return { id: replayed.id, duplicate: true };
    const id = newEventId(event.receivedAt);
    const envelope = event.envelope(id); // before any write: a throw here leaves nothing behind
    // Both keys were looked up in this same transaction, so neither insert can meet a conflict.
    if (seen) this.statements.forgetKey.run(seen.id);
    this.statements.insert.run(
      id,
      event.endpoint,
      event.action,
      event.idempotencyKey ?? null,
      event.receivedAt,
      envelope,
      event.receivedAt,
      event.headers ?? null,
      event.traceContext ?? null,
    );
    if (event.replayKey !== undefined) this.statements.insertReplayKey.run(event.endpoint, event.replayKey, id);
    const stored: Deliverable = {
      traceContext: event.traceContext,
      id,
      endpoint: event.endpoint,
      action: event.action,
      idempotencyKey: event.idempotencyKey ?? null,
      receivedAt: event.receivedAt,
      envelope,
      status: 'queued',
      attempts: 0,
      roundAttempts: 0,
      nextAttemptAt: event.receivedAt,
      lastError: null,
      deliveredAt: null,
    };
    return { id, duplicate: false, stored };
  }

  async claimDue(now: number, limit: number, leaseMs: number, action: WebhookAction): Promise<ClaimedEvent[]> {
    let claimed: Deliverable[] = [];
    if (this.fresh.lane(action)?.length) {
      // Just accepted by this process: handed out from memory, not read back from the file (one
      // settled some other way meanwhile was forgotten, and is dropped).
      claimed = this.fresh.take(action, now, limit);
      if (claimed.length === limit) return this.lease(claimed, now + leaseMs);
    }
    const fromMemory = new Set(claimed.map((e) => e.id));
    for (const { id } of this.statements.due.all(
      action,
      now,
      limit + this.leases.size + this.fresh.size + fromMemory.size,
    )) {
      if ((this.leases.get(id)?.until ?? 0) > now || this.fresh.has(id) || fromMemory.has(id)) continue;
      const row = this.statements.claimed.get(id);
      if (!row) continue;
      claimed.push({ ...toEvent(row), traceContext: row.trace_context });
      if (claimed.length === limit) break;
    }
    // Leased only once every row is read: a read that throws leaves no orphaned leases.
    return this.lease(claimed, now + leaseMs);
  }

  /** Each claim gets a fresh token (see ClaimedEvent). */
  private lease(events: Deliverable[], until: number): ClaimedEvent[] {
    return events.map((event) => {
      const claimId = randomUUID();
      this.leases.set(event.id, { until, claimId });
      return { ...event, claimId, leaseUntil: until };
    });
  }

  recordAttempt(id: string, attempt: AttemptRecord, outcome: AttemptOutcome, claimId?: string): Promise<boolean> {
    const fenced = () => claimId !== undefined && this.leases.get(id)?.claimId !== claimId;
    if (!fenced()) this.fresh.forget(id);
    return this.write(() => {
      if (fenced()) return false; // the lease passed to another claim meanwhile: its holder settles the event
      this.statements.insertAttempt.run(
        id,
        attempt.attempt,
        attempt.at,
        attempt.status,
        attempt.error,
        Math.round(attempt.durationMs),
        attempt.responseSnippet ?? null,
      );
      this.statements.settle.run(
        outcome.status,
        outcome.status === 'queued' ? outcome.nextAttemptAt : 0,
        lastErrorOf(attempt, outcome),
        outcome.status === 'delivered' ? attempt.at + Math.round(attempt.durationMs) : null,
        id,
      );
      return true;
    }).then((recorded) => {
      if (recorded) this.leases.delete(id);
      return recorded;
    });
  }

  async renewLease(id: string, claimId: string, leaseUntil: number): Promise<boolean> {
    const lease = this.leases.get(id);
    if (lease?.claimId !== claimId) return false;
    lease.until = leaseUntil;
    return true;
  }

  async releaseLeases(): Promise<number> {
    this.fresh.clear();
    const held = this.leases.size;
    this.leases.clear();
    return held;
  }

  async status(now: number): Promise<StoreStatus> {
    const counts: Record<DeliveryStatus, number> = { queued: 0, delivered: 0, dead: 0 };
    for (const row of this.statements.counts.all()) counts[row.status] = row.n;
    let leased = 0;
    for (const lease of this.leases.values()) if (lease.until > now) leased++;
    return { driver: 'sqlite', location: this.db.name, schemaVersion: await this.schemaVersion(), counts, leased };
  }

  async schemaVersion(): Promise<number> {
    return this.db.pragma('user_version', { simple: true }) as number;
  }

  async queueStats(now: number): Promise<QueueStats> {
    const delivered = await this.delivered.get(now); // first: it may wait, and the rest is then read as of the same moment
    const counts = this.statements.undeliveredCounts
      .all()
      .map((row) => ({ action: row.action, status: row.status, events: row.n }));
    for (const [action, events] of delivered ?? []) counts.push({ action, status: 'delivered', events });
    return {
      counts,
      deliveredCounted: delivered !== undefined,
      oldestDueAt: this.statements.oldestDue.get(now)?.at ?? undefined,
    };
  }

  /**
   * Every delivered event counted, per action, `deliveredCountStep` index entries at a time with
   * the event loop free in between: the server's requests wait for one step (a few ms), never
   * for the whole count. Events settled or purged meanwhile may count or not, as in any count of
   * a store in use.
   */
  private async countDelivered(): Promise<Map<WebhookAction, number>> {
    const counts = new Map<WebhookAction, number>();
    for (const action of webhookActions) {
      let key: { at: number; id: string } = { at: Number.MIN_SAFE_INTEGER, id: '' };
      let n = 0;
      for (;;) {
        if (!this.db.open) throw new Error('the event store is closed');
        const next = this.statements.deliveredStep.get(action, key.at, key.id, this.tuning.deliveredCountStep - 1);
        if (!next) {
          n += this.statements.deliveredRest.get(action, key.at, key.id)!.n;
          break;
        }
        n += this.tuning.deliveredCountStep;
        key = next;
        await new Promise((resolve) => setImmediate(resolve));
      }
      if (n > 0) counts.set(action, n);
    }
    return counts;
  }

  /** Through the group commit, like accept: a file that cannot be written (locked, read-only, full) rejects. */
  async probeWrite(): Promise<void> {
    // A real write is a commit (an fsync): probes at once share one, and one that worked stands
    // for a second, so a flood of /readyz (it has no token) costs the disk one write a second.
    if (this.probedOkAt !== undefined && Date.now() - this.probedOkAt < this.tuning.probeReuseMs) return;
    this.probing ??= this.write(() => this.statements.probeWrite.run(Date.now()))
      .then(() => {
        this.probedOkAt = Date.now();
      })
      .finally(() => {
        this.probing = undefined;
      });
    return this.probing;
  }

  /** The earliest time a queued event can be claimed: leased events count from their lease's end. */
  async nextDueAt(now: number): Promise<number | undefined> {
    let earliest: number | undefined;
    for (const lane of this.fresh.lanesInUse()) {
      const head = lane.find((e) => this.fresh.has(e.id));
      if (head) earliest = Math.min(earliest ?? head.nextAttemptAt, head.nextAttemptAt);
    }
    if (earliest !== undefined && earliest <= now) return earliest; // work is waiting: no need to ask the file
    let active = 0;
    for (const { until } of this.leases.values()) {
      if (until <= now) continue;
      active++;
      earliest = Math.min(earliest ?? until, until);
    }
    for (const row of this.statements.nextDue.all(active + this.fresh.size + 1)) {
      if ((this.leases.get(row.id)?.until ?? 0) > now || this.fresh.has(row.id)) continue;
      earliest = Math.min(earliest ?? row.next_attempt_at, row.next_attempt_at);
      break;
    }
    return earliest;
  }

  async list(filter: { status?: DeliveryStatus; endpoint?: string; limit?: number }): Promise<StoredEvent[]> {
    return this.queries.list(filter);
  }

  async listPage(filter: EventFilter, page: { limit: number; after?: EventPageKey }): Promise<EventListing[]> {
    return this.queries.listPage(filter, page);
  }

  requeueMatching(target: RequeueTarget, now: number, options: RequeueOptions): Promise<number> {
    return requeueInChunks(target, now, options, this.queries);
  }

  async get(id: string): Promise<EventDetail | undefined> {
    const row = this.statements.get.get(id);
    if (!row) return undefined;
    const headers = this.statements.headers.get(id)?.headers ?? null;
    return { event: toEvent(row), attempts: this.statements.attempts.all(id).map(toAttempt), headers };
  }

  async requeue(id: string, now: number): Promise<boolean> {
    return this.statements.requeue.run({ now, id }).changes > 0;
  }

  async requeueDead(now: number): Promise<number> {
    return inChunks(() => this.statements.requeueDead.run({ now }).changes);
  }

  async requeueWaiting(now: number): Promise<number> {
    return inChunks(() => this.statements.requeueWaiting.run({ now }).changes);
  }

  async purgeDelivered(olderThan: number, now: number): Promise<PurgeResult> {
    const forgotten = now - IDEMPOTENCY_WINDOW_MS;
    // Delivered before the window began means received before it too: no delivery id to keep.
    let purged = await inChunks(() => this.statements.purge.run(Math.min(olderThan, forgotten)).changes);
    let keptInWindow = 0;
    let cursor = { at: forgotten, row: -1 };
    while (olderThan > forgotten) {
      const page = this.statements.purgeRecentPage.all({ before: olderThan, ...cursor });
      if (page.length === 0) break;
      const deleted = this.statements.purgeRecentDelete.run({
        rows: JSON.stringify(page.map((p) => p.row)),
        forgotten,
      }).changes;
      purged += deleted;
      // The page's rows the delete left are the ones whose delivery id is still remembered.
      keptInWindow += page.length - deleted;
      cursor = page.at(-1)!;
      await new Promise((r) => setImmediate(r));
    }
    return { purged, keptInWindow };
  }

  /**
   * Every event with its attempts and replay keys, in id order, in batches, all read from one
   * snapshot (see exportEvents). For `gatehouse storage copy`, which holds the writer lock (no
   * server accepts meanwhile) and writes nothing through this store while iterating.
   */
  async *exportAll(): AsyncGenerator<ExportedEvent[]> {
    if (this.db.inTransaction || this.pending.length > 0)
      throw new Error('exportAll needs a store with no write under way');
    yield* exportEvents(this.db, this.tuning);
  }

  async close(): Promise<void> {
    if (this.pending.length > 0) this.flush();
    this.db.close();
    this.writerLock?.release();
  }
}
