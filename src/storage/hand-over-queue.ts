import type { WebhookAction } from '../config/schema.js';
import type { StoredEvent } from './contracts/events.js';

/**
 * The local hand-over queue both drivers keep: events this process accepted (and, on PostgreSQL,
 * claimed from the database ahead of them), waiting in memory, per action, for this process's
 * deliverer, so a claim hands them out without reading them back. Bounded in events and in
 * envelope bytes (a slow target, large bodies).
 *
 * An event can be forgotten by id (settled some other way) without searching its lane: it is
 * skipped, and its bytes freed, when a take reaches it. Each action's lane is one array for as
 * long as it holds events; `drop`/`clear` start a new one, which is how `putBack` knows a lane it
 * took from is gone.
 */
export class HandOverQueue<E extends StoredEvent> {
  private readonly lanes = new Map<WebhookAction, E[]>();
  /** The events still to hand out (a forgotten one stays in its lane until a take reaches it). */
  private readonly live = new Set<string>();
  private heldBytes = 0;

  constructor(readonly limits: { readonly maxEvents: number; readonly maxBytes: number }) {}

  /** Events still to hand out. */
  get size(): number {
    return this.live.size;
  }

  /** Envelope bytes held (including forgotten events not yet passed by a take). */
  get bytes(): number {
    return this.heldBytes;
  }

  has(id: string): boolean {
    return this.live.has(id);
  }

  /** The action's lane, oldest first, as it is (forgotten events included): read it, never change it. */
  lane(action: WebhookAction): readonly E[] | undefined {
    return this.lanes.get(action);
  }

  lanesInUse(): IterableIterator<readonly E[]> {
    return this.lanes.values();
  }

  /** Whether one more event of `bytes` fits within the limits. */
  fits(bytes: number): boolean {
    return this.live.size < this.limits.maxEvents && this.heldBytes + bytes <= this.limits.maxBytes;
  }

  /** Appends `event` to its action's lane (the caller checked the limits). */
  push(event: E): void {
    this.laneFor(event.action).push(event);
    this.hold(event);
  }

  /** Puts `event` in its lane in claim order (due time, then id): after every one due no later. */
  insertInDueOrder(event: E): void {
    const lane = this.laneFor(event.action);
    lane.splice(dueOrderIndex(lane, event), 0, event);
    this.hold(event);
  }

  /** The event will not be handed out (settled some other way): skipped when a take reaches it. */
  forget(id: string): void {
    this.live.delete(id);
  }

  /**
   * Up to `limit` of the action's events due by `now`, oldest first; those not due yet (a receipt
   * time ahead: a clock set by a test) keep their places, forgotten ones are dropped.
   */
  take(action: WebhookAction, now: number, limit: number): E[] {
    const lane = this.lanes.get(action);
    if (!lane?.length) return [];
    const taken: E[] = [];
    const notDue: E[] = [];
    let i = 0;
    for (; i < lane.length && taken.length < limit; i++) {
      const event = lane[i]!;
      if (event.nextAttemptAt > now && this.live.has(event.id)) {
        notDue.push(event);
        continue;
      }
      this.heldBytes -= event.envelope.length;
      if (!this.live.delete(event.id)) continue;
      taken.push(event);
    }
    lane.splice(0, i, ...notDue);
    return taken;
  }

  /** Puts taken events back at the head of `lane`, unless that lane was dropped meanwhile (then they are left out). */
  putBack(lane: readonly E[], events: E[]): void {
    const action = events[0]?.action;
    if (action === undefined || this.lanes.get(action) !== lane) return;
    this.lanes.get(action)!.unshift(...events);
    for (const event of events) this.hold(event);
  }

  /** Empties the action's lane; returns the events it still held to hand out. */
  drop(action: WebhookAction): E[] {
    const lane = this.lanes.get(action) ?? [];
    this.lanes.delete(action);
    return this.release(lane);
  }

  /** Empties every lane; returns the events still held to hand out. */
  clear(): E[] {
    const all = [...this.lanes.values()].flat();
    this.lanes.clear();
    const dropped = all.filter((event) => this.live.has(event.id));
    this.live.clear();
    this.heldBytes = 0;
    return dropped;
  }

  /**
   * The latest due time a claim of `limit` from elsewhere can use to get only what goes ahead of
   * the lane's first `limit` due events: just before the `limit`-th one's; `now` when there are fewer.
   */
  dueBefore(action: WebhookAction, now: number, limit: number): number {
    let due = 0;
    for (const event of this.lanes.get(action) ?? []) {
      if (event.nextAttemptAt > now) continue;
      if (++due === limit) return event.nextAttemptAt - 1;
    }
    return now;
  }

  private laneFor(action: WebhookAction): E[] {
    let lane = this.lanes.get(action);
    if (!lane) this.lanes.set(action, (lane = []));
    return lane;
  }

  private hold(event: E): void {
    this.live.add(event.id);
    this.heldBytes += event.envelope.length;
  }

  private release(lane: E[]): E[] {
    const dropped: E[] = [];
    for (const event of lane) {
      this.heldBytes -= event.envelope.length;
      if (this.live.delete(event.id)) dropped.push(event);
    }
    return dropped;
  }
}

/** Where `event` goes in a lane kept in claim order (due time, then id): after every one due no later. */
function dueOrderIndex(lane: readonly StoredEvent[], event: StoredEvent): number {
  let lo = 0;
  let hi = lane.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    const other = lane[mid]!;
    if (
      other.nextAttemptAt < event.nextAttemptAt ||
      (other.nextAttemptAt === event.nextAttemptAt && other.id <= event.id)
    )
      lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
