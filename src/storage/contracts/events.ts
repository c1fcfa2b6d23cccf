import { randomUUID } from 'node:crypto';
import type { WebhookAction } from '../../config/schema.js';

/**
 * The webhook event store's contract: what the receiver, the deliverer and the CLI ask of
 * durable storage, with no SQL in sight. One driver per engine implements it
 * (src/storage/sqlite/events.ts, src/storage/postgres/events.ts), and the same contract tests
 * run against each (test/webhooks/store-contract.ts).
 */

export type DeliveryStatus = 'queued' | 'delivered' | 'dead';
export const DELIVERY_STATUSES: readonly DeliveryStatus[] = ['queued', 'delivered', 'dead'];

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
  /**
   * The request's headers as stored for the operator: a JSON object, credentials and signatures
   * already redacted and its size capped (src/webhooks/received-headers.ts). None: stored as null.
   */
  headers?: string;
  /**
   * The W3C `traceparent` of the span that received the event (src/observability/tracing.ts): each
   * delivery attempt is its child, wherever and whenever it runs. None (tracing off): stored as null.
   */
  traceContext?: string;
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
  /** Attempts since accepted or last requeued: what delivery.maxAttempts counts. */
  roundAttempts: number;
  nextAttemptAt: number;
  lastError: string | null;
  deliveredAt: number | null;
}

/**
 * An event leased by `claimDue`. `claimId` is the lease's fencing token: fresh on every claim, so
 * once the lease has passed to someone else, the previous holder's outcome and renewals no
 * longer match and are ignored.
 */
export interface ClaimedEvent extends StoredEvent {
  claimId: string;
  leaseUntil: number;
  /** The receive span's traceparent (NewEvent.traceContext); absent or null when none was stored. */
  traceContext?: string | null;
}

export interface AttemptRecord {
  attempt: number;
  at: number;
  /** HTTP status, or null when no response came (see error). */
  status: number | null;
  error: string | null;
  durationMs: number;
  /**
   * The start of the target's answer body (src/webhooks/delivery/deliverer.ts, RESPONSE_SNIPPET_BYTES):
   * null (or left out) when no answer or an empty body came. Stores give it back as null when none.
   */
  responseSnippet?: string | null;
}

/** One event as `get` finds it: the row, every attempt, and the received headers (JSON text; null before schema 3/8). */
export interface EventDetail {
  event: StoredEvent;
  attempts: AttemptRecord[];
  headers: string | null;
}

export type AttemptOutcome = { status: 'delivered' } | { status: 'queued'; nextAttemptAt: number } | { status: 'dead' };

/**
 * Accepted: a new event id; or a repeat (`duplicate`, with the first event's id): a delivery id
 * seen within the idempotency window, or a replay key still on file.
 */
export type AcceptResult = { id: string; duplicate: boolean };

/** What `gatehouse storage status` shows. */
export interface StoreStatus {
  driver: 'sqlite' | 'postgres';
  /** Where: the file, or the database URL without its password. */
  location: string;
  schemaVersion: number;
  counts: Record<DeliveryStatus, number>;
  /** Queued events under a lease that has not run out (being delivered). */
  leased: number;
}

/** What /metrics shows of the queue (src/admin/listener.ts), computed when scraped. */
export interface QueueStats {
  /**
   * Events per action and status; pairs with none are left out. Queued and dead ones are counted
   * at each call (through indexes: as many rows as there are); delivered ones, which pile up
   * until purged, as of the last recount (DeliveredCounts), and only when `deliveredCounted`.
   */
  counts: { action: WebhookAction; status: DeliveryStatus; events: number }[];
  /** false while no delivered count has landed yet (the first one after a start is still running, or failed): delivered is unknown, not 0. */
  deliveredCounted: boolean;
  /** The earliest `nextAttemptAt` among queued events already due (leased ones included), if any. */
  oldestDueAt: number | undefined;
}

/** How old the delivered counts of queueStats may get before a recount is started. */
export const DELIVERED_RECOUNT_MS = 60_000;

/** How long the first scrape after a start waits for the first delivered count before it goes without. */
export const DELIVERED_FIRST_WAIT_MS = 2_000;

/**
 * queueStats' delivered counts. Counting every delivered event reads them all (measured at
 * 1,000,000: 130 ms of the SQLite driver's event loop, 450 ms of a Postgres backend) and a
 * scrape comes every 15 s or so; so they are recounted in the background once the last count is
 * DELIVERED_RECOUNT_MS old (or the clock went back), and a scrape meanwhile gets the last count.
 * Before the first count has landed a call waits for it until `firstWaitMs` after it started,
 * then gets undefined (unknown): at tens of millions of delivered events the first count outlasts a
 * scrape's timeout, and the queued and dead counts must not wait for it. A failed count (the
 * first one too) is reported to `onError` and tried again DELIVERED_RECOUNT_MS later, the last
 * count (if any) kept meanwhile.
 */
