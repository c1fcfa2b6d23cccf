import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';

/** What the database says once the load has stopped: the drain, leftover leases, each event's end. */
export interface DatabaseFacts {
  /** Milliseconds from the load's end until no event was queued; undefined when it never got there. */
  drainMs?: number;
  /** Queued events when the drain gave up (0 when it drained). */
  queuedAtEnd: number;
  /** Events still holding a lease after the drain, by owner (the owner is an instance's random store id). */
  leasesAfterDrain: { owner: string; events: number }[];
  /** Every event's final status, and for dead ones when their last attempt (the one that killed it) started. */
  events: Map<string, { status: string; deadAt?: number; attempts: number }>;
}

/** Polls the queue until it is empty or `limitMs` passes, then reads leases and every event's outcome. */
export async function readDatabaseFacts(databaseUrl: string, loadEnd: number, limitMs: number): Promise<DatabaseFacts> {
  const db = new pg.Client({ connectionString: databaseUrl, query_timeout: 10_000 });
  await db.connect();
  try {
    let queued = -1;
    let drainMs: number | undefined;
    while (Date.now() - loadEnd <= limitMs) {
      const { rows } = await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM events WHERE status = 'queued'`);
      queued = rows[0]!.n;
      if (queued === 0) {
        drainMs = Date.now() - loadEnd;
        break;
      }
      await sleep(500);
    }
    const leases = await db.query<{ owner: string; events: number }>(
      `SELECT lease_owner AS owner, count(*)::int AS events FROM events WHERE lease_owner IS NOT NULL GROUP BY 1`,
    );
    const rows = await db.query<{ id: string; status: string; attempts: number; dead_at: string | null }>(
      `SELECT e.id, e.status, e.attempts,
              CASE WHEN e.status = 'dead' THEN (SELECT max(a.at) FROM attempts a WHERE a.event_id = e.id) END AS dead_at
         FROM events e`,
    );
    const events = new Map<string, { status: string; deadAt?: number; attempts: number }>();
    for (const row of rows.rows)
      events.set(row.id, {
        status: row.status,
        attempts: row.attempts,
        deadAt: row.dead_at === null ? undefined : Number(row.dead_at),
      });
    return { drainMs, queuedAtEnd: drainMs === undefined ? queued : 0, leasesAfterDrain: leases.rows, events };
  } finally {
    await db.end();
  }
}
