import type Database from 'better-sqlite3';
import type { WebhookAction } from '../../config/schema.js';
import type { AttemptRecord, ClaimedEvent, DeliveryStatus, EventRow, StoredEvent } from '../contracts/events.js';

/**
 * One chunk of purgeDelivered: its own short transaction, found through events_delivered (INDEXED
 * BY: without statistics the planner walks events_next, every delivered event, instead), an index
 * that covers it. Exported for the test that checks its plan.
 */
export const PURGE_CHUNK_SQL =
  "DELETE FROM events WHERE rowid IN (SELECT rowid FROM events INDEXED BY events_delivered WHERE status = 'delivered' AND delivered_at < ? LIMIT 500)";
/**
 * Within the delivery-id window (`--older-than` under 24 h) events whose id is still remembered
 * stay: the rows delivered in that last day are walked once, a page at a time, from where the
 * last page ended (a cursor on the index, not a new scan per chunk that would read every row
 * kept so far again), and the page's rows that may go are deleted. Exported for the plan test.
 */
export const PURGE_RECENT_PAGE_SQL =
  "SELECT rowid AS row, delivered_at AS at FROM events INDEXED BY events_delivered WHERE status = 'delivered' AND delivered_at < @before AND (delivered_at, rowid) > (@at, @row) ORDER BY delivered_at, rowid LIMIT 500";
export const PURGE_RECENT_DELETE_SQL =
  "DELETE FROM events WHERE rowid IN (SELECT value FROM json_each(@rows)) AND status = 'delivered' AND (idempotency_key IS NULL OR received_at <= @forgotten)";

/**
 * Runs `chunk` (one short transaction that changes at most a few hundred rows, and fewer once
 * there are no more) until it changes nothing; returns how many it changed in all. The event loop
 * is free between chunks, and so is the write lock: the server's commits (in another process) get
 * in between, instead of waiting behind one long statement past their busy timeout.
 */
export async function inChunks(chunk: () => number): Promise<number> {
  let total = 0;
  for (;;) {
    const changes = chunk();
    if (changes === 0) return total;
    total += changes;
    await new Promise((r) => setImmediate(r));
  }
}

/** An `events` row's columns as EventRow has them (everything but the received headers). */
export const EVENT_COLUMNS =
  'id, endpoint, action, idempotency_key, received_at, envelope, status, attempts, round_attempts, next_attempt_at, last_error, delivered_at';

/** An event as the deliverer gets it: the row, and the trace context it was received in. */
export type Deliverable = StoredEvent & Pick<ClaimedEvent, 'traceContext'>;

/** An `attempts` row. */
export interface AttemptRow {
  attempt: number;
  at: number;
  status: number | null;
  error: string | null;
  duration_ms: number;
  response_snippet: string | null;
}

/** The record an `attempts` row holds. */
export function toAttempt(a: AttemptRow): AttemptRecord {
  return {
    attempt: a.attempt,
    at: a.at,
    status: a.status,
    error: a.error,
    durationMs: a.duration_ms,
    responseSnippet: a.response_snippet,
  };
}