export class DeliveredCounts {
  private counts: Map<WebhookAction, number> | undefined;
  /** When the last count, or the last failed attempt at one, started. */
  private triedAt = 0;
  private counting: Promise<Map<WebhookAction, number>> | undefined;
  /** The last try failed. */
  private failed = false;

  constructor(
    private readonly recount: () => Promise<Map<WebhookAction, number>>,
    private readonly onError: (err: unknown) => void = () => {},
    private readonly firstWaitMs = DELIVERED_FIRST_WAIT_MS,
  ) {}

  /** The last count, or undefined while there is none yet (the first one still running, or failed). */
  async get(now: number): Promise<Map<WebhookAction, number> | undefined> {
    const recountDue = now - this.triedAt >= DELIVERED_RECOUNT_MS || now < this.triedAt;
    if (this.counts !== undefined) {
      if (recountDue) void this.start(now).catch(() => {});
      return this.counts;
    }
    // None yet because the last try failed: the next try comes an interval later, not at every scrape
    // (a count that a statement timeout always cuts short would otherwise run back to back).
    if (this.failed && this.counting === undefined && !recountDue) return undefined;
    return this.waitForFirst(now);
  }

  /** Waits for the first count until firstWaitMs after it started: a scrape during a long first count answers at once. */
  private async waitForFirst(now: number): Promise<Map<WebhookAction, number> | undefined> {
    const counting = this.start(now).catch(() => undefined);
    const waitMs = this.firstWaitMs - (now - this.triedAt);
    if (waitMs <= 0) return undefined;
    let timer: NodeJS.Timeout | undefined;
    const givenUp = new Promise<undefined>((resolve) => {
      timer = setTimeout(() => resolve(undefined), waitMs);
    });
    try {
      return await Promise.race([counting, givenUp]);
    } finally {
      clearTimeout(timer);
    }
  }

  private start(now: number): Promise<Map<WebhookAction, number>> {
    if (this.counting) return this.counting;
    this.triedAt = now;
    this.counting = this.recount().then(
      (counts) => {
        this.counts = counts;
        this.counting = undefined;
        this.failed = false;
        return counts;
      },
      (err: unknown) => {
        this.counting = undefined;
        this.failed = true;
        this.onError(err);
        throw err;
      },
    );
    return this.counting;
  }
}

/**
 * One event as `gatehouse storage copy` moves it from one driver to another: the row exactly as
 * stored (status, attempt counts, next attempt, last error, delivered time, delivery id), every
 * attempt record, and the replay keys that point at it. No lease: a copied event is unclaimed.
 */
export interface ExportedEvent {
  event: StoredEvent;
  /** The received headers as stored (see EventDetail). */
  headers: string | null;
  /** The receive span's traceparent as stored (NewEvent.traceContext). */
  traceContext?: string | null;
  attempts: AttemptRecord[];
  /** Replay keys (see NewEvent.replayKey) that point at this event, with the endpoint each is under. */
  replayKeys: { endpoint: string; replayKey: string }[];
}

/**
 * Which events an operator means (the admin API's list and retry, the CLI's `deliveries`): every
 * field narrows. Times are ms; `since` inclusive, `until` exclusive, both on `receivedAt`. `q`
 * matches the event id or the sender's delivery id exactly, or is found in the envelope's text
 * (case-sensitive; the one part that reads every candidate row's envelope).
 */
export interface EventFilter {
  status?: DeliveryStatus;
  endpoint?: string;
  action?: WebhookAction;
  since?: number;
  until?: number;
  q?: string;
  /**
   * How `q` matches: `id`, the event id or the sender's delivery id exactly (index lookups, at once
   * on any store); `text`, text in the envelope (reads envelopes until a page is found). Unset: either
   * (reads envelopes). The admin layer picks one per query (src/admin/deliveries.ts, resolveQuery).
   */
  qMatch?: 'id' | 'text';
}

/** Where a page of `listPage` starts: strictly after this row in (receivedAt DESC, id DESC) order. */
export interface EventPageKey {
  receivedAt: number;
  id: string;
}

/** One row of `listPage`: the event without its envelope, and what its last attempt said. */
export interface EventListing extends Omit<StoredEvent, 'envelope'> {
  lastAttemptAt: number | null;
  /** The last attempt's HTTP status; null with no attempt, or when it got no response. */
  lastStatus: number | null;
}

/** What `requeueMatching` may requeue besides dead events and queued ones waiting for a retry. */
export interface RequeueOptions {
  /** Delivered events too (sent again). */
  includeDelivered: boolean;
  /** Rows read and updated per statement (each its own short transaction). */
  chunk?: number;
}

