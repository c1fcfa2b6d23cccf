import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import type { Logger } from 'pino';
import { webhookActions, type PostgresStorageConfig, type WebhookAction } from '../../config/schema.js';
import { UsageError } from '../../errors.js';
import {
  DeliveredCounts, IDEMPOTENCY_WINDOW_MS, lastErrorOf, newEventId, toEvent,
  type AcceptResult, type EventRow as SharedEventRow, type AttemptOutcome, type AttemptRecord, type ClaimedEvent, type CopyCounts, type DeliveryStatus, type EventStore, type ExportedEvent, type NewEvent, type QueueStats, type StoreStatus, type StoredEvent,
} from '../contracts/events.js';
import { PostgresListener } from './listener.js';
import { openMigratedPool, schemaVersion } from './migrations.js';
import { describeUrl, inTransaction, isRetryableTransactionError, withClient } from './pool.js';

/** NOTIFY channel: "an event may be due" (accepted, requeued). The payload is the sending store's owner id. */
const DUE_CHANNEL = 'gatehouse_events_due';
/** Convoy batches 64 rows; gatehouse's SQLite driver takes a whole tick. A bound keeps one statement's parameters sane. */
const MAX_BATCH = 500;
const BATCH_TRIES = 3;
/** Events accepted here and leased to this process's deliverer in their INSERT, waiting in memory (see `fresh`). */
const MAX_FRESH_EVENTS = 5_000;
const MAX_FRESH_BYTES = 32 * 1024 * 1024;
/** A fresh event is handed out as it is while this much of its lease is left (the deliverer renews at half); else its lease is extended first. */
const FRESH_LEASE_LEFT = 0.75;
/**
 * How often a deliverer with nothing known to be waiting in the database still looks there: for
 * what no one announces (another instance's lease that ran out, its retries coming due).
 */
const DB_LOOK_MS = 1_000;
/** Accepts are leased to this process's deliverer only while it has claimed their action this recently. */
const CLAIMING_RECENTLY_MS = 10_000;
/**
 * An action's fresh queue holds at most what its deliverer takes in this long (at its recent
 * rate), and never less than FRESH_MIN_EVENTS: accepts beyond that go to the database unleased
 * (and are announced), so other instances take them instead of waiting out this one's leases
 * behind a slow target, and an instance that dies strands little.
 */
const FRESH_AHEAD_MS = 2_000;
const FRESH_MIN_EVENTS = 64;
/** The longest a recount of the delivered events (for /metrics, in the background) is waited for. */
const DELIVERED_COUNT_TIMEOUT_MS = 10 * 60_000;

/**
 * A claim of up to $5 events of action $4 due by $6 (≤ $1, the time now; lease $2 ms, owner $3), and, when it comes
 * back short, when this action next has something to claim: the earliest future attempt or the
 * earliest lease to run out, as the rows were before this statement's own claim. Unleased rows
 * (events_free, walked in claim order) and expired leases (events_leased) are looked up apart,
 * so neither a backlog nor other instances' leased rows are read beyond the LIMIT. Exported for
 * the test that checks its plan.
 */
export const CLAIM_DUE_SQL = `WITH free AS (
     SELECT id, next_attempt_at FROM events
      WHERE status = 'queued' AND lease_until IS NULL AND action = $4 AND next_attempt_at <= $6::bigint
      ORDER BY next_attempt_at, id
      LIMIT $5
      FOR UPDATE SKIP LOCKED),
   expired AS (
     SELECT id, next_attempt_at FROM events
      WHERE status = 'queued' AND lease_until <= $1::bigint AND action = $4 AND next_attempt_at <= $6::bigint
      ORDER BY lease_until
      LIMIT $5
      FOR UPDATE SKIP LOCKED),
   due AS (
     SELECT id FROM (SELECT * FROM free UNION ALL SELECT * FROM expired) c
      ORDER BY next_attempt_at, id
      LIMIT $5),
   claimed AS (
     UPDATE events e SET lease_until = $1::bigint + $2::bigint, claim_id = gen_random_uuid(), lease_owner = $3
       FROM due WHERE e.id = due.id
     RETURNING e.*)
   SELECT c.*, n.next_look FROM (
     SELECT CASE WHEN (SELECT count(*) FROM due) < $5 THEN least(
       (SELECT min(next_attempt_at) FROM events WHERE status = 'queued' AND lease_until IS NULL AND action = $4 AND next_attempt_at > $1::bigint),
       (SELECT min(lease_until) FROM events WHERE status = 'queued' AND lease_until > $1::bigint)) END AS next_look) n
   LEFT JOIN claimed c ON true`;

/**
 * Queued and dead events per action, for each scrape (queueStats): unleased and leased ones apart
 * so each part takes its index (events_free, events_leased, events_dead), reading as many rows as
 * there are, not the delivered ones. Exported for the test that checks its plan.
 */
export const UNDELIVERED_COUNTS_SQL = `SELECT action, status, sum(n)::bigint AS n FROM (
     SELECT action, 'queued' AS status, count(*) AS n FROM events WHERE status = 'queued' AND lease_until IS NULL GROUP BY action
     UNION ALL SELECT action, 'queued', count(*) FROM events WHERE status = 'queued' AND lease_until IS NOT NULL GROUP BY action
     UNION ALL SELECT action, 'dead', count(*) FROM events WHERE status = 'dead' GROUP BY action) c
   GROUP BY action, status`;

/** The earliest attempt time of any unleased queued event, the actions in `actions` (a text[] placeholder): one step into events_free per action. */
const oldestUnleasedSql = (actions: string) => `(SELECT min(f.at) FROM unnest(${actions}::text[]) AS a(action)
   CROSS JOIN LATERAL (SELECT min(next_attempt_at) AS at FROM events WHERE status = 'queued' AND lease_until IS NULL AND action = a.action) f)`;

/** The shared row, plus the lease columns only this driver has. */
interface EventRow extends SharedEventRow {
  lease_until: number | null;
  claim_id: string | null;
}

interface PendingAccept {
  event: NewEvent;
  /** Assigned on first sight, kept across a retried batch (the envelope is built with it). */
  id: string;
  envelope?: string;
  /** Leased to this process's deliverer by the INSERT itself (it goes to `fresh` once committed). */
  lease?: { claimId: string; until: number };
  resolve: (result: AcceptResult) => void;
  reject: (err: unknown) => void;
}

interface PendingSettle {
  id: string;
  attempt: AttemptRecord;
  outcome: AttemptOutcome;
  claimId: string | undefined;
  resolve: (recorded: boolean) => void;
  reject: (err: unknown) => void;
}

type Decision = { kind: 'duplicate'; id: string } | { kind: 'failed'; err: unknown } | { kind: 'insert'; forget?: string } | { kind: 'same-as'; index: number };

