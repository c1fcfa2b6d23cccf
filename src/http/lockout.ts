import type ipaddr from 'ipaddr.js';
import { parseAddress } from './ip-ranges.js';

/**
 * Failure lockout: at most `max` bad credentials from one client are evaluated within
 * `windowSeconds`; the `max`-th locks the client out for `lockoutSeconds`. A success does not
 * unlock it.
 *
 * The bound holds however concurrent the client is: a request takes a slot (`acquire`) before
 * its credential is checked and gives it back with the verdict (`succeeded` / `failed`). While
 * the failures in the window plus the slots in flight reach `max`, a new request waits (first
 * come, first served) for a slot to come back instead of being checked alongside them, then
 * either proceeds or, once those turned into a lockout, gets the lockout. Nobody is refused for
 * concurrency alone.
 */
export interface LockoutSettings {
  max: number;
  windowSeconds: number;
  lockoutSeconds: number;
}

/**
 * The counters and locks, per key. Synchronous on purpose: it is consulted on every /api/
 * request. A count shared between processes keeps a local view and reports failures in the
 * background, as gateway workers do (src/runtime/workers/worker.ts).
 */
export interface LockoutStore {
  /**
   * Seconds `key` is refused for: locked out, or its window already holds `max` failures
   * (which happens without a lockout only when `max` was lowered or the lock table is full).
   * 0 when it may be checked.
   */
  refusedFor(key: string, now: number, settings: LockoutSettings): number;
  /** How many more failures the window of `key` takes before it locks (`max` minus those counted). */
  room(key: string, now: number, settings: LockoutSettings): number;
  /**
   * Counts one failure; returns the seconds of lockout it triggered (0 when none). `reserved`:
   * the check had a reservation of the shared count (`reserve`), which this failure uses up.
   */
  recordFailure(key: string, now: number, settings: LockoutSettings, reserved?: boolean): number;
  /** Every lockout in force as [key, until (ms)]: what a new gateway worker must learn. */
  activeLocks?(now: number): [string, number][];
  /**
   * A count shared between instances (PostgresLockoutStore): a place in it for one check of
   * `key`, taken before the check. FailureLockout asks only for clients this process already saw
   * fail in the window or has in flight, so the hot path of everyone else stays local. Never
   * rejects. undefined: the shared count cannot be asked (it is down), check locally.
   */
  reserve?(key: string, now: number, settings: LockoutSettings): Promise<Reservation> | undefined;
  /** A reserved check that was not a failure: its place is given back. */
  release?(key: string, now: number, settings: LockoutSettings): void;
  /** Calls `listener` with every lock learned from elsewhere (another instance); returns the unsubscribe. */
  onLocked?(listener: (key: string, until: number) => void): () => void;
  /**
   * An operator's lift (the admin API): the locks of `keys` end and their failures are forgotten.
   * Resolves to the locks that were in force, as [key, until (ms)]. A shared store lifts them for
   * every instance too, and rejects (LiftNotShared) when it cannot, after lifting them here.
   */
  lift?(keys: readonly string[], now: number): Promise<[string, number][]>;
  /** Calls `listener` with every key lifted elsewhere (another instance); returns the unsubscribe. */
  onLifted?(listener: (key: string) => void): () => void;
}

