import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import type { Logger } from 'pino';
import type { PostgresStorageConfig, WebhookAction } from '../../config/schema.js';
import {
  DeliveredCounts,
  requeueInChunks,
  type EventFilter,
  type EventListing,
  type EventPageKey,
  type RequeueOptions,
  type RequeueTarget,
  type AcceptResult,
  type AttemptOutcome,
  type AttemptRecord,
  type EventDetail,
  type ClaimedEvent,
  type CopyCounts,
  type DeliveryStatus,
  type EventStore,
  type ExportedEvent,
  type NewEvent,
  type PurgeResult,
  type QueueStats,
  type StoreStatus,
  type StoredEvent,
} from '../contracts/events.js';
import { AcceptBatcher } from './events/accept.js';
import { EventAdmin } from './events/admin.js';
import { Claims } from './events/claims.js';
import { importEvents } from './events/copy.js';
import { DueNotifier } from './events/notify.js';
import { SettleBatcher } from './events/settle.js';
import { DEFAULT_POSTGRES_TUNING, type PostgresTuning } from './events/tuning.js';
import { openMigratedPool, schemaVersion } from './migrations.js';
import { GatedPool, whenSchemaReady } from './schema-gate.js';

export { CLAIM_DUE_SQL } from './events/claims.js';
export { UNDELIVERED_COUNTS_SQL } from './events/admin.js';
export { DEFAULT_POSTGRES_TUNING, type PostgresTuning } from './events/tuning.js';

export interface PostgresEventStoreOptions {
  logger?: Pick<Logger, 'warn' | 'info' | 'error'>;
  /** Apply pending migrations (the server, `storage migrate`); otherwise refuse an unmigrated database (the CLI). */
  migrate?: boolean;
  /** LISTEN for other processes' accepts (servers); the CLI only NOTIFYs. */
  listen?: boolean;
  /** Beside DEFAULT_POSTGRES_TUNING. */
  tuning?: Partial<PostgresTuning>;
  /** Opened at once, the schema checked behind a gate until the database answers (see SchemaGate). */
  waitForDatabase?: boolean;
}

/**
 * PostgreSQL store, shared by any number of gatehouse processes: a facade over one part a file
 * (src/storage/postgres/events/), all on one pool.
 *
 * - Accept (accept.ts): group commit, deduped by delivery id and replay key across instances;
 *   each accept resolves after COMMIT.
 * - Claims (claims.ts): leases with a fencing token, FOR UPDATE SKIP LOCKED; events accepted
 *   here are leased to this process's deliverer by their INSERT and handed over from memory
 *   (src/storage/hand-over-queue.ts).
 * - Settle (settle.ts): attempt records group-settled under their claims.
 * - Notify (notify.ts): NOTIFY after COMMIT, LISTEN for the other instances'.
 * - Admin (admin.ts): the CLI's and /metrics' queries. Copy (copy.ts): `storage copy`'s import.
 * - Tuning (tuning.ts): every size and interval in one options object.
 * - Postgres down: every call rejects (the receiver answers 503, the deliverer pauses); the
 *   pool opens fresh connections once it is back.
 */
export class PostgresEventStore implements EventStore {
  /** This process's leases are tagged with it, so releaseLeases frees its own and no one else's. */
  private readonly owner = randomUUID();
  private closed = false;
  private readonly notifier: DueNotifier;
  private readonly claims: Claims;
  private readonly accepts: AcceptBatcher;
  private readonly settles: SettleBatcher;
  private readonly admin: EventAdmin;
  /** The delivered events' counts for /metrics (see DeliveredCounts), counted by the admin queries. */
  private readonly delivered: DeliveredCounts;

  private constructor(
    private readonly pool: pg.Pool,
    private readonly storage: PostgresStorageConfig,
    options: PostgresEventStoreOptions,
  ) {
    const tuning = { ...DEFAULT_POSTGRES_TUNING, ...options.tuning };
    this.notifier = new DueNotifier(
      pool,
      this.owner,
      () => this.closed,
      () => this.claims.mayAllHaveDue(),
    );
    this.claims = new Claims(pool, this.owner, tuning, this.notifier);
    this.accepts = new AcceptBatcher(pool, this.owner, tuning, this.claims, this.notifier);
    this.settles = new SettleBatcher(pool, tuning.maxBatch);
    this.delivered = new DeliveredCounts(
      () => this.admin.countDelivered(),
      (err) =>
        this.closed ||
        options.logger?.warn(
          { err: (err as Error).message },
          'metrics: could not count the delivered events; the last count stands',
        ),
    );
    this.admin = new EventAdmin(pool, storage, tuning, this.notifier, this.delivered);
  }