export interface PostgresEventStoreOptions {
  logger?: Pick<Logger, 'warn' | 'info' | 'error'>;
  /** Apply pending migrations (the server, `storage migrate`); otherwise refuse an unmigrated database (the CLI). */
  migrate?: boolean;
  /** LISTEN for other processes' accepts (servers); the CLI only NOTIFYs. */
  listen?: boolean;
}

/**
 * PostgreSQL store, shared by any number of gatehouse processes.
 *
 * - Accept: group commit. The accepts waiting when a batch starts share one transaction: one
 *   lookup of their delivery ids and replay keys, multi-row inserts with ON CONFLICT on the
 *   unique (endpoint, idempotency_key) and (endpoint, replay_key), so two instances accepting
 *   the same delivery at once store it once. Each accept resolves after COMMIT; a NOTIFY
 *   (coalesced) then wakes the other instances' deliverers.
 * - Deliver: claims are leases (`lease_until`) with a fresh fencing token (`claim_id`), taken
 *   with FOR UPDATE SKIP LOCKED so concurrent claimers never get the same row; outcomes and
 *   renewals apply only while the token matches; an expired lease is claimable again.
 * - Events accepted here are leased to this process's deliverer by their INSERT (once it has
 *   claimed that action, so its lease time is known) and handed to it from memory: no claim
 *   query, no envelope read back, no NOTIFY (no one else could take them). If this process dies
 *   they are claimable once the lease runs out, as any claim. The database is asked for other
 *   work when something says it is there (an unleased accept, another instance's NOTIFY, a
 *   requeue, a retry coming due) and at least every DB_LOOK_MS.
 * - Postgres down: every call rejects (the receiver answers 503, the deliverer pauses); the
 *   pool opens fresh connections once it is back.
 */
export class PostgresEventStore implements EventStore {
  /** This process's leases are tagged with it, so releaseLeases frees its own and no one else's. */
  private readonly owner = randomUUID();
  private pending: PendingAccept[] = [];
  private flushScheduled = false;
  private flushing: Promise<void> | undefined;
  private closed = false;
  private listener: PostgresListener | undefined;
  private readonly wakers = new Set<() => void>();
  private notifying = false;
  private pendingSettles: PendingSettle[] = [];
  private settling: Promise<void> | undefined;
  private notifyAgain = false;
  /** Accepted here, leased to this process by the INSERT, not yet handed to the deliverer (per action, oldest first). */
  private readonly fresh = new Map<WebhookAction, ClaimedEvent[]>();
  private freshCount = 0;
  private freshBytes = 0;
  /** The lease each action's deliverer asks for, from its first claim: only those actions' accepts are leased on insert. */
  private readonly leaseMsByAction = new Map<WebhookAction, number>();
  /** When (this machine's clock) each action was last claimed: leasing accepts stops for one no longer claimed. */
  private readonly lastClaimAt = new Map<WebhookAction, number>();
  /** Actions whose claimable events in the database may include some this process has not looked for. */
  private readonly dbMayHaveDue = new Set<WebhookAction>(webhookActions);
  /** Per action, when something in the database next becomes claimable, as far as this process knows (a retry due, a lease running out). */
  private readonly nextDbLookAt = new Map<WebhookAction, number>();
  /** Per action, the last time the database was asked (it is asked again DB_LOOK_MS later in any case). */
  private readonly lastDbLookAt = new Map<WebhookAction, number>();
  /** Per action, how many events its deliverer took per second lately (a moving average over one-second windows). */
  private readonly takeRate = new Map<WebhookAction, { since: number; taken: number; perSecond: number }>();
  private readonly delivered = new DeliveredCounts(
    () => this.countDelivered(),
    (err) => this.closed || this.options.logger?.warn({ err: (err as Error).message }, 'metrics: could not count the delivered events; the last count stands'),
  );
  /** The backend pid of the connection counting delivered events, while it does (close() cancels it). */
  private countingBackend: number | undefined;

  private constructor(
    private readonly pool: pg.Pool,
    private readonly storage: PostgresStorageConfig,
    private readonly options: PostgresEventStoreOptions,
  ) {}

  /** Connects, and migrates (or checks the schema version); rejects when Postgres cannot be reached. */
  static async open(storage: PostgresStorageConfig, options: PostgresEventStoreOptions = {}): Promise<PostgresEventStore> {
    // Migrated, or refused with what to run when the schema is missing, behind or newer (a CLI).
    const pool = await openMigratedPool(storage, options);
    const store = new PostgresEventStore(pool, storage, options);
    // Its own accepts woke this process's deliverer already (onAccepted): only others' wake it again.
    if (options.listen) store.listener = new PostgresListener(storage.url, DUE_CHANNEL, (sender) => sender !== store.owner && store.wake(), options.logger);
    return store;
  }

  accept(event: NewEvent): Promise<AcceptResult> {
    if (this.closed) return Promise.reject(new Error('the event store is closed'));
    return new Promise<AcceptResult>((resolve, reject) => {
      this.pending.push({ event, id: newEventId(event.receivedAt), resolve, reject });
      if (!this.flushScheduled && !this.flushing) {
        this.flushScheduled = true;
        setImmediate(() => void this.flush());
      }
    });
  }

  /** One batch at a time; accepts arriving meanwhile wait for the next, and so share it. */
  private async flush(): Promise<void> {
    this.flushScheduled = false;
    const run = async () => {
      while (this.pending.length > 0) await this.commitBatch(this.pending.splice(0, MAX_BATCH));
    };
    const done = run();
    this.flushing = done;
    await done;
    if (this.flushing === done) this.flushing = undefined;
    // An accept that came while this one was finishing saw it running and waits for the next.
    if (this.pending.length > 0 && !this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(() => void this.flush());
    }
  }

  private async commitBatch(batch: PendingAccept[]): Promise<void> {
    this.leaseForDeliverer(batch);
    for (let attempt = 1; ; attempt++) {
      let outcome: (AcceptResult | { err: unknown })[];
      try {
        // No delivery id or replay key in the batch: its only statement is the insert, which commits
        // on its own (one round trip, not BEGIN/INSERT/COMMIT: measured as the ingest's main wait).
        const insertOnly = batch.every((p) => p.event.idempotencyKey === undefined && p.event.replayKey === undefined);
        outcome = insertOnly
          ? await this.acceptInTransaction(this.pool, batch)
          : await inTransaction(this.pool, (client) => this.acceptInTransaction(client, batch));
      } catch (err) {
        // Deadlock between two instances' batches (keys locked in different orders): run it again.
        if (attempt < BATCH_TRIES && isRetryableTransactionError(err)) continue;
        for (const p of batch) p.reject(err); // not committed: nothing in the batch is stored
        return;
      }
      let storedUnleased = false;
      batch.forEach((p, i) => {
        const result = outcome[i]!;
        if ('err' in result) return p.reject(result.err);
        if (!result.duplicate) {
          if (p.lease) this.handOver(p, p.lease);
          else {
            storedUnleased = true;
            this.dbMayHaveDue.add(p.event.action);
          }
        }
        p.resolve(result);
      });
      // Only unleased events are anyone else's business; this process's deliverer is woken by the receiver.
      if (storedUnleased) this.notifyDue();
      return;
    }
  }

