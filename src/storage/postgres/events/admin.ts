import type pg from 'pg';
import { webhookActions, type PostgresStorageConfig, type WebhookAction } from '../../../config/schema.js';
import {
  IDEMPOTENCY_WINDOW_MS,
  toEvent,
  toEventListing,
  type EventDetail,
  type DeliveredCounts,
  type DeliveryStatus,
  type EventFilter,
  type EventListing,
  type EventPageKey,
  type PurgeResult,
  type QueueStats,
  type StoreStatus,
  type StoredEvent,
} from '../../contracts/events.js';
import { schemaVersion } from '../migrations.js';
import { describeUrl, withClient } from '../pool.js';
import { oldestUnleasedSql, type EventRow } from './claims.js';
import type { DueNotifier } from './notify.js';
import type { PostgresTuning } from './tuning.js';

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

/**
 * requeueMatching's update for one chunk of ids ($1), due at $2: dead ones, queued ones waiting for
 * a retry and leased by no one, delivered ones when $3. A queued event already due, or leased
 * (an attempt under way), is left as is.
 */
const REQUEUE_IDS_SQL = `UPDATE events SET status = 'queued', round_attempts = 0, next_attempt_at = $2::bigint, delivered_at = NULL,
       lease_until = NULL, claim_id = NULL, lease_owner = NULL
 WHERE id = ANY($1::text[])
   AND (status = 'dead' OR (status = 'queued' AND lease_until IS NULL AND next_attempt_at > $2::bigint)
        OR ($3::boolean AND status = 'delivered'))`;

/** listPage's columns: the row without its envelope, and its newest attempt's time and status. */
const LISTING_COLUMNS = `e.id, e.endpoint, e.action, e.idempotency_key, e.received_at, e.status, e.attempts, e.round_attempts,
  e.next_attempt_at, e.last_error, e.delivered_at, la.at AS last_attempt_at, la.status AS last_status`;

/**
 * The ids of events whose delivery id is `q`, through events_idempotency (endpoint, idempotency_key):
 * one probe per endpoint in the store, the endpoints walked along events_endpoint_received (a loose
 * index scan: PostgreSQL 15 has no skip scan), because that index starts with the endpoint.
 */
function deliveryIdSql(q: string): string {
  return `WITH RECURSIVE eps(endpoint) AS (
    SELECT (SELECT min(endpoint) FROM events)
    UNION ALL SELECT (SELECT min(endpoint) FROM events WHERE endpoint > eps.endpoint) FROM eps WHERE eps.endpoint IS NOT NULL)
  SELECT x.id FROM eps JOIN events x ON x.endpoint = eps.endpoint AND x.idempotency_key = ${q}`;
}

/**
 * The SELECT for an operator's filter, newest first, keyset-paged. Without `q` it is answered
 * through an index ordered by (received_at, id): events_received, events_status_received or
 * events_endpoint_received (migration 7); test/storage/postgres-events.test.ts checks the plans.
 */
export function listSql(
  filter: EventFilter,
  statuses: readonly DeliveryStatus[],
  after: EventPageKey | undefined,
  limit: number,
  columns: string,
): { sql: string; params: unknown[] } {
  const params: unknown[] = [];
  const bind = (value: unknown) => `$${params.push(value)}`;
  const where: string[] = [];
  if (statuses.length === 1) where.push(`e.status = ${bind(statuses[0])}`);
  else if (statuses.length > 1) where.push(`e.status = ANY(${bind(statuses)}::text[])`);
  if (filter.endpoint !== undefined) where.push(`e.endpoint = ${bind(filter.endpoint)}`);
  if (filter.action !== undefined) where.push(`e.action = ${bind(filter.action)}`);
  if (filter.since !== undefined) where.push(`e.received_at >= ${bind(filter.since)}::bigint`);
  if (filter.until !== undefined) where.push(`e.received_at < ${bind(filter.until)}::bigint`);
  if (filter.q !== undefined) {
    const q = bind(filter.q);
    where.push(
      filter.qMatch === 'id'
        ? `e.id IN (SELECT ${q} UNION ALL SELECT * FROM (${deliveryIdSql(q)}) d)`
        : filter.qMatch === 'text'
          ? `strpos(e.envelope, ${q}) > 0`
          : `(e.id = ${q} OR e.idempotency_key = ${q} OR strpos(e.envelope, ${q}) > 0)`,
    );
  }
  if (after) where.push(`(e.received_at, e.id) < (${bind(after.receivedAt)}::bigint, ${bind(after.id)})`);
  const lateral = columns.includes('la.')
    ? ' LEFT JOIN LATERAL (SELECT at, status FROM attempts a WHERE a.event_id = e.id ORDER BY attempt DESC LIMIT 1) la ON true'
    : '';
  const sql = `SELECT ${columns} FROM events e${lateral} ${where.length ? `WHERE ${where.join(' AND ')}` : ''}
    ORDER BY e.received_at DESC, e.id DESC LIMIT ${bind(limit)}`;
  return { sql, params };
}