/** A shared store's lift that reached this process only: other instances may still refuse the client. */
export class LiftNotShared extends Error {
  override name = 'LiftNotShared';
  constructor(
    message: string,
    /** The locks lifted here all the same, as `lift` resolves them. */
    readonly locks: [string, number][],
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** [key, until] pairs from several places, one per key with the latest until. */
export function latestLocks(locks: Iterable<[string, number]>): [string, number][] {
  const latest = new Map<string, number>();
  for (const [key, until] of locks) latest.set(key, Math.max(until, latest.get(key) ?? 0));
  return [...latest];
}

/** A shared count's answer to `reserve`: a place taken, none needed after all, or the seconds refused. */
export type Reservation = 'reserved' | 'unreserved' | { refusedFor: number };

const DEFAULT_MAX_COUNTERS = 100_000;
const DEFAULT_MAX_LOCKS = 1_000_000;
/** Stale counters and expired locks dropped from the head per write: more than one, so a backlog shrinks. */
const SWEEP_PER_WRITE = 2;

interface Counter {
  /** Times (ms) of recent failures, oldest first; those before `head` have left the window. */
  failures: number[];
  head: number;
}

/**
 * Per-process counters and locks, every operation O(1) (amortised), also at capacity.
 *
 * - Counters sit in a Map ordered by last failure (a failure moves its key to the end). Past
 *   `maxCounters` keys the least recently failing counter is dropped from the head: an
 *   address-spraying attacker can make the store forget old counts, never spend its CPU.
 * - Locks sit apart, in a Map in the order they were set, which is expiry order (every lock
 *   lasts `lockoutSeconds`), so expired ones are dropped from the head. A lock is never
 *   dropped before it expires: spraying new addresses cannot lift one. Past `maxLocks` locks in
 *   force, a client that reaches `max` is not locked but refused until its oldest counted
 *   failure leaves the window (`max` guesses per window instead of per lockout).
 */
export class MemoryLockoutStore implements LockoutStore {
  private readonly counters = new Map<string, Counter>();
  private readonly locks = new Map<string, number>();
  private readonly maxCounters: number;
  private readonly maxLocks: number;

  constructor(limits: { maxCounters?: number; maxLocks?: number } = {}) {
    this.maxCounters = limits.maxCounters ?? DEFAULT_MAX_COUNTERS;
    this.maxLocks = limits.maxLocks ?? DEFAULT_MAX_LOCKS;
  }

  /** Keys with a counter and keys locked (expired ones included until swept): for tests and metrics. */
  get size(): { counters: number; locks: number } {
    return { counters: this.counters.size, locks: this.locks.size };
  }

  refusedFor(key: string, now: number, settings: LockoutSettings): number {
    const until = this.locks.get(key);
    if (until !== undefined) {
      if (until > now) return Math.ceil((until - now) / 1000);
      this.locks.delete(key);
    }
    const counter = this.counters.get(key);
    if (counter === undefined) return 0;
    const counted = countInWindow(counter, now, settings);
    if (counted < settings.max) return 0;
    // Free again once enough failures leave the window to bring the count under max.
    const freeAt = counter.failures[counter.head + counted - settings.max]! + settings.windowSeconds * 1000;
    return Math.max(1, Math.ceil((freeAt - now) / 1000));
  }

  room(key: string, now: number, settings: LockoutSettings): number {
    const counter = this.counters.get(key);
    return settings.max - (counter === undefined ? 0 : countInWindow(counter, now, settings));
  }

  recordFailure(key: string, now: number, settings: LockoutSettings): number {
    let counter = this.counters.get(key);
    if (counter === undefined) {
      this.sweepCounters(now, settings);
      if (this.counters.size >= this.maxCounters) this.counters.delete(this.counters.keys().next().value!);
      counter = { failures: [], head: 0 };
    } else {
      this.counters.delete(key); // re-inserted below: the Map stays in last-failure order
    }
    this.counters.set(key, counter);
    const counted = countInWindow(counter, now, settings);
    counter.failures.push(now);
    // Only the last `max` matter; a head index instead of filtering keeps each failure O(1).
    if (counted + 1 > settings.max) counter.head = counter.failures.length - settings.max;
    if (counter.head > 32 && counter.head * 2 > counter.failures.length) {
      counter.failures = counter.failures.slice(counter.head);
      counter.head = 0;
    }
    if (counted + 1 < settings.max) return 0;
    // Lock table full of locks in force: the full window keeps refusing the client (refusedFor).
    if (!this.setLock(key, now + settings.lockoutSeconds * 1000, now)) return 0;
    this.counters.delete(key);
    return settings.lockoutSeconds;
  }

  activeLocks(now: number): [string, number][] {
    const active: [string, number][] = [];
    for (const entry of this.locks) if (entry[1] > now) active.push(entry);
    return active;
  }

  /** Ends the lock of `key` and forgets its failures; returns until when it was locked (0: it was not). */
  unlock(key: string, now: number): number {
    const until = this.lockedUntil(key, now);
    this.locks.delete(key);
    this.counters.delete(key);
    return until;
  }

  lift(keys: readonly string[], now: number): Promise<[string, number][]> {
    const lifted: [string, number][] = [];
    for (const key of keys) {
      const until = this.unlock(key, now);
      if (until > 0) lifted.push([key, until]);
    }
    return Promise.resolve(lifted);
  }

  /** Until when (ms) `key` is locked; 0 when it is not (or the lock has expired). */
  lockedUntil(key: string, now: number): number {
    const until = this.locks.get(key);
    return until !== undefined && until > now ? until : 0;
  }

  /** Locks `key` until `until` (ms): another process's verdict, e.g. the cluster primary's. */
  lockUntil(key: string, until: number, now = Date.now()): void {
    this.setLock(key, until, now);
  }

  /** false: the table is full of locks in force, and `key` was not locked. */
  private setLock(key: string, until: number, now: number): boolean {
    const current = this.locks.get(key);
    if (current !== undefined) {
      if (current >= until) return true;
      this.locks.delete(key); // re-inserted at the end, where the latest expiries are
    } else {
      this.sweepLocks(now, this.locks.size >= this.maxLocks ? Infinity : SWEEP_PER_WRITE);
      if (this.locks.size >= this.maxLocks) return false;
    }
    this.locks.set(key, until);
    return true;
  }

  /**
   * Drops up to `limit` expired locks from the head. Locks are set in expiry order, except after
   * a reload shortened `lockoutSeconds` or with another process's verdicts: then a later expiry
   * at the head holds the sweep up until it expires too (those behind it are still refused
   * nothing: refusedFor compares with the time).
   */
  private sweepLocks(now: number, limit: number): void {
    let swept = 0;
    for (const [key, until] of this.locks) {
      if (until > now || swept++ >= limit) return;
      this.locks.delete(key);
    }
  }

  /** Drops a few counters whose last failure has left the window (they sit at the head). */
  private sweepCounters(now: number, settings: LockoutSettings): void {
    const windowStart = now - settings.windowSeconds * 1000;
    let swept = 0;
    for (const [key, counter] of this.counters) {
      if (counter.failures[counter.failures.length - 1]! > windowStart || swept++ >= SWEEP_PER_WRITE) return;
      this.counters.delete(key);
    }
  }
}

/** Failures of `counter` inside the window ending `now` (moves its head past those that left). */
function countInWindow(counter: Counter, now: number, settings: LockoutSettings): number {
  const windowStart = now - settings.windowSeconds * 1000;
  const { failures } = counter;
  while (counter.head < failures.length && failures[counter.head]! <= windowStart) counter.head++;
  return failures.length - counter.head;
}

/** Permission to check one credential of a client; given back once, with the verdict. */
export interface LockoutSlot {
  /** The credential was good, or nothing that counts failed: nothing is counted. */
  succeeded(): void;
  /** A bad credential: counted; returns the seconds of lockout it set off (0 when none). */
  failed(): number;
}

/** What `acquire` answers: a slot, or the seconds the client is refused for. */
export type LockoutAdmission = LockoutSlot | number;

type Waiter = (admission: LockoutAdmission | Promise<LockoutAdmission>) => void;

/** The requests of one key being checked, and those waiting for their turn (FIFO from `head`). */
interface Gate {
  key: string;
  inFlight: number;
  /** Made when the first request must wait (most gates never have one). */
  waiters: Waiter[] | undefined;
  head: number;
}

class Slot implements LockoutSlot {
  private released = false;
  /** Holds a place in the shared count (LockoutStore.reserve), which the verdict settles. */
  reserved = false;
  constructor(
    private readonly gate: Gate,
    private readonly release: (gate: Gate, failed: boolean, reserved: boolean) => number,
  ) {}

  succeeded(): void {
    if (this.released) return;
    this.released = true;
    this.release(this.gate, false, this.reserved);
  }

  failed(): number {
    if (this.released) return 0;
    this.released = true;
    return this.release(this.gate, true, this.reserved);
  }
}

/** The lockout as the pipeline uses it: one store, the current settings, a namespace per listener. */
export class FailureLockout {
  /** Keys with slots out or requests waiting; an idle key has no gate. */
  private readonly gates = new Map<string, Gate>();

  constructor(
    private readonly store: LockoutStore,
    private settings: LockoutSettings,
    private readonly namespace: string,
    private readonly now: () => number = Date.now,
  ) {}

  /** Reload: new limits apply to the counters already kept. */
  configure(settings: LockoutSettings): void {
    this.settings = settings;
  }

  /**
   * A slot to check one credential of `ip`, or the seconds it is refused for. Synchronous unless
   * the request must wait its turn (the failures in the window plus the slots out reach `max`).
   * Every slot must be given back, on every path (a slot kept forever stalls that client).
   */
  acquire(ip: string): LockoutAdmission | Promise<LockoutAdmission> {
    const key = this.key(ip);
    const gate = this.gates.get(key);
    if (gate === undefined) {
      // The common case: nothing of this client in flight.
      const now = this.now();
      const refused = this.store.refusedFor(key, now, this.settings);
      if (refused > 0) return refused;
      const fresh: Gate = { key, inFlight: 1, waiters: undefined, head: 0 };
      this.gates.set(key, fresh);
      const slot = new Slot(fresh, this.release);
      // A client with no failure here: no shared count asked (the hot path makes no round trip).
      if (this.store.reserve === undefined || this.store.room(key, now, this.settings) >= this.settings.max)
        return slot;
      return this.reserve(slot, fresh, now);
    }
    // No overtaking: with requests already waiting, a new one queues behind them.
    if (gate.waiters === undefined) {
      const admission = this.admit(gate);
      if (admission !== undefined) return admission;
    }
    return new Promise<LockoutAdmission>((resolve) => (gate.waiters ??= []).push(resolve));
  }

  /**
   * Shared stores: the slot proceeds once the shared count has a place for it. Refused there
   * (other instances counted `max`, or locked the client): the slot goes back uncounted.
   */
  private reserve(slot: Slot, gate: Gate, now: number): LockoutAdmission | Promise<LockoutAdmission> {
    const pending = this.store.reserve?.(gate.key, now, this.settings);
    if (pending === undefined) return slot;
    return pending.then((reservation) => {
      if (reservation === 'unreserved') return slot;
      if (reservation === 'reserved') {
        slot.reserved = true;
        return slot;
      }
      slot.succeeded(); // nothing was checked: given back uncounted (and waiters learn the lock)
      return Math.max(1, reservation.refusedFor);
    });
  }

  /** Seconds `ip` is refused for now (0: not refused); takes no slot. */
  lockedFor(ip: string): number {
    return this.store.refusedFor(this.key(ip), this.now(), this.settings);
  }

  /** A slot if the window has room beside those in flight; the refusal if locked; undefined: wait. */
  private admit(gate: Gate): LockoutAdmission | Promise<LockoutAdmission> | undefined {
    const now = this.now();
    const refused = this.store.refusedFor(gate.key, now, this.settings);
    if (refused > 0) return refused;
    // With nothing in flight a request always proceeds, so no waiter can wait forever.
    if (gate.inFlight > 0 && gate.inFlight >= this.store.room(gate.key, now, this.settings)) return undefined;
    gate.inFlight++;
    const slot = new Slot(gate, this.release);
    // After failures of this client here, the shared count decides too. A client with none here
    // (a busy one with checks in flight together) takes no round trip: the hot path stays off the
    // database, at the price of its first concurrent wave on each instance going unreserved.
    if (this.store.reserve === undefined || this.store.room(gate.key, now, this.settings) >= this.settings.max)
      return slot;
    return this.reserve(slot, gate, now);
  }

  private readonly release = (gate: Gate, failed: boolean, reserved: boolean): number => {
    gate.inFlight--;
    let lockedFor = 0;
    if (failed) lockedFor = this.store.recordFailure(gate.key, this.now(), this.settings, reserved);
    else if (reserved) this.store.release?.(gate.key, this.now(), this.settings);
    const { waiters } = gate;
    if (waiters !== undefined) {
      // Wake waiters in order while there is room; once locked, every one gets the lockout.
      while (gate.head < waiters.length) {
        const admission = this.admit(gate);
        if (admission === undefined) break;
        const waiter = waiters[gate.head]!;
        waiters[gate.head++] = undefined as unknown as Waiter; // let it go
        waiter(admission);
      }
      if (gate.head === waiters.length) {
        gate.waiters = undefined;
        gate.head = 0;
      } else if (gate.head > 1024 && gate.head * 2 > waiters.length) {
        gate.waiters = waiters.slice(gate.head);
        gate.head = 0;
      }
    }
    if (gate.inFlight === 0 && gate.waiters === undefined) this.gates.delete(gate.key);
    return lockedFor;
  };

  private key(ip: string): string {
    return lockoutKey(this.namespace, clientGroup(ip));
  }
}

/** The areas a client is locked out of separately: the listener that counted its failures (FailureLockout's namespace). */
export const LOCKOUT_AREAS = ['gateway', 'webhooks'] as const;

/** The store's key of a client (clientGroup) in one area: the listener that counts (`gateway`, `webhooks`). */
export function lockoutKey(area: string, client: string): string {
  return `${area}:${client}`;
}

/** A store key taken apart: the area and the client (an IPv4 address, or an IPv6 /64 as clientGroup writes it). */
export function parseLockoutKey(key: string): { area: string; client: string } {
  const at = key.indexOf(':');
  return { area: key.slice(0, at), client: key.slice(at + 1) };
}

/**
 * The client an address stands for when counting (lockout, rate limits): an IPv4 address, or an
 * IPv6 /64 — a single IPv6 host usually holds a whole /64, and counting per address would give
 * it 2^64 fresh starts.
 */
export function clientGroup(ip: string): string {
  if (!ip.includes(':')) return ip;
  const address = parseAddress(ip);
  if (address?.kind() !== 'ipv6') return ip;
  return `${(address as ipaddr.IPv6).parts
    .slice(0, 4)
    .map((p) => p.toString(16))
    .join(':')}::/64`;
}

/**
 * The client an operator names (an address, or an IPv6 /64 as clientGroup writes it), as the
 * store keys it; undefined when it is neither. `2001:db8::1`, `2001:DB8:0:0::/64` and
 * `2001:db8::/64` all name `2001:db8:0:0::/64`; `::ffff:192.0.2.1` names `192.0.2.1`.
 */
export function clientGroupOf(text: string): string | undefined {
  const prefix = text.endsWith('/64') ? text.slice(0, -3) : undefined;
  const address = parseAddress(prefix ?? text);
  if (!address || (prefix !== undefined && address.kind() !== 'ipv6')) return undefined;
  return clientGroup(address.toString());
}