/** requeueMatching's chunks, unless told otherwise. */
export const REQUEUE_CHUNK = 500;

/** What requeueMatching requeues: these ids, or every event matching the filter. */
export type RequeueTarget = { ids: readonly string[] } | { filter: EventFilter };

/** A driver's two steps for requeueMatching; see requeueInChunks. */
export interface RequeueSteps {
  /** Keys of up to `limit` events matching `filter` whose status is one of `statuses`, after `after` (listPage's order). */
  matchingKeys(
    filter: EventFilter,
    statuses: readonly DeliveryStatus[],
    after: EventPageKey | undefined,
    limit: number,
  ): Promise<EventPageKey[]>;
  /** requeueMatching's update for these ids (one statement); how many it changed. */
  requeueIds(ids: readonly string[], now: number, includeDelivered: boolean): Promise<number>;
}

/**
 * requeueMatching for every driver: ids a chunk at a time, or the filter's candidates walked by
 * keyset a chunk at a time, one requeueable status after the other, each chunk one short update.
 */
export async function requeueInChunks(
  target: RequeueTarget,
  now: number,
  options: RequeueOptions,
  steps: RequeueSteps,
): Promise<number> {
  const chunk = options.chunk ?? REQUEUE_CHUNK;
  let requeued = 0;
  if ('ids' in target) {
    for (let i = 0; i < target.ids.length; i += chunk)
      requeued += await steps.requeueIds(target.ids.slice(i, i + chunk), now, options.includeDelivered);
    return requeued;
  }
  const { filter } = target;
  // Delivered first: an event this walk requeues may be delivered before the walk ends, and must not
  // be found again among the delivered (found by an outside attack: 53 of 2,500 sent twice). What the
  // dead walk requeues is due at once, which the queued walk leaves alone.
  const requeueable: DeliveryStatus[] = [...(options.includeDelivered ? ['delivered' as const] : []), 'dead', 'queued'];
  const statuses = filter.status ? requeueable.filter((s) => s === filter.status) : requeueable;
  if (statuses.length === 0) return 0;
  // One status at a time: each walk follows one index in (received_at, id) order, with no sort.
  for (const status of statuses) {
    let after: EventPageKey | undefined;
    for (;;) {
      const keys = await steps.matchingKeys(filter, [status], after, chunk);
      if (keys.length > 0)
        requeued += await steps.requeueIds(
          keys.map((k) => k.id),
          now,
          options.includeDelivered,
        );
      if (keys.length < chunk) break;
      after = keys.at(-1);
    }
  }
  return requeued;
}

/** What purgeDelivered did. */
export interface PurgeResult {
  /** Delivered events deleted (with their attempts and replay keys). */
  purged: number;
  /**
   * Delivered before the cutoff but kept: their delivery id is still remembered (received less than
   * IDEMPOTENCY_WINDOW_MS ago). A later purge takes them once the window has passed.
   */
  keptInWindow: number;
}

/** What a copy wrote. */
export interface CopyCounts {
  events: number;
  byStatus: Record<DeliveryStatus, number>;
  attempts: number;
  /** Events carrying a sender's delivery id (deduped against for IDEMPOTENCY_WINDOW_MS after their receipt). */
  idempotencyKeys: number;
  replayKeys: number;
}

/**
 * Durable webhook state. `accept` resolves only once the event is committed. Every lease is
 * fenced: an outcome or a renewal carrying a claim id that is no longer the event's current one
 * changes nothing.
 */
