import type Database from 'better-sqlite3';
import { toEvent, type EventRow, type ExportedEvent } from '../contracts/events.js';
import { toAttempt, type AttemptRow } from './statements.js';

/**
 * Every event with its attempts and replay keys, in id order, in batches of at most
 * `exportBatchEvents` events and about `exportBatchBytes` of envelopes (a batch is one multi-row
 * insert on the other side), all read from one snapshot: a read transaction held until the
 * iteration ends, so a requeue another process commits meanwhile is either wholly in it or not
 * at all. The caller has no write under way on `db` (SqliteEventStore.exportAll checks).
 */
export async function* exportEvents(
  db: Database.Database,
  limits: { exportBatchEvents: number; exportBatchBytes: number },
): AsyncGenerator<ExportedEvent[]> {
  // Pages in id order, and the attempts and replay keys of a page's id range (both indexed by event_id).
  const page = db.prepare<[string, number], EventRow & { headers: string | null; trace_context: string | null }>(
    'SELECT * FROM events WHERE id > ? ORDER BY id LIMIT ?',
  );
  const attempts = db.prepare<[string, string], AttemptRow & { event_id: string }>(
    'SELECT * FROM attempts WHERE event_id > ? AND event_id <= ? ORDER BY event_id, attempt',
  );
  const replayKeys = db.prepare<[string, string], { endpoint: string; replay_key: string; event_id: string }>(
    'SELECT endpoint, replay_key, event_id FROM event_replay_keys WHERE event_id > ? AND event_id <= ? ORDER BY event_id, endpoint, replay_key',
  );
  db.exec('BEGIN'); // deferred: the snapshot is taken at the first read and kept to COMMIT
  try {
    let after = '';
    for (;;) {
      const rows = page.all(after, limits.exportBatchEvents);
      if (rows.length === 0) return;
      const last = rows[rows.length - 1]!.id;
      const byId = new Map<string, ExportedEvent>(
        rows.map((row) => [
          row.id,
          { event: toEvent(row), headers: row.headers, traceContext: row.trace_context, attempts: [], replayKeys: [] },
        ]),
      );
      for (const a of attempts.all(after, last)) {
        byId.get(a.event_id)?.attempts.push(toAttempt(a));
      }
      for (const r of replayKeys.all(after, last))
        byId.get(r.event_id)?.replayKeys.push({ endpoint: r.endpoint, replayKey: r.replay_key });
      after = last;
      let batch: ExportedEvent[] = [];
      let bytes = 0;
      for (const exported of byId.values()) {
        if (batch.length > 0 && bytes + exported.event.envelope.length > limits.exportBatchBytes) {
          yield batch;
          batch = [];
          bytes = 0;
        }
        batch.push(exported);
        bytes += exported.event.envelope.length;
      }
      yield batch;
    }
  } finally {
    if (db.inTransaction) db.exec('COMMIT'); // read only: this just ends the snapshot
  }
}