  /**
   * Leases the batch's events, while the fresh queue has room, to this process's deliverer of
   * their action, if it is claiming that action (it claimed lately: not after a reload took the
   * action's target away, nor while a slow target keeps every slot busy for long).
   */
  private leaseForDeliverer(batch: PendingAccept[]): void {
    const now = Date.now();
    for (const [action, at] of this.lastClaimAt) {
      if (now - at < CLAIMING_RECENTLY_MS) continue;
      this.leaseMsByAction.delete(action);
      this.lastClaimAt.delete(action);
      // Freed, so that any instance claims them now (not once their leases run out).
      const dropped = this.fresh.get(action) ?? [];
      for (const event of dropped) {
        this.freshCount--;
        this.freshBytes -= event.envelope.length;
      }
      this.fresh.delete(action);
      void this.freeLeases(dropped);
    }
    let room = MAX_FRESH_EVENTS - this.freshCount;
    let bytes = MAX_FRESH_BYTES - this.freshBytes;
    const actionRoom = new Map<WebhookAction, number>();
    for (const p of batch) {
      const { action } = p.event;
      const leaseMs = this.leaseMsByAction.get(action);
      if (p.lease || leaseMs === undefined || room <= 0) continue; // a retried batch keeps its leases
      const left = actionRoom.get(action) ?? this.freshRoom(action);
      if (left <= 0) continue;
      try {
        p.envelope ??= p.event.envelope(p.id);
      } catch {
        continue; // deciding the batch fails this one alone
      }
      if (p.envelope.length > bytes) continue;
      p.lease = { claimId: randomUUID(), until: p.event.receivedAt + leaseMs }; // from receipt: the clock the deliverer's `now` shares
      actionRoom.set(action, left - 1);
      room--;
      bytes -= p.envelope.length;
    }
  }

  /** How many more accepts of `action` its fresh queue takes: FRESH_AHEAD_MS of its deliverer's recent rate, at least FRESH_MIN_EVENTS. */
  private freshRoom(action: WebhookAction): number {
    const perSecond = this.takeRate.get(action)?.perSecond ?? 0;
    const cap = Math.max(FRESH_MIN_EVENTS, Math.ceil((perSecond * FRESH_AHEAD_MS) / 1000));
    return cap - (this.fresh.get(action)?.length ?? 0);
  }

  /** Counts what the deliverer of `action` took, for its rate (one-second windows, each weighing half). */
  private noteTaken(action: WebhookAction, count: number, now: number): void {
    const rate = this.takeRate.get(action) ?? { since: now, taken: 0, perSecond: 0 };
    this.takeRate.set(action, rate);
    rate.taken += count;
    const elapsed = now - rate.since;
    if (elapsed < 1_000) return;
    rate.perSecond = (rate.perSecond + (rate.taken * 1_000) / elapsed) / 2;
    rate.since = now;
    rate.taken = 0;
  }

  /** A committed event leased to this process: its deliverer takes it from memory. */
  private handOver(p: PendingAccept, lease: { claimId: string; until: number }): void {
    const { event } = p;
    const queue = this.fresh.get(event.action) ?? [];
    this.fresh.set(event.action, queue);
    queue.push({
      id: p.id, endpoint: event.endpoint, action: event.action, idempotencyKey: event.idempotencyKey ?? null, receivedAt: event.receivedAt,
      envelope: p.envelope!, status: 'queued', attempts: 0, roundAttempts: 0, nextAttemptAt: event.receivedAt, lastError: null, deliveredAt: null,
      claimId: lease.claimId, leaseUntil: lease.until,
    });
    this.freshCount++;
    this.freshBytes += p.envelope!.length;
  }

