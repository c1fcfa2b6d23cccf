import { randomUUID } from 'node:crypto';
import type Database from 'better-sqlite3';
import type { WebhookAction } from '../config/schema.js';
import { openDatabase } from '../sqlite.js';

export type DeliveryStatus = 'queued' | 'delivered' | 'dead';

/** What the receiver hands the store: a verified, parsed webhook ready to be delivered. */
export interface NewEvent {
  endpoint: string;
  action: WebhookAction;
  /** The sender's delivery id (Idempotency-Key, webhook-id, X-GitHub-Delivery), if any. */
  idempotencyKey?: string;
  /**
   * For senders that sign no timestamp (github, meta): a digest of the verified signature. The
   * same signed request again is a duplicate for as long as its first event is on file, whatever
   * its delivery id says and however long ago it came.
   */
  replayKey?: string;
  receivedAt: number;
  /** Builds the body the target will get, once the event id is known. */
  envelope: (id: string) => string;
}

export interface StoredEvent {
  id: string;
  endpoint: string;
  action: WebhookAction;
  idempotencyKey: string | null;
  receivedAt: number;
  envelope: string;
  status: DeliveryStatus;
  /** Attempts ever made (numbering of the attempt records). */
  attempts: number;
  /** Attempts since accepted or last requeued: what maxAttempts counts. */
  roundAttempts: number;
  nextAttemptAt: number;
  lastError: string | null;
  deliveredAt: number | null;
}

export interface AttemptRecord {
  attempt: number;
  at: number;
  /** HTTP status, or null when no response came (see error). */
  status: number | null;
  error: string | null;
  durationMs: number;
}

export type AttemptOutcome =
  | { status: 'delivered' }
  | { status: 'queued'; nextAttemptAt: number }
  | { status: 'dead' };

/**
 * Accepted: a new event id; or a repeat (`duplicate`, with the first event's id): a delivery id
 * seen within the idempotency window, or a replay key still on file.
 */
export type AcceptResult = { id: string; duplicate: boolean };

/**
 * Durable webhook state, behind a small async interface so a shared store (Redis) can sit
 * beside SQLite later. `accept` resolves only once the event is committed.
 */
export interface EventStore {
  accept(event: NewEvent): Promise<AcceptResult>;
  /** Leases up to `limit` due events of one action (no one else gets them until `leaseMs` passes). */
  claimDue(now: number, limit: number, leaseMs: number, action: WebhookAction): Promise<StoredEvent[]>;
  recordAttempt(id: string, attempt: AttemptRecord, outcome: AttemptOutcome): Promise<void>;
  /** Frees every lease (a deliverer starting afresh); returns how many were held. */
  releaseLeases(): Promise<number>;
  /** The earliest next_attempt_at of queued events, if any. */
  nextDueAt(now: number): Promise<number | undefined>;
  list(filter: { status?: DeliveryStatus; endpoint?: string; limit?: number }): Promise<StoredEvent[]>;
  get(id: string): Promise<{ event: StoredEvent; attempts: AttemptRecord[] } | undefined>;
  /** Puts an event back in the queue with a fresh attempt budget; false when unknown or already queued. */
  requeue(id: string, now: number): Promise<boolean>;
  requeueDead(now: number): Promise<number>;
  /** Deletes events delivered before `olderThan`, with their attempts and replay keys (a replay of one is then new). */
  purgeDelivered(olderThan: number): Promise<number>;
  close(): Promise<void>;
}

const MAX_FRESH_EVENTS = 10_000;
/** The fresh queue holds envelopes in memory: bounded in bytes too (a slow target, large bodies). */
const MAX_FRESH_BYTES = 32 * 1024 * 1024;

/**
 * How long a sender's delivery id is remembered: a repeat inside it is not delivered again.
 * (Some senders reuse ids after a while, e.g. Telegram's update_id; replay keys, digests of
 * signed bytes, are never reused by an honest sender and so have no window.)
 */
export const IDEMPOTENCY_WINDOW_MS = 24 * 60 * 60 * 1000;

interface EventRow {
  id: string;
  endpoint: string;
  action: WebhookAction;
  idempotency_key: string | null;
  received_at: number;
  envelope: string;
  status: DeliveryStatus;
  attempts: number;
  round_attempts: number;
  next_attempt_at: number;
  last_error: string | null;
  delivered_at: number | null;
}