  /** Connects, and migrates (or checks the schema version); rejects when Postgres cannot be reached. */
  static async open(
    storage: PostgresStorageConfig,
    options: PostgresEventStoreOptions = {},
  ): Promise<PostgresEventStore> {
    // Migrated, or refused with what to run when the schema is missing, behind or newer (a CLI).
    const pool = await openMigratedPool(storage, options);
    const store = new PostgresEventStore(pool, storage, options);
    // Behind the schema gate, LISTEN waits for it too (the gate alone says the database is away).
    if (options.listen)
      void whenSchemaReady(pool).then(() => store.closed || store.notifier.listen(storage.url, options.logger));
    return store;
  }

  /** Whether the schema is checked: false while a server that started without its database waits for it (SchemaGate). */
  get schemaReady(): boolean {
    return !(this.pool instanceof GatedPool) || this.pool.gate.isOpen;
  }

  /** Resolves once schemaReady (never rejects). */
  whenSchemaReady(): Promise<void> {
    return whenSchemaReady(this.pool);
  }

  accept(event: NewEvent): Promise<AcceptResult> {
    if (this.closed) return Promise.reject(new Error('the event store is closed'));
    return this.accepts.accept(event);
  }

  /** See AcceptBatcher.atomically: events and an integration's own writes, in one transaction. */
  atomically<T>(
    work: (tx: { client: pg.PoolClient; accept(events: NewEvent[]): Promise<AcceptResult[]> }) => Promise<T>,
  ): Promise<T> {
    return this.accepts.atomically(work);
  }

  claimDue(now: number, limit: number, leaseMs: number, action: WebhookAction): Promise<ClaimedEvent[]> {
    return this.claims.claimDue(now, limit, leaseMs, action);
  }

  recordAttempt(id: string, attempt: AttemptRecord, outcome: AttemptOutcome, claimId?: string): Promise<boolean> {
    if (this.closed) return Promise.reject(new Error('the event store is closed'));
    // A retry comes due in the database: the deliverer looks there then.
    if (outcome.status === 'queued') this.claims.retryDueAt(outcome.nextAttemptAt);
    return this.settles.record(id, attempt, outcome, claimId);
  }

  renewLease(id: string, claimId: string, leaseUntil: number): Promise<boolean> {
    return this.claims.renewLease(id, claimId, leaseUntil);
  }

  releaseLeases(): Promise<number> {
    return this.claims.releaseLeases();
  }

  nextDueAt(now: number): Promise<number | undefined> {
    return this.claims.nextDueAt(now);
  }

  onDue(wake: () => void): () => void {
    return this.notifier.onDue(wake);
  }

  list(filter: { status?: DeliveryStatus; endpoint?: string; limit?: number }): Promise<StoredEvent[]> {
    return this.admin.list(filter);
  }

  listPage(filter: EventFilter, page: { limit: number; after?: EventPageKey }): Promise<EventListing[]> {
    return this.admin.listPage(filter, page);
  }

  requeueMatching(target: RequeueTarget, now: number, options: RequeueOptions): Promise<number> {
    return requeueInChunks(target, now, options, this.admin);
  }

  get(id: string): Promise<EventDetail | undefined> {
    return this.admin.get(id);
  }

  requeue(id: string, now: number): Promise<boolean> {
    return this.admin.requeue(id, now);
  }

  requeueDead(now: number): Promise<number> {
    return this.admin.requeueDead(now);
  }

  requeueWaiting(now: number): Promise<number> {
    return this.admin.requeueWaiting(now);
  }

  purgeDelivered(olderThan: number, now: number): Promise<PurgeResult> {
    return this.admin.purgeDelivered(olderThan, now);
  }

  status(now: number): Promise<StoreStatus> {
    return this.admin.status(now);
  }

  schemaVersion(): Promise<number> {
    return schemaVersion(this.pool);
  }

  queueStats(now: number): Promise<QueueStats> {
    return this.admin.queueStats(now);
  }

  probeWrite(): Promise<void> {
    return this.admin.probeWrite();
  }

  /** See importEvents: `gatehouse storage copy`'s write side, all or nothing, into an empty schema. */
  importAll(
    batches: AsyncIterable<ExportedEvent[]>,
    alsoInTransaction?: (client: pg.PoolClient) => Promise<void>,
  ): Promise<CopyCounts> {
    return importEvents(this.pool, this.storage, this.notifier, batches, alsoInTransaction);
  }

  /** The pool, for an integration's own tables (created by the migrations). */
  get database(): pg.Pool {
    return this.pool;
  }

  /** Commits the accepts and attempt records still waiting, then closes every connection. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.accepts.drain();
    await this.settles.idle();
    // Fresh events no deliverer took: their leases are freed, so another instance delivers them now, not once they run out.
    await this.claims.freeUntaken();
    await this.notifier.close();
    await this.admin.cancelCount();
    await this.pool.end();
  }
}
