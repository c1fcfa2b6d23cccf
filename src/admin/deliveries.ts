import { webhookActions, type WebhookAction } from '../config/schema.js';
import { HttpError } from '../errors.js';
import {
  DELIVERY_STATUSES,
  type AttemptRecord,
  type DeliveryStatus,
  type EventFilter,
  type EventListing,
  type EventPageKey,
  type EventStore,
  type StoredEvent,
} from '../storage/contracts/events.js';

/**
 * What the admin API (src/admin/events-api.ts) and `gatehouse webhooks deliveries` share: parsing
 * an operator's filter, keyset pages with an opaque cursor, an event's detail, and retries. The
 * store does the work (EventStore.listPage, requeueMatching); this module shapes it.
 */

export const DEFAULT_PAGE = 50;
export const MAX_PAGE = 200;
/** At most this many ids in one retry by ids. */
export const MAX_RETRY_IDS = 1_000;
const MAX_TEXT = 256;
const FILTER_FIELDS = ['status', 'endpoint', 'action', 'since', 'until', 'q'] as const;
const ISO_TIME = /^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2}(\.\d{1,3})?)?(Z|[+-]\d{2}:\d{2}))?$/;

/** One row of the list as the API answers it (times ISO 8601). */
export interface EventSummary {
  id: string;
  endpoint: string;
  action: WebhookAction;
  status: DeliveryStatus;
  receivedAt: string;
  attempts: number;
  lastAttemptAt: string | null;
  lastStatus: number | null;
  lastError: string | null;
  deliveryId: string | null;
}

export interface EventPage {
  events: EventSummary[];
  /** Give it back as `cursor` for the next page; null when this page is the last. */
  nextCursor: string | null;
}

/** A retry: these ids, or whatever matches the filter. */
export type RetryRequest = ({ ids: string[] } | { filter: EventFilter }) & { includeDelivered: boolean };

const invalid = (detail: string) => new HttpError('invalid_parameter', detail);

/** A filter field's value, checked: 400 `invalid_parameter` naming the field otherwise. */
function filterField(filter: EventFilter, name: (typeof FILTER_FIELDS)[number], value: unknown): void {
  if (typeof value !== 'string' || value.length === 0 || value.length > MAX_TEXT)
    throw invalid(`${name}: a string of 1 to ${MAX_TEXT} characters`);
  switch (name) {
    case 'status':
      if (!DELIVERY_STATUSES.includes(value as DeliveryStatus))
        throw invalid(`status: one of ${DELIVERY_STATUSES.join(', ')}`);
      filter.status = value as DeliveryStatus;
      return;
    case 'endpoint':
      if (!value.startsWith('/')) throw invalid('endpoint: a path, /webhook/…');
      filter.endpoint = value;
      return;
    case 'action':
      if (!webhookActions.includes(value as WebhookAction))
        throw invalid(`action: one of ${webhookActions.join(', ')}`);
      filter.action = value as WebhookAction;
      return;
    case 'since':
    case 'until': {
      const at = ISO_TIME.test(value) ? Date.parse(value) : NaN;
      if (!Number.isFinite(at)) throw invalid(`${name}: an ISO 8601 time, e.g. 2026-11-23T10:00:00Z`);
      filter[name] = at;
      return;
    }
    case 'q':
      filter.q = value;
  }
}

/** A filter object (a retry's body), checked field by field; unknown fields are refused. */
export function parseFilter(input: unknown): EventFilter {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) throw invalid('filter: an object');
  const filter: EventFilter = {};
  for (const [name, value] of Object.entries(input)) {
    if (!(FILTER_FIELDS as readonly string[]).includes(name)) throw invalid(`filter.${name}: unknown field`);
    filterField(filter, name as (typeof FILTER_FIELDS)[number], value);
  }
  return filter;
}

/** The list's query string: the filter, `limit` (1 to MAX_PAGE) and `cursor`; unknown or repeated parameters are refused. */
export function parseListQuery(query: URLSearchParams): { filter: EventFilter; limit: number; after?: EventPageKey } {
  const filter: EventFilter = {};
  let limit = DEFAULT_PAGE;
  let after: EventPageKey | undefined;
  for (const name of new Set(query.keys())) {
    const values = query.getAll(name);
    if (values.length > 1) throw invalid(`${name}: given more than once`);
    const value = values[0]!;
    if (name === 'limit') {
      limit = /^\d{1,3}$/.test(value) ? Number(value) : NaN;
      if (!(limit >= 1 && limit <= MAX_PAGE)) throw invalid(`limit: an integer from 1 to ${MAX_PAGE}`);
    } else if (name === 'cursor') after = decodeCursor(value);
    else if ((FILTER_FIELDS as readonly string[]).includes(name))
      filterField(filter, name as (typeof FILTER_FIELDS)[number], value);
    else throw invalid(`${name}: unknown parameter`);
  }
  return { filter, limit, ...(after && { after }) };
}

/** The last row's key, base64url JSON: opaque to clients, checked when it comes back. */
export function encodeCursor(key: EventPageKey): string {
  return Buffer.from(JSON.stringify([key.receivedAt, key.id])).toString('base64url');
}

export function decodeCursor(cursor: string): EventPageKey {
  let key: unknown;
  try {
    key = /^[A-Za-z0-9_-]{1,400}$/.test(cursor) ? JSON.parse(Buffer.from(cursor, 'base64url').toString()) : undefined;
  } catch {
    key = undefined;
  }
  if (
    !Array.isArray(key) ||
    key.length !== 2 ||
    !Number.isSafeInteger(key[0]) ||
    typeof key[1] !== 'string' ||
    key[1].length > MAX_TEXT
  )
    throw new HttpError('invalid_cursor', `cursor ${cursor.slice(0, 40)}`);
  return { receivedAt: key[0] as number, id: key[1] };
}