/** Every statement the SQLite events store runs, prepared once per connection. */
export function prepareStatements(db: Database.Database) {
  return {
    findByKey: db.prepare<[string, string], { id: string; received_at: number }>(
      'SELECT id, received_at FROM events WHERE endpoint = ? AND idempotency_key = ?',
    ),
    forgetKey: db.prepare<[string]>('UPDATE events SET idempotency_key = NULL WHERE id = ?'),
    findByReplayKey: db.prepare<[string, string], { id: string }>(
      'SELECT event_id AS id FROM event_replay_keys WHERE endpoint = ? AND replay_key = ?',
    ),
    insertReplayKey: db.prepare<[string, string, string]>(
      'INSERT INTO event_replay_keys (endpoint, replay_key, event_id) VALUES (?, ?, ?)',
    ),
    insert: db.prepare(
      "INSERT INTO events (id, endpoint, action, idempotency_key, received_at, envelope, status, next_attempt_at, headers, trace_context) VALUES (?, ?, ?, ?, ?, ?, 'queued', ?, ?, ?)",
    ),
    // Ids only (a covering index): leased rows are skipped without reading their envelopes.
    due: db.prepare<[string, number, number], { id: string }>(
      "SELECT id FROM events WHERE status = 'queued' AND action = ? AND next_attempt_at <= ? ORDER BY next_attempt_at LIMIT ?",
    ),
    insertAttempt: db.prepare(
      'INSERT INTO attempts (event_id, attempt, at, status, error, duration_ms, response_snippet) VALUES (?, ?, ?, ?, ?, ?, ?)',
    ),
    settle: db.prepare(
      'UPDATE events SET status = ?, attempts = attempts + 1, round_attempts = round_attempts + 1, next_attempt_at = ?, last_error = ?, delivered_at = ? WHERE id = ?',
    ),
    nextDue: db.prepare<[number], { id: string; next_attempt_at: number }>(
      "SELECT id, next_attempt_at FROM events WHERE status = 'queued' ORDER BY next_attempt_at LIMIT ?",
    ),
    // Without the received headers, which only the operator reads (apart, below).
    get: db.prepare<[string], EventRow>(`SELECT ${EVENT_COLUMNS} FROM events WHERE id = ?`),
    // The row a deliverer claims, with the trace context its attempts continue.
    claimed: db.prepare<[string], EventRow & { trace_context: string | null }>(
      `SELECT ${EVENT_COLUMNS}, trace_context FROM events WHERE id = ?`,
    ),
    headers: db.prepare<[string], { headers: string | null }>('SELECT headers FROM events WHERE id = ?'),
    attempts: db.prepare<[string], AttemptRow>('SELECT * FROM attempts WHERE event_id = ? ORDER BY attempt'),
    // A queued event waiting for a retry (next attempt later) is in no one's hands: the server leases only due ones.
    requeue: db.prepare<{ now: number; id: string }>(
      "UPDATE events SET status = 'queued', round_attempts = 0, next_attempt_at = @now, delivered_at = NULL WHERE id = @id AND (status != 'queued' OR next_attempt_at > @now)",
    ),
    // Both in chunks (see inChunks): a copied queue can hold a million, and one UPDATE of them all holds the write lock for seconds.
    requeueDead: db.prepare<{ now: number }>(
      "UPDATE events SET status = 'queued', round_attempts = 0, next_attempt_at = @now WHERE rowid IN (SELECT rowid FROM events WHERE status = 'dead' LIMIT 500)",
    ),
    requeueWaiting: db.prepare<{ now: number }>(
      "UPDATE events SET round_attempts = 0, next_attempt_at = @now WHERE rowid IN (SELECT rowid FROM events WHERE status = 'queued' AND next_attempt_at > @now LIMIT 500)",
    ),
    // In chunks, each its own short transaction: a large purge must not hold the write lock the server needs.
    purge: db.prepare<[number]>(PURGE_CHUNK_SQL),
    purgeRecentPage: db.prepare<[{ before: number; at: number; row: number }], { row: number; at: number }>(
      PURGE_RECENT_PAGE_SQL,
    ),
    purgeRecentDelete: db.prepare<[{ rows: string; forgotten: number }]>(PURGE_RECENT_DELETE_SQL),
    counts: db.prepare<[], { status: DeliveryStatus; n: number }>(
      'SELECT status, COUNT(*) AS n FROM events GROUP BY status',
    ),
    // queueStats: queued and dead through events_due (as many entries as there are); delivered
    // ones in deliveredCountStep steps along it (the key after a step, then what is left).
    undeliveredCounts: db.prepare<[], { action: WebhookAction; status: DeliveryStatus; n: number }>(
      "SELECT action, status, COUNT(*) AS n FROM events WHERE status IN ('queued', 'dead') GROUP BY action, status",
    ),
    deliveredStep: db.prepare<[string, number, string, number], { at: number; id: string }>(
      "SELECT next_attempt_at AS at, id FROM events WHERE status = 'delivered' AND action = ? AND (next_attempt_at, id) > (?, ?) ORDER BY next_attempt_at, id LIMIT 1 OFFSET ?",
    ),
    deliveredRest: db.prepare<[string, number, string], { n: number }>(
      "SELECT COUNT(*) AS n FROM events WHERE status = 'delivered' AND action = ? AND (next_attempt_at, id) > (?, ?)",
    ),
    oldestDue: db.prepare<[number], { at: number | null }>(
      "SELECT MIN(next_attempt_at) AS at FROM events WHERE status = 'queued' AND next_attempt_at <= ?",
    ),
    // Takes the write lock and changes nothing (no row has an empty id).
    probeWrite: db.prepare<[number]>(
      'INSERT INTO store_probe (id, at) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET at = excluded.at',
    ),
  };
}

export type Statements = ReturnType<typeof prepareStatements>;
