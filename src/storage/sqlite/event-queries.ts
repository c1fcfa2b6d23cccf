import type Database from 'better-sqlite3';
import {
  toEvent,
  toEventListing,
  type DeliveryStatus,
  type EventFilter,
  type EventListing,
  type EventPageKey,
  type EventRow,
  type RequeueSteps,
  type StoredEvent,
} from '../contracts/events.js';

/**
 * The SQLite driver's operator queries (listPage, requeueMatching's steps): one statement per
 * shape of filter, prepared once per connection. Without `q` each is answered through an index
 * ordered by (received_at, id): events_received, events_status_received or
 * events_endpoint_received (migration 2); test/webhooks/event-queries-plan.test.ts checks the plans.
 */
export class SqliteEventQueries implements RequeueSteps {
  private readonly prepared = new Map<string, Database.Statement>();

  constructor(private readonly db: Database.Database) {}

  listPage(filter: EventFilter, page: { limit: number; after?: EventPageKey }): EventListing[] {
    const { sql, params } = listSql(filter, filter.status ? [filter.status] : [], page.after, page.limit);
    return (
      this.statement(sql).all(params) as (EventRow & { last_attempt_at: number | null; last_status: number | null })[]
    ).map(toEventListing);
  }

  /** EventStore.list: whole rows. */
  list(filter: { status?: DeliveryStatus; endpoint?: string; limit?: number }): StoredEvent[] {
    const { sql, params } = listSql(
      { endpoint: filter.endpoint },
      filter.status ? [filter.status] : [],
      undefined,
      filter.limit ?? 100,
      '*',
    );
    return (this.statement(sql).all(params) as EventRow[]).map(toEvent);
  }

  async matchingKeys(
    filter: EventFilter,
    statuses: readonly DeliveryStatus[],
    after: EventPageKey | undefined,
    limit: number,
  ): Promise<EventPageKey[]> {
    const { sql, params } = listSql(filter, statuses, after, limit, 'id, received_at AS receivedAt');
    return this.statement(sql).all(params) as EventPageKey[];
  }

  async requeueIds(ids: readonly string[], now: number, includeDelivered: boolean): Promise<number> {
    const result = this.statement(REQUEUE_IDS_SQL).run({
      ids: JSON.stringify(ids),
      now,
      delivered: includeDelivered ? 1 : 0,
    });
    // The event loop is free between chunks (the server's group commits get in between).
    await new Promise((r) => setImmediate(r));
    return result.changes;
  }

  private statement(sql: string): Database.Statement {
    let statement = this.prepared.get(sql);
    if (!statement) {
      statement = this.db.prepare(sql);
      this.prepared.set(sql, statement);
    }
    return statement;
  }
}

/**
 * A queued event waiting for a retry is in no one's hands (the server leases only due ones); one
 * already due is left alone, so a repeated request changes nothing the first did not.
 */
const REQUEUE_IDS_SQL = `UPDATE events SET status = 'queued', round_attempts = 0, next_attempt_at = @now, delivered_at = NULL
  WHERE id IN (SELECT value FROM json_each(@ids))
    AND (status = 'dead' OR (status = 'queued' AND next_attempt_at > @now) OR (@delivered = 1 AND status = 'delivered'))`;

/**
 * The ids of events whose delivery id is @q, through events_idempotency (endpoint, idempotency_key):
 * one probe per endpoint in the store, the endpoints walked along events_endpoint_received (a loose
 * index scan), because that index starts with the endpoint.
 */
const DELIVERY_ID_SQL = `WITH RECURSIVE eps(endpoint) AS (
    SELECT (SELECT min(endpoint) FROM events)
    UNION ALL SELECT (SELECT min(endpoint) FROM events WHERE endpoint > eps.endpoint) FROM eps WHERE eps.endpoint IS NOT NULL)
  SELECT x.id FROM eps JOIN events x ON x.endpoint = eps.endpoint AND x.idempotency_key = @q`;

const LISTING_COLUMNS = `id, endpoint, action, idempotency_key, received_at, status, attempts, round_attempts,
  next_attempt_at, last_error, delivered_at,
  (SELECT at FROM attempts a WHERE a.event_id = events.id ORDER BY attempt DESC LIMIT 1) AS last_attempt_at,
  (SELECT status FROM attempts a WHERE a.event_id = events.id ORDER BY attempt DESC LIMIT 1) AS last_status`;

/** The SELECT for a filter: named parameters, so the SQL text depends only on which fields are set. */
export function listSql(
  filter: EventFilter,
  statuses: readonly DeliveryStatus[],
  after: EventPageKey | undefined,
  limit: number,
  columns = LISTING_COLUMNS,
): { sql: string; params: Record<string, string | number> } {
  const where: string[] = [];
  const params: Record<string, string | number> = { limit };
  if (statuses.length === 1) {
    where.push('status = @status0');
    params.status0 = statuses[0]!;
  } else if (statuses.length > 1) {
    where.push(`status IN (${statuses.map((_, i) => `@status${i}`).join(', ')})`);
    statuses.forEach((s, i) => (params[`status${i}`] = s));
  }
  if (filter.endpoint !== undefined) {
    where.push('endpoint = @endpoint');
    params.endpoint = filter.endpoint;
  }
  if (filter.action !== undefined) {
    where.push('action = @action');
    params.action = filter.action;
  }
  if (filter.since !== undefined) {
    where.push('received_at >= @since');
    params.since = filter.since;
  }
  if (filter.until !== undefined) {
    where.push('received_at < @until');
    params.until = filter.until;
  }
  if (filter.q !== undefined) {
    where.push(
      filter.qMatch === 'id'
        ? `id IN (SELECT @q UNION ALL SELECT * FROM (${DELIVERY_ID_SQL}))`
        : filter.qMatch === 'text'
          ? 'instr(envelope, @q) > 0'
          : '(id = @q OR idempotency_key = @q OR instr(envelope, @q) > 0)',
    );
    params.q = filter.q;
  }
  if (after) {
    where.push('(received_at, id) < (@afterAt, @afterId)');
    params.afterAt = after.receivedAt;
    params.afterId = after.id;
  }
  const sql = `SELECT ${columns} FROM events ${where.length ? `WHERE ${where.join(' AND ')}` : ''}
    ORDER BY received_at DESC, id DESC LIMIT @limit`;
  return { sql, params };
}