/**
 * One page, newest first. One row more than `limit` is read, so `nextCursor` is null exactly when
 * nothing older matches (as of this read: events arriving later are newer, and never on a later page).
 */
export async function listEvents(
  store: EventStore,
  query: { filter: EventFilter; limit: number; after?: EventPageKey },
): Promise<{ events: EventListing[]; nextCursor: string | null }> {
  const filter = await resolveQuery(store, query.filter);
  const rows = await store.listPage(filter, { limit: query.limit + 1, after: query.after });
  const events = rows.slice(0, query.limit);
  const last = events.at(-1);
  return { events, nextCursor: rows.length > query.limit && last ? encodeCursor(last) : null };
}

export function summaryOf(e: EventListing): EventSummary {
  return {
    id: e.id,
    endpoint: e.endpoint,
    action: e.action,
    status: e.status,
    receivedAt: new Date(e.receivedAt).toISOString(),
    attempts: e.attempts,
    lastAttemptAt: e.lastAttemptAt === null ? null : new Date(e.lastAttemptAt).toISOString(),
    lastStatus: e.lastStatus,
    lastError: e.lastError,
    deliveryId: e.idempotencyKey,
  };
}

/**
 * One event for the API: its summary, when it is next tried or was delivered, the envelope (as the
 * target gets it, parsed), the headers it came with (credentials and signatures already redacted
 * when stored, src/webhooks/received-headers.ts; null for events stored before they were kept),
 * and every attempt with the start of the target's answer.
 */
export async function showEvent(store: EventStore, id: string) {
  const found = await store.get(id);
  if (!found) return undefined;
  const { event, attempts, headers } = found;
  const last = attempts.at(-1);
  return {
    ...summaryOf({ ...event, lastAttemptAt: last?.at ?? null, lastStatus: last?.status ?? null }),
    nextAttemptAt: event.status === 'queued' ? new Date(event.nextAttemptAt).toISOString() : null,
    deliveredAt: event.deliveredAt === null ? null : new Date(event.deliveredAt).toISOString(),
    envelope: parseEnvelope(event),
    headers: parseHeaders(headers),
    attempts: attempts.map(attemptOf),
  };
}

function parseEnvelope(event: StoredEvent): unknown {
  try {
    return JSON.parse(event.envelope);
  } catch {
    return event.envelope; // stored by an integration as text: shown as it is
  }
}

/** The stored headers as an object; null when none were stored, or (never written so) not an object. */
function parseHeaders(headers: string | null): Record<string, string | string[]> | null {
  if (headers === null) return null;
  try {
    const parsed: unknown = JSON.parse(headers);
    return typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed)
      ? (parsed as Record<string, string | string[]>)
      : null;
  } catch {
    return null;
  }
}

function attemptOf(a: AttemptRecord) {
  return {
    attempt: a.attempt,
    at: new Date(a.at).toISOString(),
    durationMs: a.durationMs,
    status: a.status,
    error: a.error,
    responseSnippet: a.responseSnippet ?? null,
  };
}

/** A retry's JSON body: `{ ids }` or `{ filter }`, and `includeDelivered` (default false). */
export function parseRetryRequest(body: unknown): RetryRequest {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw invalid('body: a JSON object');
  const { ids, filter, includeDelivered = false, ...rest } = body as Record<string, unknown>;
  const unknown = Object.keys(rest)[0];
  if (unknown !== undefined) throw invalid(`${unknown}: unknown field`);
  if (typeof includeDelivered !== 'boolean') throw invalid('includeDelivered: true or false');
  if ((ids === undefined) === (filter === undefined)) throw invalid('give one of ids, filter');
  if (ids !== undefined) {
    if (
      !Array.isArray(ids) ||
      ids.length === 0 ||
      ids.length > MAX_RETRY_IDS ||
      !ids.every((id) => typeof id === 'string' && id.length > 0 && id.length <= MAX_TEXT)
    )
      throw invalid(`ids: 1 to ${MAX_RETRY_IDS} event ids`);
    return { ids: [...new Set(ids as string[])], includeDelivered };
  }
  return { filter: parseFilter(filter), includeDelivered };
}

/**
 * Dead events and queued ones waiting for a retry become due at `now` (delivered ones too with
 * includeDelivered); returns how many. A queued event already due is left alone, so sending the
 * same request again changes nothing unless an event has since died, or been delivered (and then
 * only with includeDelivered).
 */
export async function retryEvents(store: EventStore, request: RetryRequest, now: number): Promise<number> {
  const target = 'ids' in request ? { ids: request.ids } : { filter: await resolveQuery(store, request.filter) };
  return store.requeueMatching(target, now, { includeDelivered: request.includeDelivered });
}

/**
 * How `q` matches (EventFilter.qMatch): an event id or a delivery id pasted into it finds its events
 * by index, at once on any store; only when nothing has that id is it looked for as text in the
 * envelopes. Decided without the cursor, so every page of a query, and a retry of it, match alike.
 */
async function resolveQuery(store: EventStore, filter: EventFilter): Promise<EventFilter> {
  if (filter.q === undefined || filter.qMatch !== undefined) return filter;
  const byId = await store.listPage({ ...filter, qMatch: 'id' }, { limit: 1 });
  return { ...filter, qMatch: byId.length > 0 ? 'id' : 'text' };
}