const SCHEMA = `
CREATE TABLE IF NOT EXISTS events (
  id              TEXT PRIMARY KEY,
  endpoint        TEXT NOT NULL,
  action          TEXT NOT NULL,
  idempotency_key TEXT,
  received_at     INTEGER NOT NULL,
  envelope        TEXT NOT NULL,
  status          TEXT NOT NULL CHECK (status IN ('queued', 'delivered', 'dead')),
  attempts        INTEGER NOT NULL DEFAULT 0,
  round_attempts  INTEGER NOT NULL DEFAULT 0,
  next_attempt_at INTEGER NOT NULL,
  last_error      TEXT,
  delivered_at    INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS events_idempotency ON events (endpoint, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS events_due ON events (status, action, next_attempt_at, id);
CREATE INDEX IF NOT EXISTS events_next ON events (status, next_attempt_at, id);
CREATE TABLE IF NOT EXISTS attempts (
  event_id    TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
  attempt     INTEGER NOT NULL,
  at          INTEGER NOT NULL,
  status      INTEGER,
  error       TEXT,
  duration_ms INTEGER NOT NULL,
  PRIMARY KEY (event_id, attempt)
);
-- Replay keys (see NewEvent.replayKey): one row per signed event, gone with its event (purge).
-- A table of its own rather than a column, so a file from an earlier version gains it here
-- without an ALTER.
CREATE TABLE IF NOT EXISTS event_replay_keys (
  endpoint   TEXT NOT NULL,
  replay_key TEXT NOT NULL,
  event_id   TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
  PRIMARY KEY (endpoint, replay_key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS event_replay_keys_event ON event_replay_keys (event_id);
`;