/**
 * What the CLI and /metrics ask of the events (as Convoy's inspector and monitor): listing and
 * reading them, requeueing, purging the delivered, the store's status and queue statistics, and
 * /readyz's write probe. Each is a statement or a few on the pool, none holding long locks.
 */
export class EventAdmin {
  /** The backend pid of the connection counting delivered events, while it does (cancelCount() cancels it). */
  private countingBackend: number | undefined;

  constructor(
    private readonly pool: pg.Pool,
    private readonly storage: PostgresStorageConfig,
    private readonly tuning: Readonly<PostgresTuning>,
    private readonly notifier: DueNotifier,
    /** The delivered events' counts /metrics shows, recounted in the background with countDelivered. */
    private readonly delivered: DeliveredCounts,
  ) {}

  async list(filter: { status?: DeliveryStatus; endpoint?: string; limit?: number }): Promise<StoredEvent[]> {
    const { sql, params } = listSql(
      { endpoint: filter.endpoint },
      filter.status ? [filter.status] : [],
      undefined,
      filter.limit ?? 100,
      'e.*',
    );
    return (await this.pool.query<EventRow>(sql, params)).rows.map(toEvent);
  }

  /** See EventStore.listPage: the newest attempt of each row of the page through the attempts' primary key. */
  async listPage(filter: EventFilter, page: { limit: number; after?: EventPageKey }): Promise<EventListing[]> {
    const { sql, params } = listSql(
      filter,
      filter.status ? [filter.status] : [],
      page.after,
      page.limit,
      LISTING_COLUMNS,
    );
    const { rows } = await this.pool.query<EventRow & { last_attempt_at: number | null; last_status: number | null }>(
      sql,
      params,
    );
    return rows.map(toEventListing);
  }

  async matchingKeys(
    filter: EventFilter,
    statuses: readonly DeliveryStatus[],
    after: EventPageKey | undefined,
    limit: number,
  ): Promise<EventPageKey[]> {
    const { sql, params } = listSql(filter, statuses, after, limit, 'e.id, e.received_at AS "receivedAt"');
    return (await this.pool.query<EventPageKey>(sql, params)).rows;
  }

  /** requeueMatching's update (see REQUEUE_IDS_SQL); wakes the deliverers when it changed anything. */
  async requeueIds(ids: readonly string[], now: number, includeDelivered: boolean): Promise<number> {
    const { rowCount } = await this.pool.query(REQUEUE_IDS_SQL, [ids, now, includeDelivered]);
    if (rowCount) this.notifier.requeued();
    return rowCount ?? 0;
  }

  async get(id: string): Promise<EventDetail | undefined> {
    const { rows } = await this.pool.query<EventRow & { headers: string | null }>(
      'SELECT * FROM events WHERE id = $1',
      [id],
    );
    if (rows.length === 0) return undefined;
    const attempts = await this.pool.query<{
      attempt: number;
      at: number;
      status: number | null;
      error: string | null;
      duration_ms: number;
      response_snippet: string | null;
    }>(
      'SELECT attempt, at, status, error, duration_ms, response_snippet FROM attempts WHERE event_id = $1 ORDER BY attempt',
      [id],
    );
    return {
      event: toEvent(rows[0]!),
      attempts: attempts.rows.map((a) => ({
        attempt: a.attempt,
        at: a.at,
        status: a.status,
        error: a.error,
        durationMs: a.duration_ms,
        responseSnippet: a.response_snippet,
      })),
      headers: rows[0]!.headers,
    };
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
    if (rowCount) this.notifier.requeued();
    return rowCount === 1;
  }