  /** The batch's statements, on `client` in a transaction (or on the pool when the batch needs only the insert). */
  private async acceptInTransaction(client: pg.PoolClient | pg.Pool, batch: PendingAccept[]): Promise<(AcceptResult | { err: unknown })[]> {
    // 1. What is already on file: delivery ids and replay keys of the batch, in one round trip.
    const keyed = batch.flatMap((p, i) => (p.event.idempotencyKey !== undefined ? [{ i, endpoint: p.event.endpoint, key: p.event.idempotencyKey }] : []));
    const replays = batch.flatMap((p, i) => (p.event.replayKey !== undefined ? [{ i, endpoint: p.event.endpoint, key: p.event.replayKey }] : []));
    const seenKey = new Map<number, { id: string; receivedAt: number }>();
    const seenReplay = new Map<number, string>();
    if (keyed.length + replays.length > 0) {
      const { rows } = await client.query<{ kind: 'key' | 'replay'; i: number; id: string; received_at: number }>(
        `SELECT 'key' AS kind, b.i, e.id, e.received_at
           FROM unnest($1::int[], $2::text[], $3::text[]) AS b(i, endpoint, key)
           JOIN events e ON e.endpoint = b.endpoint AND e.idempotency_key = b.key
         UNION ALL
         SELECT 'replay', b.i, r.event_id, 0
           FROM unnest($4::int[], $5::text[], $6::text[]) AS b(i, endpoint, key)
           JOIN event_replay_keys r ON r.endpoint = b.endpoint AND r.replay_key = b.key`,
        [keyed.map((k) => k.i), keyed.map((k) => k.endpoint), keyed.map((k) => k.key), replays.map((k) => k.i), replays.map((k) => k.endpoint), replays.map((k) => k.key)],
      );
      for (const row of rows) {
        if (row.kind === 'key') seenKey.set(row.i, { id: row.id, receivedAt: row.received_at });
        else seenReplay.set(row.i, row.id);
      }
    }

    // 2. Decide each, as the SQLite driver does: a delivery id inside the window, then a replay key; repeats inside the batch follow their first.
    const firstWithKey = new Map<string, number>();
    const firstWithReplay = new Map<string, number>();
    const decisions: Decision[] = batch.map((p, i) => {
      const { event } = p;
      const seen = seenKey.get(i);
      if (seen && seen.receivedAt > event.receivedAt - IDEMPOTENCY_WINDOW_MS) return { kind: 'duplicate', id: seen.id };
      const replayed = seenReplay.get(i);
      if (replayed !== undefined) return { kind: 'duplicate', id: replayed };
      const keyId = event.idempotencyKey !== undefined ? JSON.stringify([event.endpoint, event.idempotencyKey]) : undefined;
      const replayId = event.replayKey !== undefined ? JSON.stringify([event.endpoint, event.replayKey]) : undefined;
      const earlier = (keyId !== undefined ? firstWithKey.get(keyId) : undefined) ?? (replayId !== undefined ? firstWithReplay.get(replayId) : undefined);
      if (earlier !== undefined) return { kind: 'same-as', index: earlier };
      try {
        p.envelope ??= event.envelope(p.id); // only for an event to be stored; a throw fails it alone
      } catch (err) {
        return { kind: 'failed', err };
      }
      if (keyId !== undefined) firstWithKey.set(keyId, i);
      if (replayId !== undefined) firstWithReplay.set(replayId, i);
      return { kind: 'insert', forget: seen?.id };
    });

    // 3. Delivery ids past their window are forgotten by the event that reuses them.
    const forget = decisions.flatMap((d) => (d.kind === 'insert' && d.forget !== undefined ? [d.forget] : []));
    if (forget.length > 0) await client.query('UPDATE events SET idempotency_key = NULL WHERE id = ANY($1::text[])', [forget]);

    // 4. One multi-row insert. Sorted by key, so two instances' batches lock keys in one order.
    const inserts = batch.map((p, i) => ({ p, i })).filter(({ i }) => decisions[i]!.kind === 'insert')
      .sort((a, b) => compareKeys(a.p.event, b.p.event));
    const inserted = new Set<string>();
    if (inserts.length > 0) {
      const { rows } = await client.query<{ id: string }>(
        `INSERT INTO events (id, endpoint, action, idempotency_key, received_at, envelope, status, next_attempt_at, lease_until, claim_id, lease_owner)
         SELECT id, endpoint, action, key, received_at, envelope, 'queued', received_at, lease_until, claim_id, CASE WHEN claim_id IS NULL THEN NULL ELSE $9 END
           FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::bigint[], $8::uuid[])
             AS t(id, endpoint, action, key, received_at, envelope, lease_until, claim_id)
         ON CONFLICT (endpoint, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
         RETURNING id`,
        [
          inserts.map(({ p }) => p.id), inserts.map(({ p }) => p.event.endpoint), inserts.map(({ p }) => p.event.action),
          inserts.map(({ p }) => p.event.idempotencyKey ?? null), inserts.map(({ p }) => p.event.receivedAt), inserts.map(({ p }) => p.envelope!),
          inserts.map(({ p }) => p.lease?.until ?? null), inserts.map(({ p }) => p.lease?.claimId ?? null), this.owner,
        ],
      );
      for (const row of rows) inserted.add(row.id);
    }

    // 5. Replay keys of the stored events; one another instance stored meanwhile makes ours a duplicate.
    const withReplay = inserts.filter(({ p }) => inserted.has(p.id) && p.event.replayKey !== undefined);
    const replayStored = new Set<string>();
    if (withReplay.length > 0) {
      const { rows } = await client.query<{ event_id: string }>(
        `INSERT INTO event_replay_keys (endpoint, replay_key, event_id)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[])
         ON CONFLICT (endpoint, replay_key) DO NOTHING
         RETURNING event_id`,
        [withReplay.map(({ p }) => p.event.endpoint), withReplay.map(({ p }) => p.event.replayKey!), withReplay.map(({ p }) => p.id)],
      );
      for (const row of rows) replayStored.add(row.event_id);
      const beaten = withReplay.filter(({ p }) => !replayStored.has(p.id)).map(({ p }) => p.id);
      if (beaten.length > 0) {
        await client.query('DELETE FROM events WHERE id = ANY($1::text[])', [beaten]);
        for (const id of beaten) inserted.delete(id);
      }
    }

    // 6. Those another instance won: the winner committed (ON CONFLICT waited for it), so this statement sees it.
    const lost = inserts.filter(({ p }) => !inserted.has(p.id));
    const winners = new Map<number, string>();
    if (lost.length > 0) {
      const { rows } = await client.query<{ i: number; id: string }>(
        `SELECT b.i, coalesce(r.event_id, e.id) AS id
           FROM unnest($1::int[], $2::text[], $3::text[], $4::text[]) AS b(i, endpoint, key, replay)
           LEFT JOIN event_replay_keys r ON r.endpoint = b.endpoint AND r.replay_key = b.replay
           LEFT JOIN events e ON e.endpoint = b.endpoint AND e.idempotency_key = b.key`,
        [lost.map(({ i }) => i), lost.map(({ p }) => p.event.endpoint), lost.map(({ p }) => p.event.idempotencyKey ?? null), lost.map(({ p }) => p.event.replayKey ?? null)],
      );
      for (const row of rows) if (row.id !== null) winners.set(row.i, row.id);
      // Not found: the winner vanished in between (purged). Running the batch again decides afresh.
      if (winners.size < lost.length) throw Object.assign(new Error('a concurrent duplicate vanished; retrying the batch'), { code: '40001' });
    }

    const results: (AcceptResult | { err: unknown })[] = [];
    decisions.forEach((d, i) => {
      if (d.kind === 'duplicate') results.push({ id: d.id, duplicate: true });
      else if (d.kind === 'failed') results.push({ err: d.err });
      else if (d.kind === 'same-as') results.push({ id: (results[d.index] as AcceptResult).id, duplicate: true });
      else if (winners.has(i)) results.push({ id: winners.get(i)!, duplicate: true });
      else results.push({ id: batch[i]!.id, duplicate: false });
    });
    return results;
  }

  /**
   * Up to `limit` due events of `action`, oldest first, from this process's fresh queue and, when
   * a look is due (dbLookDue), from the database: what the database gives joins the queue in its
   * place by due time, so a retry or a dead instance's expired lease is not kept waiting behind
   * newer accepts.
   */
  async claimDue(now: number, limit: number, leaseMs: number, action: WebhookAction): Promise<ClaimedEvent[]> {
    this.leaseMsByAction.set(action, leaseMs);
    this.lastClaimAt.set(action, Date.now());
    const queue = this.fresh.get(action);
    const freshDue = queue !== undefined && queue.length > 0 && queue[0]!.nextAttemptAt <= now;
    if (this.dbLookDue(action, now, freshDue)) {
      try {
        await this.lookInDb(now, limit, leaseMs, action, dueBefore(queue ?? [], now, limit));
      } catch (err) {
        this.dbMayHaveDue.add(action);
        if (!freshDue) throw err;
        // The fresh events are leased already: handed out now, the database asked again next time.
      }
    }
    const taken = await this.takeFresh(now, limit, leaseMs, action);
    this.noteTaken(action, taken.length, Date.now());
    return taken;
  }

  /**
   * Whether claimDue asks the database: once DB_LOOK_MS has passed since it last did, when a retry
   * or a lease is known to come due, and when something says the database has more (an unleased
   * accept, another instance's NOTIFY, a full answer) unless this action's fresh events are due
   * already. Then what others announce waits for the next look (DB_LOOK_MS at most), so an
   * instance busy with its own accepts does not query per claim, while its retries and expired
   * leases are found on time.
   */
  private dbLookDue(action: WebhookAction, now: number, freshDue: boolean): boolean {
    const lastLook = this.lastDbLookAt.get(action);
    if (lastLook === undefined || now < lastLook || now >= lastLook + DB_LOOK_MS) return true;
    if (now >= (this.nextDbLookAt.get(action) ?? Infinity)) return true;
    return !freshDue && this.dbMayHaveDue.has(action);
  }

