import type pg from 'pg';
import type { PostgresStorageConfig } from '../../../config/schema.js';
import { UsageError } from '../../../errors.js';
import type { CopyCounts, ExportedEvent } from '../../contracts/events.js';
import { describeUrl, inTransaction } from '../pool.js';
import type { DueNotifier } from './notify.js';

/**
 * `gatehouse storage copy`'s write side: every batch in one transaction, committed once the last
 * is in, so a failure (or a refusal) leaves the database as it was. Refuses, naming what is
 * there, unless events, attempts and replay keys are all empty; from that check to COMMIT the
 * three tables are locked against writes (EXCLUSIVE: reads go on), so a server started on this
 * database meanwhile waits instead of mixing in. Rows are written as exported (status, attempt
 * counts, times, last error, delivery id, replay keys), with no lease. Listening instances are
 * woken after COMMIT.
 */
export async function importEvents(
  pool: pg.Pool,
  storage: PostgresStorageConfig,
  notifier: DueNotifier,
  batches: AsyncIterable<ExportedEvent[]>,
  alsoInTransaction?: (client: pg.PoolClient) => Promise<void>,
): Promise<CopyCounts> {
  const counts = await inTransaction(pool, async (client) => {
    await client.query('LOCK TABLE events, attempts, event_replay_keys IN EXCLUSIVE MODE');
    const {
      rows: [there],
    } = await client.query<{ events: number; attempts: number; replay_keys: number }>(
      'SELECT (SELECT count(*) FROM events) AS events, (SELECT count(*) FROM attempts) AS attempts, (SELECT count(*) FROM event_replay_keys) AS replay_keys',
    );
    const found = [
      [there!.events, 'event'],
      [there!.attempts, 'attempt record'],
      [there!.replay_keys, 'replay key'],
    ]
      .filter(([n]) => (n as number) > 0)
      .map(([n, what]) => `${n} ${what}${n === 1 ? '' : 's'}`);
    if (found.length > 0) {
      throw new UsageError(
        `the target ${describeUrl(storage.url)} is not empty (it holds ${found.join(', ')}): storage copy only writes into an empty schema`,
      );
    }
    const counts: CopyCounts = {
      events: 0,
      byStatus: { queued: 0, delivered: 0, dead: 0 },
      attempts: 0,
      idempotencyKeys: 0,
      replayKeys: 0,
    };
    for await (const batch of batches) {
      if (batch.length === 0) continue;
      const events = batch.map((b) => b.event);
      await client.query(
        `INSERT INTO events (id, endpoint, action, idempotency_key, received_at, envelope, status, attempts, round_attempts, next_attempt_at, last_error, delivered_at, headers, trace_context)
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::text[], $7::text[], $8::int[], $9::int[], $10::bigint[], $11::text[], $12::bigint[], $13::text[], $14::text[])`,
        [
          events.map((e) => e.id),
          events.map((e) => e.endpoint),
          events.map((e) => e.action),
          events.map((e) => e.idempotencyKey),
          events.map((e) => e.receivedAt),
          events.map((e) => e.envelope),
          events.map((e) => e.status),
          events.map((e) => e.attempts),
          events.map((e) => e.roundAttempts),
          events.map((e) => e.nextAttemptAt),
          events.map((e) => e.lastError),
          events.map((e) => e.deliveredAt),
          batch.map((b) => b.headers),
          batch.map((b) => b.traceContext ?? null),
        ],
      );
      const attempts = batch.flatMap((b) => b.attempts.map((a) => ({ id: b.event.id, ...a })));
      if (attempts.length > 0) {
        await client.query(
          `INSERT INTO attempts (event_id, attempt, at, status, error, duration_ms, response_snippet)
           SELECT * FROM unnest($1::text[], $2::int[], $3::bigint[], $4::int[], $5::text[], $6::int[], $7::text[])`,
          [
            attempts.map((a) => a.id),
            attempts.map((a) => a.attempt),
            attempts.map((a) => a.at),
            attempts.map((a) => a.status),
            attempts.map((a) => a.error),
            attempts.map((a) => Math.round(a.durationMs)),
            attempts.map((a) => a.responseSnippet ?? null),
          ],
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
  if (counts.byStatus.queued > 0) await notifier.announce().catch(() => {});
  return counts;
}