  async requeueDead(now: number): Promise<number> {
    return this.requeueAll(
      "UPDATE events SET status = 'queued', round_attempts = 0, next_attempt_at = $1::bigint WHERE status = 'dead'",
      now,
    );
  }

  async requeueWaiting(now: number): Promise<number> {
    return this.requeueAll(
      "UPDATE events SET round_attempts = 0, next_attempt_at = $1::bigint WHERE status = 'queued' AND lease_until IS NULL AND next_attempt_at > $1::bigint",
      now,
    );
  }

  /** One UPDATE (row locks only: the instances keep accepting and claiming the rest) making events due at `now` ($1); wakes the deliverers. */
  private async requeueAll(sql: string, now: number): Promise<number> {
    const { rowCount } = await this.pool.query(sql, [now]);
    if (rowCount) this.notifier.requeued();
    return rowCount ?? 0;
  }

  async purgeDelivered(olderThan: number, now: number): Promise<PurgeResult> {
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
    let keptInWindow = 0;
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
      // The page's rows the delete left are the ones whose delivery id is still remembered.
      keptInWindow += rows.length - (rowCount ?? 0);
      cursor = rows.at(-1)!;
    }
    return { purged, keptInWindow };
  }

  async status(now: number): Promise<StoreStatus> {
    const counts: Record<DeliveryStatus, number> = { queued: 0, delivered: 0, dead: 0 };
    const { rows } = await this.pool.query<{ status: DeliveryStatus; n: number }>(
      'SELECT status, count(*) AS n FROM events GROUP BY status',
    );
    for (const row of rows) counts[row.status] = row.n;
    const leased = await this.pool.query<{ n: number }>(
      "SELECT count(*) AS n FROM events WHERE status = 'queued' AND lease_until > $1::bigint",
      [now],
    );
    return {
      driver: 'postgres',
      location: describeUrl(this.storage.url),
      schemaVersion: await schemaVersion(this.pool),
      counts,
      leased: leased.rows[0]!.n,
    };
  }

  async queueStats(now: number): Promise<QueueStats> {
    const delivered = await this.delivered.get(now); // first: it may wait, and the rest is then read as of the same moment
    const { rows } = await this.pool.query<{ action: WebhookAction; status: DeliveryStatus; n: number }>(
      UNDELIVERED_COUNTS_SQL,
    );
    const counts = rows.map((row) => ({ action: row.action, status: row.status, events: row.n }));
    for (const [action, events] of delivered ?? []) counts.push({ action, status: 'delivered', events });
    const due = await this.pool.query<{ at: number | null }>(
      `SELECT least(${oldestUnleasedSql('$1')},
                    (SELECT min(next_attempt_at) FROM events WHERE status = 'queued' AND lease_until IS NOT NULL)) AS at`,
      [webhookActions],
    );
    const oldest = due.rows[0]?.at ?? null;
    return {
      counts,
      deliveredCounted: delivered !== undefined,
      oldestDueAt: oldest !== null && oldest <= now ? oldest : undefined,
    };
  }

  /**
   * Every delivered event counted, per action (a read of them all: see DeliveredCounts), with
   * deliveredCountTimeoutMs rather than the pool's query_timeout: on a store of tens of
   * millions it takes longer, and runs in the background.
   */
  async countDelivered(): Promise<Map<WebhookAction, number>> {
    const { rows } = await withClient(this.pool, async (client) => {
      this.countingBackend = (await client.query<{ pid: number }>('SELECT pg_backend_pid() AS pid')).rows[0]!.pid;
      try {
        return await client.query<{ action: WebhookAction; n: number }>({
          text: "SELECT action, count(*) AS n FROM events WHERE status = 'delivered' GROUP BY action",
          query_timeout: this.tuning.deliveredCountTimeoutMs,
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

  /** Cancels a recount under way: it would hold its connection, and so pool.end(), for as long as it takes (minutes on a big store). */
  async cancelCount(): Promise<void> {
    if (this.countingBackend !== undefined)
      await this.pool.query('SELECT pg_cancel_backend($1)', [this.countingBackend]).catch(() => {});
  }
}