  /**
   * Claims up to `limit` of the action's events due by `dueBy` in the database into its fresh
   * queue, and learns when to look next. `dueBy` is before `now` when the fresh queue holds
   * `limit` due events already: only what goes ahead of those is claimed, so all of it is handed
   * out at once, never held here under this instance's lease while others could deliver it.
   */
  private async lookInDb(now: number, limit: number, leaseMs: number, action: WebhookAction, dueBy: number): Promise<void> {
    // Cleared before the query: whatever says "look again" while it runs stays said.
    this.dbMayHaveDue.delete(action);
    this.lastDbLookAt.set(action, now);
    const knownBefore = this.nextDbLookAt.get(action);
    const { rows } = await this.pool.query<EventRow & { next_look: number | null }>(CLAIM_DUE_SQL, [now, leaseMs, this.owner, action, limit, dueBy]);
    const fromDb = rows.filter((row) => row.id !== null);
    if (fromDb.length === limit) this.dbMayHaveDue.add(action); // a full answer may have left more behind
    else if (dueBy < now) {
      // Short within the bound: what is due after it waits its turn behind the fresh events (looked for once they are not enough, or in DB_LOOK_MS).
      this.dbMayHaveDue.add(action);
      this.nextDbLookAt.delete(action);
    } else {
      // The statement's answer, its own new leases, and a retry recorded while it ran (its snapshot missed that one).
      const setMeanwhile = this.nextDbLookAt.get(action) !== knownBefore ? (this.nextDbLookAt.get(action) ?? Infinity) : Infinity;
      const nextLook = Math.min(rows[0]?.next_look ?? Infinity, fromDb.length > 0 ? now + leaseMs : Infinity, setMeanwhile);
      if (nextLook === Infinity) this.nextDbLookAt.delete(action);
      else this.nextDbLookAt.set(action, nextLook);
    }
    if (fromDb.length === 0) return;
    const queue = this.fresh.get(action) ?? [];
    this.fresh.set(action, queue);
    for (const row of fromDb) {
      const event: ClaimedEvent = { ...toEvent(row), claimId: row.claim_id!, leaseUntil: row.lease_until! };
      queue.splice(dueOrderIndex(queue, event), 0, event);
      this.freshCount++;
      this.freshBytes += event.envelope.length;
    }
  }

  /**
   * Up to `limit` of this action's fresh events, oldest first. One with most of its lease left is
   * handed out as it is; an older one has its lease extended first, under its token (one statement
   * for all of them), and is dropped if the token no longer matches: its lease ran out and another
   * claim took it.
   */
  private async takeFresh(now: number, limit: number, leaseMs: number, action: WebhookAction): Promise<ClaimedEvent[]> {
    const queue = this.fresh.get(action);
    if (!queue?.length) return [];
    const taken: ClaimedEvent[] = [];
    const notDue: ClaimedEvent[] = []; // accepted with a receipt time still ahead (a clock set by a test)
    let i = 0;
    for (; i < queue.length && taken.length < limit; i++) (queue[i]!.nextAttemptAt <= now ? taken : notDue).push(queue[i]!);
    queue.splice(0, i, ...notDue);
    this.freshCount -= taken.length;
    for (const event of taken) this.freshBytes -= event.envelope.length;
    const ready = taken.filter((e) => e.leaseUntil - now >= FRESH_LEASE_LEFT * leaseMs);
    if (ready.length === taken.length) return ready;
    const old = taken.filter((e) => e.leaseUntil - now < FRESH_LEASE_LEFT * leaseMs);
    const until = now + leaseMs;
    let held: Set<string>;
    try {
      const { rows } = await this.pool.query<{ id: string }>(
        `UPDATE events e SET lease_until = $3::bigint
           FROM unnest($1::text[], $2::uuid[]) AS f(id, claim_id)
          WHERE e.id = f.id AND e.claim_id = f.claim_id AND e.status = 'queued'
          RETURNING e.id`,
        [old.map((e) => e.id), old.map((e) => e.claimId), until],
      );
      held = new Set(rows.map((r) => r.id));
    } catch (err) {
      // Not extended (Postgres unreachable): back at the head of the queue, tried again next time,
      // unless the queue was dropped meanwhile (then left to their leases, as the rest of it).
      if (this.fresh.get(action) === queue) {
        queue.unshift(...old);
        this.freshCount += old.length;
        for (const event of old) this.freshBytes += event.envelope.length;
      }
      if (ready.length === 0) throw err; // the deliverer pauses, as on any failed claim
      return ready;
    }
    return [...ready, ...old.filter((e) => held.has(e.id)).map((e) => ({ ...e, leaseUntil: until }))];
  }

  /**
   * Group-settled, as accepts are group-committed: the attempts recorded while one settle batch
   * runs share the next (one statement: the events settled under their claims, their attempt rows
   * beside them). A batch that fails (a repeated attempt number, a deadlock) is run again one by
   * one, so one bad record fails alone. Measured: one round trip and one WAL flush per attempt
   * took the pool from the ingest path under load (bench "webhook ingest (postgres)").
   */
  recordAttempt(id: string, attempt: AttemptRecord, outcome: AttemptOutcome, claimId?: string): Promise<boolean> {
    if (this.closed) return Promise.reject(new Error('the event store is closed'));
    // A retry comes due in the database: the deliverer looks there then (its action is not at hand: each that claims).
    if (outcome.status === 'queued') {
      for (const action of this.leaseMsByAction.keys()) this.nextDbLookAt.set(action, Math.min(this.nextDbLookAt.get(action) ?? Infinity, outcome.nextAttemptAt));
    }
    return new Promise<boolean>((resolve, reject) => {
      this.pendingSettles.push({ id, attempt, outcome, claimId, resolve, reject });
      if (!this.settling) this.settling = this.flushSettles();
    });
  }

  private async flushSettles(): Promise<void> {
    await new Promise<void>((resolve) => setImmediate(resolve)); // the attempts of this turn share the batch
    while (this.pendingSettles.length > 0) {
      // One row per event in a statement (an UPDATE … FROM meets each row once): a repeat waits for the next.
      const batch: PendingSettle[] = [];
      const later: PendingSettle[] = [];
      const ids = new Set<string>();
      for (const p of this.pendingSettles) {
        if (batch.length < MAX_BATCH && !ids.has(p.id)) {
          ids.add(p.id);
          batch.push(p);
        } else later.push(p);
      }
      this.pendingSettles = later;
      try {
        const settled = await this.settle(batch);
        for (const p of batch) p.resolve(settled.has(p.id));
      } catch (err) {
        if (batch.length === 1) batch[0]!.reject(err);
        else await Promise.all(batch.map((p) => this.settle([p]).then((settled) => p.resolve(settled.has(p.id)), p.reject)));
      }
    }
    this.settling = undefined;
  }