export interface EventStore {
  accept(event: NewEvent): Promise<AcceptResult>;
  /**
   * Leases up to `limit` due events of one action, earliest first: no one else gets them until
   * `leaseMs` passes (or the lease is renewed). An expired lease is claimable again.
   */
  claimDue(now: number, limit: number, leaseMs: number, action: WebhookAction): Promise<ClaimedEvent[]>;
  /**
   * Records an attempt and settles the event. With `claimId`, only while that claim is still the
   * event's current one (false, nothing written, otherwise); without, unconditionally (tests,
   * tools). Rejects on a repeated attempt number, writing nothing.
   */
  recordAttempt(id: string, attempt: AttemptRecord, outcome: AttemptOutcome, claimId?: string): Promise<boolean>;
  /** Extends a lease still held under `claimId` until `leaseUntil`; false when it has passed to another claim. */
  renewLease(id: string, claimId: string, leaseUntil: number): Promise<boolean>;
  /** Frees every lease this store (this process) holds (a deliverer starting afresh); returns how many. */
  releaseLeases(): Promise<number>;
  /** The earliest time a queued event can be claimed (a leased one counts from its lease's end), if any. */
  nextDueAt(now: number): Promise<number | undefined>;
  /**
   * Calls `wake` when another process may have made an event due (an accept or a requeue there);
   * returns the unsubscribe. Drivers shared by several processes implement it; polling covers
   * the rest.
   */
  onDue?(wake: () => void): () => void;
  /** Up to `limit` (100) events, newest first, envelopes included (tests and tools; the same query as listPage's). */
  list(filter: { status?: DeliveryStatus; endpoint?: string; limit?: number }): Promise<StoredEvent[]>;
  /**
   * Up to `limit` events matching `filter`, newest first (receivedAt DESC, id DESC), after `after`
   * when given (keyset paging: events that arrive meanwhile never shift a later page). Envelopes
   * are not read.
   */
  listPage(filter: EventFilter, page: { limit: number; after?: EventPageKey }): Promise<EventListing[]>;
  /**
   * Makes due at `now`, with a fresh attempt budget, the events among `ids` (or, without ids, every
   * event matching `filter`) that are dead, queued waiting for a retry (next attempt after `now`,
   * no lease), or delivered with `includeDelivered`. A queued event already due is left as is, so
   * a repeat changes nothing that the first call has not already made due. Walks the matches
   * `chunk` at a time, each chunk its own short statement. Returns how many it requeued.
   */
  requeueMatching(target: RequeueTarget, now: number, options: RequeueOptions): Promise<number>;
  /** The event with its attempts (responseSnippet null when none) and its received headers. */
  get(id: string): Promise<EventDetail | undefined>;
  /**
   * Puts an event back in the queue, due at `now`, with a fresh attempt budget: a delivered or
   * dead one, or a queued one waiting for a retry (its next attempt after `now`, no lease). false
   * when unknown, or queued and already due (being delivered, or next in line): left as is.
   */
  requeue(id: string, now: number): Promise<boolean>;
  requeueDead(now: number): Promise<number>;
  /** Every queued event waiting for a retry (next attempt after `now`, no lease): due at `now`, with a fresh attempt budget. */
  requeueWaiting(now: number): Promise<number>;
  /**
   * Deletes events delivered before `olderThan`, with their attempts and replay keys (a replay of
   * one is then new). One whose delivery id is still remembered (received less than
   * IDEMPOTENCY_WINDOW_MS before `now`) stays until it is not: purging it would let the same id in again.
   * Says how many went and how many of those old enough stayed for that reason (counted in the same
   * walk over the last day's deliveries, no second query).
   */
  purgeDelivered(olderThan: number, now: number): Promise<PurgeResult>;
  status(now: number): Promise<StoreStatus>;
  /** The schema's version (migrations applied): one cheap read, unlike `status`'s counts. */
  schemaVersion(): Promise<number>;
  queueStats(now: number): Promise<QueueStats>;
  /**
   * Resolves once the store has taken a write by the path accept's writes take (SQLite: a row of
   * its own, rewritten; PostgreSQL: a statement that changes no row but is refused wherever
   * writes are); rejects when the store cannot write now (/readyz). Events are never touched.
   */
  probeWrite(): Promise<void>;
  close(): Promise<void>;
}

/**
 * How long a sender's delivery id is remembered: a repeat inside it is not delivered again.
 * (Some senders reuse ids after a while, e.g. Telegram's update_id; replay keys, digests of
 * signed bytes, are never reused by an honest sender and so have no window.)
 */
export const IDEMPOTENCY_WINDOW_MS = 24 * 60 * 60 * 1000;

/** `evt_` + a base36 millisecond prefix (time-ordered) + 80 random bits (randomUUID's pooled randomness). */
export function newEventId(now: number = Date.now()): string {
  const random = randomUUID();
  // 20 hex digits, leaving out the UUID's fixed version and variant digits (positions 14 and 19).
  return `evt_${now.toString(36).padStart(9, '0')}${random.slice(0, 8)}${random.slice(9, 13)}${random.slice(15, 18)}${random.slice(20, 23)}${random.slice(24, 26)}`;
}

/** The `lastError` an outcome leaves: none once delivered, else the error or the HTTP status. */
export function lastErrorOf(attempt: AttemptRecord, outcome: AttemptOutcome): string | null {
  return outcome.status === 'delivered' ? null : (attempt.error ?? `HTTP ${attempt.status}`);
}

/** An `events` row as both drivers store it (same column names and meanings; times in ms). */
export interface EventRow {
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

/** A listPage row (the event row without its envelope, and its last attempt's time and status) as the API sees it. */
export function toEventListing(
  row: Omit<EventRow, 'envelope'> & { last_attempt_at: number | null; last_status: number | null },
): EventListing {
  const { envelope: _, ...event } = toEvent({ ...row, envelope: '' });
  return { ...event, lastAttemptAt: row.last_attempt_at, lastStatus: row.last_status };
}

/** The row as the rest of gatehouse sees it. */
export function toEvent(row: EventRow): StoredEvent {
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
