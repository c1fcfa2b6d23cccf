import { randomUUID } from 'node:crypto';
import type pg from 'pg';
import { webhookActions, type WebhookAction } from '../../../config/schema.js';
import { toEvent, type ClaimedEvent, type EventRow as SharedEventRow, type NewEvent } from '../../contracts/events.js';
import { HandOverQueue } from '../../hand-over-queue.js';
import type { DueNotifier } from './notify.js';
import type { PostgresTuning } from './tuning.js';

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
     -- Not e.*: the received headers are the operator's, never the deliverer's.
     RETURNING e.id, e.endpoint, e.action, e.idempotency_key, e.received_at, e.envelope, e.status, e.attempts, e.round_attempts,
               e.next_attempt_at, e.last_error, e.delivered_at, e.lease_until, e.claim_id, e.lease_owner, e.trace_context)
   SELECT c.*, n.next_look FROM (
     SELECT CASE WHEN (SELECT count(*) FROM due) < $5 THEN least(
       (SELECT min(next_attempt_at) FROM events WHERE status = 'queued' AND lease_until IS NULL AND action = $4 AND next_attempt_at > $1::bigint),
       (SELECT min(lease_until) FROM events WHERE status = 'queued' AND lease_until > $1::bigint)) END AS next_look) n
   LEFT JOIN claimed c ON true`;

/** The earliest attempt time of any unleased queued event, the actions in `actions` (a text[] placeholder): one step into events_free per action. */
export const oldestUnleasedSql = (actions: string) => `(SELECT min(f.at) FROM unnest(${actions}::text[]) AS a(action)
   CROSS JOIN LATERAL (SELECT min(next_attempt_at) AS at FROM events WHERE status = 'queued' AND lease_until IS NULL AND action = a.action) f)`;

/** The shared row, plus the lease columns only this driver has. */
export interface EventRow extends SharedEventRow {
  lease_until: number | null;
  claim_id: string | null;
  trace_context?: string | null;
}

/** An accept on its way into the database, as the claims see it. */
export interface LeasableAccept {
  event: NewEvent;
  /** Assigned on first sight, kept across a retried batch (the envelope is built with it). */
  id: string;
  envelope?: string;
  /** Leased to this process's deliverer by the INSERT itself (it goes to the hand-over queue once committed). */
  lease?: { claimId: string; until: number };
}

/**
 * The delivering side: claims are leases (`lease_until`) with a fresh fencing token
 * (`claim_id`), taken with FOR UPDATE SKIP LOCKED so concurrent claimers never get the same row;
 * renewals apply only while the token matches; an expired lease is claimable again.
 *
 * Events accepted here are leased to this process's deliverer by their INSERT (once it has
 * claimed that action, so its lease time is known) and handed to it from the hand-over queue:
 * no claim query, no envelope read back, no NOTIFY (no one else could take them). If this
 * process dies they are claimable once the lease runs out, as any claim. The database is asked
 * for other work when something says it is there (an unleased accept, another instance's
 * NOTIFY, a requeue, a retry coming due) and at least every dbLookMs.
 */
export class Claims {
  /** Accepted here (leased to this process by the INSERT) or claimed from the database, not yet handed to the deliverer; per action, in claim order. */
  private readonly fresh: HandOverQueue<ClaimedEvent>;
  /** The lease each action's deliverer asks for, from its first claim: only those actions' accepts are leased on insert. */
  private readonly leaseMsByAction = new Map<WebhookAction, number>();
  /** When (this machine's clock) each action was last claimed: leasing accepts stops for one no longer claimed. */
  private readonly lastClaimAt = new Map<WebhookAction, number>();
  /** Actions whose claimable events in the database may include some this process has not looked for. */
  private readonly dbMayHaveDue = new Set<WebhookAction>(webhookActions);
  /** Per action, when something in the database next becomes claimable, as far as this process knows (a retry due, a lease running out). */
  private readonly nextDbLookAt = new Map<WebhookAction, number>();
  /** Per action, the last time the database was asked (it is asked again dbLookMs later in any case). */
  private readonly lastDbLookAt = new Map<WebhookAction, number>();
  /** Per action, how many events its deliverer took per second lately (a moving average over one-second windows). */
  private readonly takeRate = new Map<WebhookAction, { since: number; taken: number; perSecond: number }>();

  constructor(
    private readonly pool: pg.Pool,
    /** This process's leases are tagged with it, so releaseLeases frees its own and no one else's. */
    private readonly owner: string,
    private readonly tuning: Readonly<PostgresTuning>,
    private readonly notifier: DueNotifier,
  ) {
    this.fresh = new HandOverQueue({ maxEvents: tuning.maxFreshEvents, maxBytes: tuning.maxFreshBytes });
  }

  /** The database may hold claimable events of `action` this process has not looked for (an unleased accept). */
  mayHaveDue(action: WebhookAction): void {
    this.dbMayHaveDue.add(action);
  }

  /** The database may hold claimable events of any action (another instance's NOTIFY, a requeue). */
  mayAllHaveDue(): void {
    for (const action of webhookActions) this.dbMayHaveDue.add(action);
  }

  /** A retry recorded here comes due in the database at `at`: each claiming action looks then (the retry's action is not at hand). */
  retryDueAt(at: number): void {
    for (const action of this.leaseMsByAction.keys())
      this.nextDbLookAt.set(action, Math.min(this.nextDbLookAt.get(action) ?? Infinity, at));
  }

  /**
   * Leases the batch's events, while the fresh queue has room, to this process's deliverer of
   * their action, if it is claiming that action (it claimed lately: not after a reload took the
   * action's target away, nor while a slow target keeps every slot busy for long).
   */
  leaseForDeliverer(batch: LeasableAccept[]): void {
    const now = Date.now();
    for (const [action, at] of this.lastClaimAt) {
      if (now - at < this.tuning.claimingRecentlyMs) continue;
      this.leaseMsByAction.delete(action);
      this.lastClaimAt.delete(action);
      // Freed, so that any instance claims them now (not once their leases run out).
      void this.freeLeases(this.fresh.drop(action));
    }
    let room = this.tuning.maxFreshEvents - this.fresh.size;
    let bytes = this.tuning.maxFreshBytes - this.fresh.bytes;
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

  /** How many more accepts of `action` its fresh queue takes: freshAheadMs of its deliverer's recent rate, at least freshMinEvents. */
  private freshRoom(action: WebhookAction): number {
    const perSecond = this.takeRate.get(action)?.perSecond ?? 0;
    const cap = Math.max(this.tuning.freshMinEvents, Math.ceil((perSecond * this.tuning.freshAheadMs) / 1000));
    return cap - (this.fresh.lane(action)?.length ?? 0);
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
  handOver(p: LeasableAccept, lease: { claimId: string; until: number }): void {
    const { event } = p;
    this.fresh.push({
      id: p.id,
      endpoint: event.endpoint,
      action: event.action,
      idempotencyKey: event.idempotencyKey ?? null,
      receivedAt: event.receivedAt,
      envelope: p.envelope!,
      status: 'queued',
      attempts: 0,
      roundAttempts: 0,
      nextAttemptAt: event.receivedAt,
      lastError: null,
      deliveredAt: null,
      claimId: lease.claimId,
      leaseUntil: lease.until,
      traceContext: event.traceContext,
    });
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
    const queue = this.fresh.lane(action);
    const freshDue = queue !== undefined && queue.length > 0 && queue[0]!.nextAttemptAt <= now;
    const lookedAt = Date.now();
    if (this.dbLookDue(action, now, freshDue)) {
      try {
        await this.lookInDb(now, limit, leaseMs, action, this.fresh.dueBefore(action, now, limit));
      } catch (err) {
        this.dbMayHaveDue.add(action);
        if (!freshDue) throw err;
        // The fresh events are leased already: handed out now, the database asked again next time.
      }
    }
    // What is left of a lease is judged at hand-out: a look that waited for a connection took its
    // time off every lease (the claim's own too), and one handed out as if whole could run out
    // before the deliverer's first renewal, and be claimed and delivered by another instance too.
    const handedOutAt = now + Math.max(0, Date.now() - lookedAt);
    const taken = await this.takeFresh(handedOutAt, limit, leaseMs, action);
    this.noteTaken(action, taken.length, Date.now());
    return taken;
  }

  /**
   * Whether claimDue asks the database: once dbLookMs has passed since it last did, when a retry
   * or a lease is known to come due, and when something says the database has more (an unleased
   * accept, another instance's NOTIFY, a full answer) unless this action's fresh events are due
   * already. Then what others announce waits for the next look (dbLookMs at most), so an
   * instance busy with its own accepts does not query per claim, while its retries and expired
   * leases are found on time.
   */
  private dbLookDue(action: WebhookAction, now: number, freshDue: boolean): boolean {
    const lastLook = this.lastDbLookAt.get(action);
    if (lastLook === undefined || now < lastLook || now >= lastLook + this.tuning.dbLookMs) return true;
    if (now >= (this.nextDbLookAt.get(action) ?? Infinity)) return true;
    return !freshDue && this.dbMayHaveDue.has(action);
  }

  /**
   * Claims up to `limit` of the action's events due by `dueBy` in the database into its fresh
   * queue, and learns when to look next. `dueBy` is before `now` when the fresh queue holds
   * `limit` due events already: only what goes ahead of those is claimed, so all of it is handed
   * out at once, never held here under this instance's lease while others could deliver it.
   */
  private async lookInDb(
    now: number,
    limit: number,
    leaseMs: number,
    action: WebhookAction,
    dueBy: number,
  ): Promise<void> {
    // Cleared before the query: whatever says "look again" while it runs stays said.
    this.dbMayHaveDue.delete(action);
    this.lastDbLookAt.set(action, now);
    const knownBefore = this.nextDbLookAt.get(action);
    const { rows } = await this.pool.query<EventRow & { next_look: number | null }>(CLAIM_DUE_SQL, [
      now,
      leaseMs,
      this.owner,
      action,
      limit,
      dueBy,
    ]);
    const fromDb = rows.filter((row) => row.id !== null);
    if (fromDb.length === limit)
      this.dbMayHaveDue.add(action); // a full answer may have left more behind
    else if (dueBy < now) {
      // Short within the bound: what is due after it waits its turn behind the fresh events (looked for once they are not enough, or in dbLookMs).
      this.dbMayHaveDue.add(action);
      this.nextDbLookAt.delete(action);
    } else {
      // The statement's answer, its own new leases, and a retry recorded while it ran (its snapshot missed that one).
      const setMeanwhile =
        this.nextDbLookAt.get(action) !== knownBefore ? (this.nextDbLookAt.get(action) ?? Infinity) : Infinity;
      const nextLook = Math.min(
        rows[0]?.next_look ?? Infinity,
        fromDb.length > 0 ? now + leaseMs : Infinity,
        setMeanwhile,
      );
      if (nextLook === Infinity) this.nextDbLookAt.delete(action);
      else this.nextDbLookAt.set(action, nextLook);
    }
    for (const row of fromDb)
      this.fresh.insertInDueOrder({
        ...toEvent(row),
        claimId: row.claim_id!,
        leaseUntil: row.lease_until!,
        traceContext: row.trace_context,
      });
  }

  /**
   * Up to `limit` of this action's fresh events, oldest first. One with most of its lease left is
   * handed out as it is; an older one has its lease extended first, under its token (one statement
   * for all of them), and is dropped if the token no longer matches: its lease ran out and another
   * claim took it.
   */
  private async takeFresh(now: number, limit: number, leaseMs: number, action: WebhookAction): Promise<ClaimedEvent[]> {
    const queue = this.fresh.lane(action);
    if (!queue?.length) return [];
    // One accepted with a receipt time still ahead (a clock set by a test) keeps its place.
    const taken = this.fresh.take(action, now, limit);
    const leaseLeft = this.tuning.freshLeaseLeft * leaseMs;
    const ready = taken.filter((e) => e.leaseUntil - now >= leaseLeft);
    if (ready.length === taken.length) return ready;
    const old = taken.filter((e) => e.leaseUntil - now < leaseLeft);
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
      this.fresh.putBack(queue, old);
      if (ready.length === 0) throw err; // the deliverer pauses, as on any failed claim
      return ready;
    }
    return [...ready, ...old.filter((e) => held.has(e.id)).map((e) => ({ ...e, leaseUntil: until }))];
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
    this.fresh.clear();
    const { rowCount } = await this.pool.query(
      'UPDATE events SET lease_until = NULL, claim_id = NULL, lease_owner = NULL WHERE lease_owner = $1',
      [this.owner],
    );
    this.mayAllHaveDue();
    if (rowCount) this.notifier.notifyDue(); // claimable now: the other instances need not wait for their next look
    return rowCount ?? 0;
  }

  async nextDueAt(now: number): Promise<number | undefined> {
    // Known without asking: fresh events are due now; else, while nothing says the database has
    // more, the earliest time claimDue learnt (or a retry of ours set) for the actions it claims.
    const claiming = [...this.leaseMsByAction.keys()];
    if (claiming.some((action) => this.fresh.lane(action)?.some((e) => e.nextAttemptAt <= now))) return now;
    if (claiming.length > 0 && claiming.every((action) => !this.dbMayHaveDue.has(action))) {
      const known = Math.min(
        ...claiming.flatMap((action) => [
          this.nextDbLookAt.get(action) ?? Infinity,
          ...(this.fresh.lane(action) ?? []).map((e) => e.nextAttemptAt),
        ]),
      );
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

  /**
   * At close: frees the leases of fresh events no deliverer took (under their tokens), and
   * announces them, so another instance delivers them now, not once they run out.
   */
  async freeUntaken(): Promise<void> {
    await this.freeLeases(this.fresh.clear());
  }

  /**
   * Frees the leases of fresh events no deliverer will take here (under their tokens), and
   * announces them, so any instance claims them now. A failure leaves them to run out.
   */
  private async freeLeases(events: ClaimedEvent[]): Promise<void> {
    if (events.length === 0) return;
    await this.pool
      .query(
        `UPDATE events e SET lease_until = NULL, claim_id = NULL, lease_owner = NULL
         FROM unnest($1::text[], $2::uuid[]) AS f(id, claim_id)
        WHERE e.id = f.id AND e.claim_id = f.claim_id`,
        [events.map((e) => e.id), events.map((e) => e.claimId)],
      )
      .then(() => this.notifier.announce())
      .catch(() => {});
  }
}