  /** One statement: settles each event still under its claim (or unconditionally without one) and inserts its attempt row. */
  private async settle(batch: PendingSettle[]): Promise<Set<string>> {
    // Sorted by id: two instances' batches lock their rows in one order.
    const rows = [...batch].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
    const { rows: settled } = await this.pool.query<{ event_id: string }>(
      `WITH input AS (
         SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::uuid[], $7::int[], $8::bigint[], $9::int[], $10::text[], $11::int[])
           AS t(id, status, next_attempt_at, last_error, delivered_at, claim_id, attempt, at, http_status, error, duration_ms)),
       settled AS (
         UPDATE events e
            SET status = i.status, attempts = e.attempts + 1, round_attempts = e.round_attempts + 1, next_attempt_at = i.next_attempt_at,
                last_error = i.last_error, delivered_at = i.delivered_at, lease_until = NULL, claim_id = NULL, lease_owner = NULL
           FROM input i
          WHERE e.id = i.id AND (i.claim_id IS NULL OR e.claim_id = i.claim_id)
          RETURNING e.id)
       INSERT INTO attempts (event_id, attempt, at, status, error, duration_ms)
       SELECT i.id, i.attempt, i.at, i.http_status, i.error, i.duration_ms FROM input i JOIN settled s ON s.id = i.id
       RETURNING event_id`,
      [
        rows.map((r) => r.id), rows.map((r) => r.outcome.status), rows.map((r) => (r.outcome.status === 'queued' ? r.outcome.nextAttemptAt : 0)),
        rows.map((r) => lastErrorOf(r.attempt, r.outcome)), rows.map((r) => (r.outcome.status === 'delivered' ? r.attempt.at + Math.round(r.attempt.durationMs) : null)),
        rows.map((r) => r.claimId ?? null), rows.map((r) => r.attempt.attempt), rows.map((r) => r.attempt.at), rows.map((r) => r.attempt.status),
        rows.map((r) => r.attempt.error), rows.map((r) => Math.round(r.attempt.durationMs)),
      ],
    );
    return new Set(settled.map((r) => r.event_id));
  }

  async renewLease(id: string, claimId: string, leaseUntil: number): Promise<boolean> {
    const { rowCount } = await this.pool.query(
      "UPDATE events SET lease_until = $3::bigint WHERE id = $1 AND claim_id = $2::uuid AND status = 'queued'",
      [id, claimId, leaseUntil],
    );
    return rowCount === 1;
  }

  async releaseLeases(): Promise<number> {
    // The fresh events' leases go too: they are claimed from the database like any other.
    this.dropFresh();
    const { rowCount } = await this.pool.query('UPDATE events SET lease_until = NULL, claim_id = NULL, lease_owner = NULL WHERE lease_owner = $1', [this.owner]);
    for (const action of webhookActions) this.dbMayHaveDue.add(action);
    if (rowCount) this.notifyDue(); // claimable now: the other instances need not wait for their next look
    return rowCount ?? 0;
  }

  private dropFresh(): ClaimedEvent[] {
    const dropped = [...this.fresh.values()].flat();
    this.fresh.clear();
    this.freshCount = 0;
    this.freshBytes = 0;
    return dropped;
  }

  async nextDueAt(now: number): Promise<number | undefined> {
    // Known without asking: fresh events are due now; else, while nothing says the database has
    // more, the earliest time claimDue learnt (or a retry of ours set) for the actions it claims.
    const claiming = [...this.leaseMsByAction.keys()];
    if (claiming.some((action) => this.fresh.get(action)?.some((e) => e.nextAttemptAt <= now))) return now;
    if (claiming.length > 0 && claiming.every((action) => !this.dbMayHaveDue.has(action))) {
      const known = Math.min(...claiming.flatMap((action) => [this.nextDbLookAt.get(action) ?? Infinity, ...(this.fresh.get(action) ?? []).map((e) => e.nextAttemptAt)]));
      return known === Infinity ? undefined : known;
    }
    const { rows } = await this.pool.query<{ at: number | null }>(
      `SELECT least(${oldestUnleasedSql('$2')},
                    (SELECT min(next_attempt_at) FROM events WHERE status = 'queued' AND lease_until <= $1::bigint),
                    (SELECT min(lease_until) FROM events WHERE status = 'queued' AND lease_until > $1::bigint)) AS at`,
      [now, webhookActions],
    );
    return rows[0]!.at ?? undefined;
  }

  onDue(wake: () => void): () => void {
    this.wakers.add(wake);
    return () => this.wakers.delete(wake);
  }

  /** Something may be claimable in the database (another instance's accept, a requeue): claimDue asks it again. */
  private wake(): void {
    for (const action of webhookActions) this.dbMayHaveDue.add(action);
    for (const wake of this.wakers) wake();
  }

  /** Requeued by this process: its own deliverer (the NOTIFY skips it) and the others'. */
  private requeued(): void {
    this.wake();
    this.notifyDue();
  }

  /** Sent after COMMIT; one at a time, and commits meanwhile share the next one. Lost ones are covered by polling. */
  private notifyDue(): void {
    if (this.notifying) {
      this.notifyAgain = true;
      return;
    }
    this.notifying = true;
    void this.pool.query('SELECT pg_notify($1, $2)', [DUE_CHANNEL, this.owner]).catch(() => {}).finally(() => {
      this.notifying = false;
      if (this.notifyAgain && !this.closed) {
        this.notifyAgain = false;
        this.notifyDue();
      }
    });
  }

  async list(filter: { status?: DeliveryStatus; endpoint?: string; limit?: number }): Promise<StoredEvent[]> {
    const { rows } = await this.pool.query<EventRow>(
      `SELECT * FROM events
        WHERE ($1::text IS NULL OR status = $1) AND ($2::text IS NULL OR endpoint = $2)
        ORDER BY received_at DESC, id DESC
        LIMIT $3`,
      [filter.status ?? null, filter.endpoint ?? null, filter.limit ?? 100],
    );
    return rows.map(toEvent);
  }

  async get(id: string): Promise<{ event: StoredEvent; attempts: AttemptRecord[] } | undefined> {
    const { rows } = await this.pool.query<EventRow>('SELECT * FROM events WHERE id = $1', [id]);
    if (rows.length === 0) return undefined;
    const attempts = await this.pool.query<{ attempt: number; at: number; status: number | null; error: string | null; duration_ms: number }>(
      'SELECT attempt, at, status, error, duration_ms FROM attempts WHERE event_id = $1 ORDER BY attempt',
      [id],
    );
    return { event: toEvent(rows[0]!), attempts: attempts.rows.map((a) => ({ attempt: a.attempt, at: a.at, status: a.status, error: a.error, durationMs: a.duration_ms })) };
  }

  async requeue(id: string, now: number): Promise<boolean> {
    const { rowCount } = await this.pool.query(
      // A queued event only while it waits for a retry, leased by no one: an attempt under way
      // (even one claimed by an instance whose clock is ahead of this one's) is left to finish.
      `UPDATE events SET status = 'queued', round_attempts = 0, next_attempt_at = $2::bigint, delivered_at = NULL,
              lease_until = NULL, claim_id = NULL, lease_owner = NULL
        WHERE id = $1 AND (status <> 'queued' OR (next_attempt_at > $2::bigint AND lease_until IS NULL))`,
      [id, now],
    );
    if (rowCount) this.requeued();
    return rowCount === 1;
  }

