import type ipaddr from 'ipaddr.js';
import { parseAddress } from './ip-allowlist.js';

/**
 * Failure lockout: `max` bad credentials from one client within `windowSeconds`
 * lock that client out for `lockoutSeconds`. A success does not unlock it.
 *
 * The counters sit behind `LockoutStore` so a shared store (Redis) can replace the
 * in-memory one when several gatehouse instances must agree.
 */
export interface LockoutSettings {
  max: number;
  windowSeconds: number;
  lockoutSeconds: number;
}

export interface LockoutStore {
  /** Seconds left on the lockout of `key`, 0 when not locked. */
  lockedFor(key: string, now: number): Promise<number>;
  /** Counts one failure; returns the seconds of lockout it triggered (0 when none). */
  recordFailure(key: string, now: number, settings: LockoutSettings): Promise<number>;
  /** Every lockout in force as [key, until (ms)]: what a new gateway worker must learn. */
  activeLocks?(now: number): [string, number][];
}

interface Entry {
  /** Times (ms) of recent failures, oldest first; those before `head` have left the window. */
  failures: number[];
  head: number;
  lockedUntil: number;
}

/** Per-process counters. Bounded: past `maxEntries` clients, stale entries are swept, then the oldest dropped. */
export class MemoryLockoutStore implements LockoutStore {
  private readonly entries = new Map<string, Entry>();
  constructor(private readonly maxEntries = 100_000) {}

  async lockedFor(key: string, now: number): Promise<number> {
    const entry = this.entries.get(key);
    if (!entry || entry.lockedUntil <= now) return 0;
    return Math.ceil((entry.lockedUntil - now) / 1000);
  }

  async recordFailure(key: string, now: number, settings: LockoutSettings): Promise<number> {
    let entry = this.entries.get(key);
    if (!entry) {
      if (this.entries.size >= this.maxEntries) this.evict(now, settings);
      entry = { failures: [], head: 0, lockedUntil: 0 };
      this.entries.set(key, entry);
    }
    // Amortised O(1) per failure: a head index instead of filtering the whole list each time
    // (a flood of bad keys from one address made that list, and each failure, grow).
    const windowStart = now - settings.windowSeconds * 1000;
    const { failures } = entry;
    while (entry.head < failures.length && failures[entry.head]! <= windowStart) entry.head++;
    failures.push(now);
    if (failures.length - entry.head > settings.max) entry.head = failures.length - settings.max;
    if (entry.head > 32 && entry.head * 2 > failures.length) {
      entry.failures = failures.slice(entry.head);
      entry.head = 0;
    }
    if (entry.failures.length - entry.head < settings.max) return 0;
    entry.failures = [];
    entry.head = 0;
    entry.lockedUntil = Math.max(entry.lockedUntil, now + settings.lockoutSeconds * 1000);
    return settings.lockoutSeconds;
  }

  activeLocks(now: number): [string, number][] {
    const locks: [string, number][] = [];
    for (const [key, entry] of this.entries) if (entry.lockedUntil > now) locks.push([key, entry.lockedUntil]);
    return locks;
  }

  /** Locks `key` until `until` (ms): another process's verdict, e.g. the cluster primary's. */
  lockUntil(key: string, until: number): void {
    let entry = this.entries.get(key);
    if (!entry) {
      if (this.entries.size >= this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
      entry = { failures: [], head: 0, lockedUntil: 0 };
      this.entries.set(key, entry);
    }
    entry.lockedUntil = Math.max(entry.lockedUntil, until);
  }

  private evict(now: number, settings: LockoutSettings): void {
    const windowStart = now - settings.windowSeconds * 1000;
    for (const [key, entry] of this.entries) {
      if (entry.lockedUntil <= now && (entry.failures.at(-1) ?? 0) <= windowStart) this.entries.delete(key);
    }
    // Still full (an address-spraying attack): drop the oldest entries rather than grow without bound.
    for (const key of this.entries.keys()) {
      if (this.entries.size < this.maxEntries) break;
      this.entries.delete(key);
    }
  }
}

/** The lockout as the pipeline uses it: one store, the current settings, a namespace per listener. */
export class FailureLockout {
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

  lockedFor(ip: string): Promise<number> {
    return this.store.lockedFor(this.key(ip), this.now());
  }

  recordFailure(ip: string): Promise<number> {
    return this.store.recordFailure(this.key(ip), this.now(), this.settings);
  }

  /**
   * One counter per IPv4 address, and per IPv6 /64: a single IPv6 host usually holds a whole
   * /64, and counting per address would give it 2^64 fresh starts.
   */
  private key(ip: string): string {
    if (!ip.includes(':')) return `${this.namespace}:${ip}`;
    const address = parseAddress(ip);
    if (address?.kind() !== 'ipv6') return `${this.namespace}:${ip}`;
    return `${this.namespace}:${(address as ipaddr.IPv6).parts.slice(0, 4).map((p) => p.toString(16)).join(':')}::/64`;
  }
}