/** `evt_` + a base36 millisecond prefix (time-ordered) + 80 random bits (randomUUID's pooled randomness). */
export function newEventId(now: number = Date.now()): string {
  const random = randomUUID();
  // 20 hex digits, leaving out the UUID's fixed version and variant digits (positions 14 and 19).
  return `evt_${now.toString(36).padStart(9, '0')}${random.slice(0, 8)}${random.slice(9, 13)}${random.slice(15, 18)}${random.slice(20, 23)}${random.slice(24, 26)}`;
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
 * SQLite file.
 */
export class SqliteEventStore implements EventStore {
  private readonly db: Database.Database;
  private pending: PendingWrite[] = [];
  private flushScheduled = false;
  /** Event id → lease end (ms). */
  private readonly leases = new Map<string, number>();
  /**
   * Events this process accepted and no deliverer has claimed yet, per action: handed out
   * without reading them back from the file. Bounded; beyond it, events wait for a scan.
   */
  private readonly fresh = new Map<WebhookAction, StoredEvent[]>();
  private readonly freshIds = new Set<string>();
  private freshBytes = 0;
  private readonly statements;

  /** `mustExist`: open an existing store only (the CLI), rather than create an empty one at a mistyped path. */
  constructor(file: string, options: { mustExist?: boolean } = {}) {
    this.db = openDatabase(file, options);
    this.db.exec(SCHEMA);
    const db = this.db;
    this.statements = {
      findByKey: db.prepare<[string, string], { id: string; received_at: number }>('SELECT id, received_at FROM events WHERE endpoint = ? AND idempotency_key = ?'),
      forgetKey: db.prepare<[string]>('UPDATE events SET idempotency_key = NULL WHERE id = ?'),
      findByReplayKey: db.prepare<[string, string], { id: string }>('SELECT event_id AS id FROM event_replay_keys WHERE endpoint = ? AND replay_key = ?'),
      insertReplayKey: db.prepare<[string, string, string]>('INSERT INTO event_replay_keys (endpoint, replay_key, event_id) VALUES (?, ?, ?)'),
      insert: db.prepare('INSERT INTO events (id, endpoint, action, idempotency_key, received_at, envelope, status, next_attempt_at) VALUES (?, ?, ?, ?, ?, ?, \'queued\', ?)'),
      // Ids only (a covering index): leased rows are skipped without reading their envelopes.
      due: db.prepare<[string, number, number], { id: string }>('SELECT id FROM events WHERE status = \'queued\' AND action = ? AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?'),
      insertAttempt: db.prepare('INSERT INTO attempts (event_id, attempt, at, status, error, duration_ms) VALUES (?, ?, ?, ?, ?, ?)'),
      settle: db.prepare('UPDATE events SET status = ?, attempts = attempts + 1, round_attempts = round_attempts + 1, next_attempt_at = ?, last_error = ?, delivered_at = ? WHERE id = ?'),
      nextDue: db.prepare<[number], { id: string; next_attempt_at: number }>('SELECT id, next_attempt_at FROM events WHERE status = \'queued\' ORDER BY next_attempt_at LIMIT ?'),
      get: db.prepare<[string], EventRow>('SELECT * FROM events WHERE id = ?'),
      attempts: db.prepare<[string], { attempt: number; at: number; status: number | null; error: string | null; duration_ms: number }>('SELECT * FROM attempts WHERE event_id = ? ORDER BY attempt'),
      requeue: db.prepare<[number, string]>('UPDATE events SET status = \'queued\', round_attempts = 0, next_attempt_at = ?, delivered_at = NULL WHERE id = ? AND status != \'queued\''),
      requeueDead: db.prepare<[number]>('UPDATE events SET status = \'queued\', round_attempts = 0, next_attempt_at = ? WHERE status = \'dead\''),
      // In chunks, each its own short transaction: a large purge must not hold the write lock the server needs.
      purge: db.prepare<[number]>('DELETE FROM events WHERE rowid IN (SELECT rowid FROM events WHERE status = \'delivered\' AND delivered_at < ? LIMIT 500)'),
    };
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
    if (this.freshIds.size >= MAX_FRESH_EVENTS || this.freshBytes + stored.envelope.length > MAX_FRESH_BYTES) return;
    this.freshBytes += stored.envelope.length;
    const queue = this.fresh.get(stored.action) ?? [];
    this.fresh.set(stored.action, queue);
    queue.push(stored);
    this.freshIds.add(stored.id);
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

  private insertOne(event: NewEvent): AcceptResult & { stored?: StoredEvent } {
    const seen = event.idempotencyKey !== undefined ? this.statements.findByKey.get(event.endpoint, event.idempotencyKey) : undefined;
    if (seen && seen.received_at > event.receivedAt - IDEMPOTENCY_WINDOW_MS) return { id: seen.id, duplicate: true };
    const replayed = event.replayKey !== undefined ? this.statements.findByReplayKey.get(event.endpoint, event.replayKey) : undefined;
    if (replayed) return { id: replayed.id, duplicate: true };
    const id = newEventId(event.receivedAt);
    const envelope = event.envelope(id); // before any write: a throw here leaves nothing behind
    // Both keys were looked up in this same transaction, so neither insert can meet a conflict.
    if (seen) this.statements.forgetKey.run(seen.id);
    this.statements.insert.run(id, event.endpoint, event.action, event.idempotencyKey ?? null, event.receivedAt, envelope, event.receivedAt);
    if (event.replayKey !== undefined) this.statements.insertReplayKey.run(event.endpoint, event.replayKey, id);
    const stored: StoredEvent = {
      id, endpoint: event.endpoint, action: event.action, idempotencyKey: event.idempotencyKey ?? null, receivedAt: event.receivedAt,
      envelope, status: 'queued', attempts: 0, roundAttempts: 0, nextAttemptAt: event.receivedAt, lastError: null, deliveredAt: null,
    };
    return { id, duplicate: false, stored };
  }

  async claimDue(now: number, limit: number, leaseMs: number, action: WebhookAction): Promise<StoredEvent[]> {
    const claimed: StoredEvent[] = [];
    const queue = this.fresh.get(action);
    if (queue?.length) {
      // Just accepted by this process: handed out from memory, not read back from the file.
      // An id no longer in freshIds was settled some other way meanwhile and is dropped.
      const notDue: StoredEvent[] = [];
      let i = 0;
      for (; i < queue.length && claimed.length < limit; i++) {
        const event = queue[i]!;
        if (event.nextAttemptAt > now && this.freshIds.has(event.id)) {
          notDue.push(event);
          continue;
        }
        this.freshBytes -= event.envelope.length;
        if (!this.freshIds.has(event.id)) continue;
        this.freshIds.delete(event.id);
        this.leases.set(event.id, now + leaseMs);
        claimed.push(event);
      }
      queue.splice(0, i, ...notDue);
      if (claimed.length === limit) return claimed;
    }
    for (const { id } of this.statements.due.all(action, now, limit + this.leases.size + this.freshIds.size)) {
      if ((this.leases.get(id) ?? 0) > now || this.freshIds.has(id)) continue;
      const row = this.statements.get.get(id);
      if (!row) continue;
      claimed.push(toEvent(row));
      if (claimed.length === limit) break;
    }
    // Leased only once every row is read: a read that throws leaves no orphaned leases.
    for (const event of claimed) this.leases.set(event.id, now + leaseMs);
    return claimed;
  }

  recordAttempt(id: string, attempt: AttemptRecord, outcome: AttemptOutcome): Promise<void> {
    this.freshIds.delete(id);
    return this.write(() => {
      this.statements.insertAttempt.run(id, attempt.attempt, attempt.at, attempt.status, attempt.error, Math.round(attempt.durationMs));
      const lastError = outcome.status === 'delivered' ? null : (attempt.error ?? `HTTP ${attempt.status}`);
      this.statements.settle.run(
        outcome.status,
        outcome.status === 'queued' ? outcome.nextAttemptAt : 0,
        lastError,
        outcome.status === 'delivered' ? attempt.at + Math.round(attempt.durationMs) : null,
        id,
      );
    }).then(() => {
      this.leases.delete(id);
    });
  }

  async releaseLeases(): Promise<number> {
    this.fresh.clear();
    this.freshIds.clear();
    this.freshBytes = 0;
    const held = this.leases.size;
    this.leases.clear();
    return held;
  }

  /** The earliest time a queued event can be claimed: leased events count from their lease's end. */
  async nextDueAt(now: number): Promise<number | undefined> {
    let earliest: number | undefined;
    for (const queue of this.fresh.values()) {
      const head = queue.find((e) => this.freshIds.has(e.id));
      if (head) earliest = Math.min(earliest ?? head.nextAttemptAt, head.nextAttemptAt);
    }
    if (earliest !== undefined && earliest <= now) return earliest; // work is waiting: no need to ask the file
    for (const [id, until] of this.leases) {
      if (until <= now) this.leases.delete(id);
      else earliest = Math.min(earliest ?? until, until);
    }
    for (const row of this.statements.nextDue.all(this.leases.size + this.freshIds.size + 1)) {
      if (this.leases.has(row.id) || this.freshIds.has(row.id)) continue;
      earliest = Math.min(earliest ?? row.next_attempt_at, row.next_attempt_at);
      break;
    }
    return earliest;
  }

  async list(filter: { status?: DeliveryStatus; endpoint?: string; limit?: number }): Promise<StoredEvent[]> {
    const where: string[] = [];
    const params: (string | number)[] = [];
    if (filter.status) {
      where.push('status = ?');
      params.push(filter.status);
    }
    if (filter.endpoint) {
      where.push('endpoint = ?');
      params.push(filter.endpoint);
    }
    params.push(filter.limit ?? 100);
    const sql = `SELECT * FROM events ${where.length ? `WHERE ${where.join(' AND ')}` : ''} ORDER BY received_at DESC, id DESC LIMIT ?`;
    return (this.db.prepare(sql).all(...params) as EventRow[]).map(toEvent);
  }

  async get(id: string): Promise<{ event: StoredEvent; attempts: AttemptRecord[] } | undefined> {
    const row = this.statements.get.get(id);
    if (!row) return undefined;
    const attempts = this.statements.attempts.all(id).map((a) => ({ attempt: a.attempt, at: a.at, status: a.status, error: a.error, durationMs: a.duration_ms }));
    return { event: toEvent(row), attempts };
  }

  async requeue(id: string, now: number): Promise<boolean> {
    return this.statements.requeue.run(now, id).changes > 0;
  }

  async requeueDead(now: number): Promise<number> {
    return this.statements.requeueDead.run(now).changes;
  }

  async purgeDelivered(olderThan: number): Promise<number> {
    let purged = 0;
    for (;;) {
      const { changes } = this.statements.purge.run(olderThan);
      if (changes === 0) return purged;
      purged += changes;
      await new Promise((r) => setImmediate(r)); // let the server's commits in between chunks
    }
  }


  async close(): Promise<void> {
    if (this.pending.length > 0) this.flush();
    this.db.close();
  }
}

function toEvent(row: EventRow): StoredEvent {
  return {
    id: row.id,
    endpoint: row.endpoint,
    action: row.action,
    idempotencyKey: row.idempotency_key,
    receivedAt: row.received_at,
    envelope: row.envelope,
    status: row.status,
    attempts: row.attempts,
    roundAttempts: row.round_attempts,
    nextAttemptAt: row.next_attempt_at,
    lastError: row.last_error,
    deliveredAt: row.delivered_at,
  };
}