  async requeueDead(now: number): Promise<number> {
    return this.requeueAll("UPDATE events SET status = 'queued', round_attempts = 0, next_attempt_at = $1::bigint WHERE status = 'dead'", now);
  }

  async requeueWaiting(now: number): Promise<number> {
    return this.requeueAll("UPDATE events SET round_attempts = 0, next_attempt_at = $1::bigint WHERE status = 'queued' AND lease_until IS NULL AND next_attempt_at > $1::bigint", now);
  }

  /** One UPDATE (row locks only: the instances keep accepting and claiming the rest) making events due at `now` ($1); wakes the deliverers. */
  private async requeueAll(sql: string, now: number): Promise<number> {
    const { rowCount } = await this.pool.query(sql, [now]);
    if (rowCount) this.requeued();
    return rowCount ?? 0;
  }

  async purgeDelivered(olderThan: number, now: number): Promise<number> {
    const forgotten = now - IDEMPOTENCY_WINDOW_MS;
    let purged = 0;
    // Delivered before the delivery-id window began means received before it too: all of it goes.
    for (;;) {
      // In chunks, each its own short transaction: no long lock over what the servers write.
      const { rowCount } = await this.pool.query(
        "DELETE FROM events WHERE id IN (SELECT id FROM events WHERE status = 'delivered' AND delivered_at < $1::bigint LIMIT 500)",
        [Math.min(olderThan, forgotten)],
      );
      if (!rowCount) break;
      purged += rowCount;
    }
    // Within the window an event stays while its delivery id is remembered: the rows delivered in
    // that last day are walked once, a page at a time from where the last ended (rows kept are
    // not read again by every chunk), and the page's rows that may go are deleted.
    let cursor = { at: forgotten, id: '' };
    while (olderThan > forgotten) {
      const { rows } = await this.pool.query<{ id: string; at: number }>(
        `SELECT id, delivered_at AS at FROM events WHERE status = 'delivered' AND delivered_at < $1::bigint AND (delivered_at, id) > ($2::bigint, $3)
          ORDER BY delivered_at, id LIMIT 500`,
        [olderThan, cursor.at, cursor.id],
      );
      if (rows.length === 0) break;
      const { rowCount } = await this.pool.query(
        "DELETE FROM events WHERE id = ANY($1::text[]) AND status = 'delivered' AND (idempotency_key IS NULL OR received_at <= $2::bigint)",
        [rows.map((r) => r.id), forgotten],
      );
      purged += rowCount ?? 0;
      cursor = rows.at(-1)!;
    }
    return purged;
  }

  async status(now: number): Promise<StoreStatus> {
    const counts: Record<DeliveryStatus, number> = { queued: 0, delivered: 0, dead: 0 };
    const { rows } = await this.pool.query<{ status: DeliveryStatus; n: number }>('SELECT status, count(*) AS n FROM events GROUP BY status');
    for (const row of rows) counts[row.status] = row.n;
    const leased = await this.pool.query<{ n: number }>("SELECT count(*) AS n FROM events WHERE status = 'queued' AND lease_until > $1::bigint", [now]);
    return { driver: 'postgres', location: describeUrl(this.storage.url), schemaVersion: await schemaVersion(this.pool), counts, leased: leased.rows[0]!.n };
  }

  async queueStats(now: number): Promise<QueueStats> {
    const delivered = await this.delivered.get(now); // first: it may wait, and the rest is then read as of the same moment
    const { rows } = await this.pool.query<{ action: WebhookAction; status: DeliveryStatus; n: number }>(UNDELIVERED_COUNTS_SQL);
    const counts = rows.map((row) => ({ action: row.action, status: row.status, events: row.n }));
    for (const [action, events] of delivered ?? []) counts.push({ action, status: 'delivered', events });
    const due = await this.pool.query<{ at: number | null }>(
      `SELECT least(${oldestUnleasedSql('$1')},
                    (SELECT min(next_attempt_at) FROM events WHERE status = 'queued' AND lease_until IS NOT NULL)) AS at`,
      [webhookActions],
    );
    const oldest = due.rows[0]?.at ?? null;
    return { counts, deliveredCounted: delivered !== undefined, oldestDueAt: oldest !== null && oldest <= now ? oldest : undefined };
  }

  /**
   * Every delivered event counted, per action (a read of them all: see DeliveredCounts), with
   * DELIVERED_COUNT_TIMEOUT_MS rather than the pool's query_timeout: on a store of tens of
   * millions it takes longer, and runs in the background.
   */
  private async countDelivered(): Promise<Map<WebhookAction, number>> {
    const { rows } = await withClient(this.pool, async (client) => {
      this.countingBackend = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      try {
        return await client.query<{ action: WebhookAction; n: number }>({
          text: "SELECT action, count(*) AS n FROM events WHERE status = 'delivered' GROUP BY action",
          query_timeout: DELIVERED_COUNT_TIMEOUT_MS,
        } as pg.QueryConfig);
      } finally {
        this.countingBackend = undefined;
      }
    });
    return new Map(rows.map((row) => [row.action, row.n]));
  }

  /** A statement that writes nothing but is refused wherever writes are (a standby, a read-only session, no connection). */
  async probeWrite(): Promise<void> {
    await this.pool.query("UPDATE events SET status = status WHERE id = ''");
  }

  /**
   * `gatehouse storage copy`'s write side: every batch in one transaction, committed once the last
   * is in, so a failure (or a refusal) leaves the database as it was. Refuses, naming what is
   * there, unless events, attempts and replay keys are all empty; from that check to COMMIT the
   * three tables are locked against writes (EXCLUSIVE: reads go on), so a server started on this
   * database meanwhile waits instead of mixing in. Rows are written as exported (status, attempt
   * counts, times, last error, delivery id, replay keys), with no lease. Listening instances are
   * woken after COMMIT.
   */
  async importAll(batches: AsyncIterable<ExportedEvent[]>, alsoInTransaction?: (client: pg.PoolClient) => Promise<void>): Promise<CopyCounts> {
    const counts = await inTransaction(this.pool, async (client) => {
      await client.query('LOCK TABLE events, attempts, event_replay_keys IN EXCLUSIVE MODE');
      const { rows: [there] } = await client.query<{ events: number; attempts: number; replay_keys: number }>(
        'SELECT (SELECT count(*) FROM events) AS events, (SELECT count(*) FROM attempts) AS attempts, (SELECT count(*) FROM event_replay_keys) AS replay_keys',
      );
      const found = [[there!.events, 'event'], [there!.attempts, 'attempt record'], [there!.replay_keys, 'replay key']]
        .filter(([n]) => (n as number) > 0).map(([n, what]) => `${n} ${what}${n === 1 ? '' : 's'}`);
      if (found.length > 0) {
        throw new UsageError(`the target ${describeUrl(this.storage.url)} is not empty (it holds ${found.join(', ')}): storage copy only writes into an empty schema`);
      }
      const counts: CopyCounts = { events: 0, byStatus: { queued: 0, delivered: 0, dead: 0 }, attempts: 0, idempotencyKeys: 0, replayKeys: 0 };
      for await (const batch of batches) {
        if (batch.length === 0) continue;
        const events = batch.map((b) => b.event);
        await client.query(
          `INSERT INTO events (id, endpoint, action, idempotency_key, received_at, envelope, status, attempts, round_attempts, next_attempt_at, last_error, delivered_at)
           SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::int[], $9::int[], $10::bigint[], $11::text[], $12::bigint[])`,
          [
            events.map((e) => e.id), events.map((e) => e.endpoint), events.map((e) => e.action), events.map((e) => e.idempotencyKey), events.map((e) => e.receivedAt),
            events.map((e) => e.envelope), events.map((e) => e.status), events.map((e) => e.attempts), events.map((e) => e.roundAttempts),
            events.map((e) => e.nextAttemptAt), events.map((e) => e.lastError), events.map((e) => e.deliveredAt),
          ],
        );
        const attempts = batch.flatMap((b) => b.attempts.map((a) => ({ id: b.event.id, ...a })));
        if (attempts.length > 0) {
          await client.query(
            `INSERT INTO attempts (event_id, attempt, at, status, error, duration_ms)
             SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::int[], $5::text[], $6::int[])`,
            [attempts.map((a) => a.id), attempts.map((a) => a.attempt), attempts.map((a) => a.at), attempts.map((a) => a.status), attempts.map((a) => a.error), attempts.map((a) => Math.round(a.durationMs))],
          );
        }
        const replayKeys = batch.flatMap((b) => b.replayKeys.map((r) => ({ id: b.event.id, ...r })));
        if (replayKeys.length > 0) {
          await client.query(
            'INSERT INTO event_replay_keys (endpoint, replay_key, event_id) SELECT * FROM unnest($1::text[], $2::text[], $3::text[])',
            [replayKeys.map((r) => r.endpoint), replayKeys.map((r) => r.replayKey), replayKeys.map((r) => r.id)],
          );
        }
        counts.events += events.length;
        for (const e of events) {
          counts.byStatus[e.status]++;
          if (e.idempotencyKey !== null) counts.idempotencyKeys++;
        }
        counts.attempts += attempts.length;
        counts.replayKeys += replayKeys.length;
      }
      await alsoInTransaction?.(client); // the integrations' state: committed with the events, or not at all
      return counts;
    });
    // Awaited (not notifyDue's fire-and-forget): the CLI closes the pool right after. Polling covers a lost one.
    if (counts.byStatus.queued > 0) await this.pool.query('SELECT pg_notify($1, \'\')', [DUE_CHANNEL]).catch(() => {});
    return counts;
  }

  /**
   * Runs `work` in one transaction with an `accept` that stores events in it (deduped as accept
   * does), so the events and what `work` writes to its own tables (an integration's cursor)
   * commit together, or not at all. Run again from the start after a deadlock; resolves after
   * COMMIT, and wakes the other instances' deliverers when an event was stored.
   */
  async atomically<T>(work: (tx: { client: pg.PoolClient; accept(events: NewEvent[]): Promise<AcceptResult[]> }) => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      const stored = new Set<WebhookAction>();
      try {
        const result = await inTransaction(this.pool, (client) => work({
          client,
          accept: async (events) => {
            const pending = events.map((event) => ({ event, id: newEventId(event.receivedAt), resolve: () => {}, reject: () => {} }));
            return (await this.acceptInTransaction(client, pending)).map((outcome, i) => {
              if ('err' in outcome) throw outcome.err;
              if (!outcome.duplicate) stored.add(events[i]!.action);
              return outcome;
            });
          },
        }));
        if (stored.size > 0) {
          for (const action of stored) this.dbMayHaveDue.add(action); // stored unleased: claimed from the database
          this.notifyDue();
        }
        return result;
      } catch (err) {
        if (attempt < BATCH_TRIES && isRetryableTransactionError(err)) continue;
        throw err;
      }
    }
  }

  /** The pool, for an integration's own tables (created by the migrations). */
  get database(): pg.Pool {
    return this.pool;
  }

  /**
   * Frees the leases of fresh events no deliverer will take here (under their tokens), and
   * announces them, so any instance claims them now. A failure leaves them to run out.
   */
  private async freeLeases(events: ClaimedEvent[]): Promise<void> {
    if (events.length === 0) return;
    await this.pool.query(
      `UPDATE events e SET lease_until = NULL, claim_id = NULL, lease_owner = NULL
         FROM unnest($1::text[], $2::uuid[]) AS f(id, claim_id)
        WHERE e.id = f.id AND e.claim_id = f.claim_id`,
      [events.map((e) => e.id), events.map((e) => e.claimId)],
    ).then(() => this.pool.query('SELECT pg_notify($1, \'\')', [DUE_CHANNEL])).catch(() => {});
  }

  /** Commits the accepts and attempt records still waiting, then closes every connection. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    while (this.flushing || this.pending.length > 0) {
      if (this.flushing) await this.flushing;
      else await this.flush();
    }
    await this.settling;
    // Fresh events no deliverer took: their leases are freed, so another instance delivers them now, not once they run out.
    await this.freeLeases(this.dropFresh());
    await this.listener?.close();
    // A recount under way would hold its connection, and so pool.end(), for as long as it takes (minutes on a big store).
    if (this.countingBackend !== undefined) await this.pool.query('SELECT pg_cancel_backend($1)', [this.countingBackend]).catch(() => {});
    await this.pool.end();
  }
}

/**
 * The latest due time a claim of `limit` from the database can use to get only what goes ahead of
 * the queue's first `limit` due events: just before the `limit`-th one's; `now` when there are fewer.
 */
function dueBefore(queue: ClaimedEvent[], now: number, limit: number): number {
  let due = 0;
  for (const event of queue) {
    if (event.nextAttemptAt > now) continue;
    if (++due === limit) return event.nextAttemptAt - 1;
  }
  return now;
}

/** Where `event` goes in a queue kept in claim order (due time, then id): after every one due no later. */
function dueOrderIndex(queue: ClaimedEvent[], event: ClaimedEvent): number {
  let lo = 0;
  let hi = queue.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    const other = queue[mid]!;
    if (other.nextAttemptAt < event.nextAttemptAt || (other.nextAttemptAt === event.nextAttemptAt && other.id <= event.id)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

function compareKeys(a: NewEvent, b: NewEvent): number {
  const ka = `${a.endpoint}\u0000${a.idempotencyKey ?? ''}`;
  const kb = `${b.endpoint}\u0000${b.idempotencyKey ?? ''}`;
  return ka < kb ? -1 : ka > kb ? 1 : 0;
}

