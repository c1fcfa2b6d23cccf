import { randomUUID } from 'node:crypto';
import pg from 'pg';
import type { Logger } from 'pino';
import type { PostgresStorageConfig } from '../../config/schema.js';
import {
  LiftNotShared,
  MemoryLockoutStore,
  type LockoutSettings,
  type LockoutStore,
  type Reservation,
} from '../../http/lockout.js';
import { PostgresListener } from './listener.js';
import { UsageError } from '../../errors.js';
import { migrate } from './migrations.js';
import { GatedPool, schemaGateFor, unreachable } from './schema-gate.js';
import { connectionOptions, inTransaction, withClient } from './pool.js';

/**
 * NOTIFY channel: "this client is locked out", payload JSON [key, until (ms)]; or "an operator
 * lifted it", payload JSON {"lifted": key, "by": the lifting store's id} (an object, which an
 * older gatehouse reading the channel ignores).
 */
const LOCK_CHANNEL = 'gatehouse_lockout';
/** Locks in force are read again this often: covers NOTIFYs lost while the LISTEN connection was down. */
const REFRESH_MS = 5_000;
/** A place reserved by an instance that died is forgotten after this (a check takes far less). */
const RESERVATION_MS = 30_000;
/** While other instances' checks fill the count (no lock yet), a reservation is asked again this often... */
const RESERVE_RETRY_MS = 25;
/** ...for this long; then the client is refused for a second (a 429), not kept waiting. */
const RESERVE_WAIT_MS = 2_000;
/** The lockout's queries are on the request path of clients that failed: short, or counted locally. */
const QUERY_TIMEOUT_MS = 2_000;
/** Expired rows deleted per refresh (in the background; a backlog shrinks 1,000 at a time). */
const CLEANUP_BATCH = 1_000;

/** A client's row in `lockouts`, as read under its row lock. */
export interface LockoutRow {
  failures: number[];
  reserved: number;
  reservedUntil: number;
  lockedUntil: number;
  expiresAt: number;
}

export type LockoutOp = { kind: 'failure'; reserved: boolean } | { kind: 'reserve' } | { kind: 'release' };

/**
 * What one operation does to a client's row: the same sliding window as MemoryLockoutStore
 * (failures older than the window drop out; the `max`-th locks for `lockoutSeconds` and clears
 * the count). A reservation is a place in the count for a check in flight: granted while the
 * failures in the window plus the places held stay under `max`. Pure: tested on its own.
 */
export function applyLockoutOp(
  row: LockoutRow,
  op: LockoutOp,
  now: number,
  settings: LockoutSettings,
): { row: LockoutRow; reservation?: Reservation } {
  const windowMs = settings.windowSeconds * 1000;
  const failures = row.failures.filter((at) => at > now - windowMs);
  let reserved = row.reservedUntil > now ? row.reserved : 0;
  let { lockedUntil, reservedUntil } = row;
  let reservation: Reservation | undefined;
  if (lockedUntil > now) {
    // Already locked (this instance had not heard yet): nothing more is counted.
    if (op.kind === 'reserve') reservation = { refusedFor: Math.ceil((lockedUntil - now) / 1000) };
    else if (reserved > 0 && (op.kind === 'release' || op.reserved)) reserved--;
  } else if (op.kind === 'reserve') {
    if (failures.length + reserved < settings.max) {
      reserved++;
      reservedUntil = now + RESERVATION_MS;
      reservation = 'reserved';
    } else if (failures.length >= settings.max) {
      // max lowered by a reload: free once enough failures leave the window.
      const freeAt = failures[failures.length - settings.max]! + windowMs;
      reservation = { refusedFor: Math.max(1, Math.ceil((freeAt - now) / 1000)) };
    } else {
      reservation = { refusedFor: 0 }; // full of checks in flight: the caller asks again shortly
    }
  } else {
    if (reserved > 0 && (op.kind === 'release' || op.reserved)) reserved--;
    if (op.kind === 'failure') {
      failures.push(now);
      if (failures.length >= settings.max) {
        lockedUntil = Math.max(lockedUntil, now + settings.lockoutSeconds * 1000);
        failures.length = 0;
      }
    }
  }
  const expiresAt = Math.max(
    failures.length > 0 ? failures[failures.length - 1]! + windowMs : 0,
    lockedUntil,
    reserved > 0 ? reservedUntil : 0,
  );
  return { row: { failures, reserved, reservedUntil, lockedUntil, expiresAt }, reservation };
}

export interface PostgresLockoutStoreOptions {
  logger?: Pick<Logger, 'warn' | 'info' | 'error'>;
  /** Apply pending migrations first (a server); default true. */
  migrate?: boolean;
  /** A server that starts without its database (see SchemaGate). */
  waitForDatabase?: boolean;
}

/**
 * The failure lockout shared by every gatehouse instance on one database.
 *
 * - Checked in memory: a local MemoryLockoutStore answers `refusedFor` and `room` on every
 *   request, so the /api/ hot path makes no database call.
 * - Counted in Postgres: each failure is sent in the background (one transaction on the client's
 *   row, under its row lock: exact however many instances fail it at once). The `max`-th locks
 *   the client there, and a NOTIFY tells every instance, which applies the lock locally; every
 *   5 s each instance also reads the locks in force (NOTIFYs lost while its LISTEN connection was
 *   down). The failing instance applies the lock from its own answer.
 * - Bounded across instances: a client this instance saw fail in the window gets a place in the
 *   shared count (`reserve`, one round trip) before each further check; a client with no failure
 *   here takes no round trip, however many of its checks run at once (the hot path stays off the
 *   database). So `max` exactly once every instance has seen the client fail; a first wave checked
 *   at once on several instances before that goes unreserved (N × `max` at worst; README).
 * - Postgres unreachable: logged once; failures count locally (each instance then allows `max`
 *   by itself), locks already learned keep applying, nothing throws into the request path. The
 *   refresh finds Postgres back, logs it, and counting is shared again (failures seen meanwhile
 *   are not replayed).
 * - Lifted by an operator (`lift`) as a lock spreads: the row is deleted and a NOTIFY tells every
 *   instance, which ends the lock here and tells its listeners (the gateway workers). One whose
 *   LISTEN connection was down finds out at its next refresh (at once on reconnection, else
 *   within 5 s): a lock it had learned from the database that the database no longer holds has
 *   been lifted.
 */
export class PostgresLockoutStore implements LockoutStore {
  private readonly local = new MemoryLockoutStore();
  private readonly listeners = new Set<(key: string, until: number) => void>();
  private readonly liftListeners = new Set<(key: string) => void>();
  /** Tells this store's own lift NOTIFYs from other instances'. */
  private readonly id = randomUUID();
  /** Orders what refresh() reads against the locks and lifts heard meanwhile (by NOTIFY). */
  private seq = 0;
  /** Keys locked here because the database said so (NOTIFY, refresh, a failure's answer): when heard. */
  private readonly fromDatabase = new Map<string, number>();
  /** Keys lifted (by NOTIFY, or here): when heard; a refresh that began before must not lock them again. */
  private readonly liftedAt = new Map<string, number>();
  /** Per key, the last database operation of this instance: a reservation follows its own failures. */
  private readonly chains = new Map<string, Promise<unknown>>();
  private listener: PostgresListener | undefined;
  private timer: NodeJS.Timeout | undefined;
  private refreshing: Promise<void> | undefined;
  private reachable = true; // set by open()
  private outageSaid = false;
  private closed = false;

  private constructor(
    private readonly pool: pg.Pool,
    private readonly logger: Pick<Logger, 'warn' | 'info'> | undefined,
  ) {}

  /**
   * Connects and migrates (rejects when Postgres cannot be reached), learns the locks in force,
   * LISTENs. `waitForDatabase`: opened at once behind the schema gate, counting locally (quietly:
   * the gate says why) until the database answers.
   */
  static async open(
    storage: PostgresStorageConfig,
    options: PostgresLockoutStoreOptions = {},
  ): Promise<PostgresLockoutStore> {
    const config = {
      ...connectionOptions(storage.url),
      connectionTimeoutMillis: QUERY_TIMEOUT_MS,
      query_timeout: QUERY_TIMEOUT_MS,
      max: storage.pool.max,
      idleTimeoutMillis: 30_000,
    };
    const gate = options.waitForDatabase
      ? schemaGateFor(storage, (pool) => migrate(pool, options.logger), options.logger)
      : undefined;
    const pool = gate ? new GatedPool(config, gate) : new pg.Pool(config);
    pool.on('error', () => {}); // an idle connection lost: the next query opens another (and reports)
    try {
      if (!gate && options.migrate !== false) await migrate(pool, options.logger);
    } catch (err) {
      await pool.end().catch(() => {});
      throw err instanceof UsageError ? err : unreachable(storage, err);
    }
    const store = new PostgresLockoutStore(pool, options.logger);
    if (gate)
      store.reachable = await gate.enter().then(
        () => true,
        () => false,
      );
    await store.refresh();
    const listen = () => {
      if (store.closed) return;
      store.listener = new PostgresListener(
        storage.url,
        LOCK_CHANNEL,
        (payload) => store.onNotify(payload),
        options.logger,
      );
    };
    if (gate && !gate.isOpen) void gate.whenOpen().then(listen);
    else listen();
    store.timer = setInterval(() => void store.refresh(), REFRESH_MS);
    store.timer.unref();
    return store;
  }

  /** Whether Postgres answered the last query (false: counting locally). */
  get shared(): boolean {
    return this.reachable;
  }

  refusedFor(key: string, now: number, settings: LockoutSettings): number {
    return this.local.refusedFor(key, now, settings);
  }

  room(key: string, now: number, settings: LockoutSettings): number {
    return this.local.room(key, now, settings);
  }

  activeLocks(now: number): [string, number][] {
    return this.local.activeLocks(now);
  }

  onLocked(listener: (key: string, until: number) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  onLifted(listener: (key: string) => void): () => void {
    this.liftListeners.add(listener);
    return () => this.liftListeners.delete(listener);
  }

  /**
   * Deletes the rows of `keys` (their locks and counts) and NOTIFYs every instance in the same
   * transaction, after this instance's pending operations on them; then ends the locks here.
   * Postgres unreachable: lifted here only, and rejects with LiftNotShared (the next refresh
   * that reaches the database learns the lock again: the lift is to be retried).
   */
  async lift(keys: readonly string[], now: number): Promise<[string, number][]> {
    await Promise.all(keys.map((key) => this.chains.get(key)));
    const lifted = new Map<string, number>();
    let failure: unknown;
    try {
      const rows = await inTransaction(this.pool, async (client) => {
        const { rows } = await client.query<{ key: string; locked_until: number }>(
          'DELETE FROM lockouts WHERE key = ANY($1::text[]) RETURNING key, locked_until',
          [keys],
        );
        // Every key, also those without a row: instances may hold locks of their own (gateway workers' shares).
        const payloads = keys.map((key) => JSON.stringify({ lifted: key, by: this.id }));
        await client.query('SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p', [LOCK_CHANNEL, payloads]);
        return rows;
      });
      this.recovered();
      for (const row of rows) if (row.locked_until > now) lifted.set(row.key, row.locked_until);
    } catch (err) {
      this.unreachable(err);
      failure = err;
    }
    for (const key of keys) {
      const until = this.forget(key, now);
      if (until > (lifted.get(key) ?? 0)) lifted.set(key, until);
    }
    if (failure !== undefined)
      throw new LiftNotShared(`lifted on this instance only: ${(failure as Error).message}`, [...lifted], {
        cause: failure,
      });
    return [...lifted];
  }

  /** Ends the lock of `key` here and forgets its count; until when it was locked here (0: it was not). */
  private forget(key: string, now: number): number {
    this.liftedAt.set(key, ++this.seq);
    this.fromDatabase.delete(key);
    return this.local.unlock(key, now);
  }

  recordFailure(key: string, now: number, settings: LockoutSettings, reserved = false): number {
    const lockedFor = this.local.recordFailure(key, now, settings);
    if (this.reachable || reserved) void this.apply(key, { kind: 'failure', reserved }, now, settings);
    return lockedFor;
  }

  release(key: string, now: number, settings: LockoutSettings): void {
    if (this.reachable) void this.apply(key, { kind: 'release' }, now, settings);
  }

  reserve(key: string, now: number, settings: LockoutSettings): Promise<Reservation> | undefined {
    if (!this.reachable) return undefined;
    return (async () => {
      const deadline = now + RESERVE_WAIT_MS;
      for (let at = now; ; at = Date.now()) {
        const reservation = await this.apply(key, { kind: 'reserve' }, at, settings);
        if (reservation === undefined) return 'unreserved'; // Postgres went away: counted locally
        if (reservation === 'reserved' || reservation === 'unreserved' || reservation.refusedFor > 0)
          return reservation;
        if (Date.now() >= deadline) return { refusedFor: 1 };
        await new Promise((resolve) => setTimeout(resolve, RESERVE_RETRY_MS));
      }
    })();
  }

  /** Runs `op` on the client's row (after this instance's earlier ones on it); undefined when Postgres failed. */
  private apply(key: string, op: LockoutOp, now: number, settings: LockoutSettings): Promise<Reservation | undefined> {
    const previous = this.chains.get(key);
    const run = async (): Promise<Reservation | undefined> => {
      if (previous) await previous;
      try {
        const { row, reservation } = await this.transact(key, op, now, settings);
        this.recovered();
        if (row.lockedUntil > now) this.learn(key, row.lockedUntil);
        return reservation;
      } catch (err) {
        this.unreachable(err);
        return undefined;
      }
    };
    const done = run();
    this.chains.set(key, done);
    void done.then(() => {
      if (this.chains.get(key) === done) this.chains.delete(key);
    });
    return done;
  }

  private async transact(
    key: string,
    op: LockoutOp,
    now: number,
    settings: LockoutSettings,
  ): Promise<{ row: LockoutRow; reservation?: Reservation }> {
    return withClient(this.pool, async (client) => {
      await client.query('BEGIN');
      try {
        // The row is created if missing, then locked: concurrent instances take turns on it.
        const { rows } = await client.query<{
          failures: number[];
          reserved: number;
          reserved_until: number;
          locked_until: number;
          expires_at: number;
        }>(
          `INSERT INTO lockouts AS l (key, expires_at) VALUES ($1, $2::bigint)
           ON CONFLICT (key) DO UPDATE SET key = l.key
           RETURNING failures, reserved, reserved_until, locked_until, expires_at`,
          [key, now],
        );
        const current = rows[0]!;
        const before: LockoutRow = {
          failures: current.failures.map(Number),
          reserved: current.reserved,
          reservedUntil: current.reserved_until,
          lockedUntil: current.locked_until,
          expiresAt: current.expires_at,
        };
        const result = applyLockoutOp(before, op, now, settings);
        const { row } = result;
        await client.query(
          'UPDATE lockouts SET failures = $2::bigint[], reserved = $3, reserved_until = $4::bigint, locked_until = $5::bigint, expires_at = $6::bigint WHERE key = $1',
          [key, row.failures, row.reserved, row.reservedUntil, row.lockedUntil, row.expiresAt],
        );
        // Delivered at COMMIT, to every instance (this one included; applying a lock twice is harmless).
        if (row.lockedUntil > before.lockedUntil)
          await client.query('SELECT pg_notify($1, $2)', [LOCK_CHANNEL, JSON.stringify([key, row.lockedUntil])]);
        await client.query('COMMIT');
        return result;
      } catch (err) {
        await client.query('ROLLBACK').catch(() => {});
        throw err;
      }
    });
  }

  private onNotify(payload: string | undefined): void {
    if (payload === undefined) {
      void this.refresh(); // (re)connected: locks set while it was down are read
      return;
    }
    try {
      const parsed: unknown = JSON.parse(payload);
      if (Array.isArray(parsed) && typeof parsed[0] === 'string' && typeof parsed[1] === 'number')
        this.learn(parsed[0], parsed[1]);
      else if (isLiftNotice(parsed)) {
        // Our own comes too (lift() already ended the lock): ended again, in case a lock heard
        // in between (one another instance set before the lift's commit) came back meanwhile.
        this.forget(parsed.lifted, Date.now());
        if (parsed.by !== this.id) for (const listener of this.liftListeners) listener(parsed.lifted);
      }
    } catch {
      // not ours: ignored
    }
  }

  /**
   * Reads the locks in force, deletes a batch of expired rows; also how an outage is found to be
   * over, and how lifts whose NOTIFY was lost are found: a lock learned from the database before
   * this read that the read no longer has was lifted (an expired one is simply gone).
   */
  private refresh(): Promise<void> {
    this.refreshing ??= (async () => {
      try {
        const now = Date.now();
        const readAt = ++this.seq;
        const { rows } = await this.pool.query<{ key: string; locked_until: number }>(
          'SELECT key, locked_until FROM lockouts WHERE locked_until > $1::bigint',
          [now],
        );
        const inForce = new Set<string>();
        for (const row of rows) {
          inForce.add(row.key);
          // Lifted since the read began: the read is older than the lift.
          if ((this.liftedAt.get(row.key) ?? 0) < readAt) this.learn(row.key, row.locked_until);
        }
        for (const [key, heardAt] of this.fromDatabase) {
          if (heardAt > readAt || inForce.has(key)) continue;
          this.fromDatabase.delete(key);
          if (this.local.unlock(key, Date.now()) > 0) for (const listener of this.liftListeners) listener(key); // lifted elsewhere, its NOTIFY lost
        }
        for (const [key, heardAt] of this.liftedAt) if (heardAt < readAt) this.liftedAt.delete(key);
        await this.pool.query(
          'DELETE FROM lockouts WHERE key IN (SELECT key FROM lockouts WHERE expires_at < $1::bigint LIMIT $2)',
          [now, CLEANUP_BATCH],
        );
        this.recovered();
      } catch (err) {
        if (!this.closed) this.unreachable(err);
      } finally {
        this.refreshing = undefined;
      }
    })();
    return this.refreshing;
  }

  private learn(key: string, until: number): void {
    if (this.closed) return;
    const now = Date.now();
    if (until <= now) return;
    this.fromDatabase.set(key, ++this.seq);
    if (this.local.lockedUntil(key, now) >= until) return; // known already: listeners are told once
    this.local.lockUntil(key, until, now);
    for (const listener of this.listeners) listener(key, until);
  }

  private unreachable(err: unknown): void {
    if (!this.reachable || this.closed) return;
    this.reachable = false;
    this.outageSaid = true;
    this.logger?.warn(
      { err: (err as Error).message },
      'postgres unreachable: failures are counted by this instance alone until it is back (locks already learned still apply)',
    );
  }

  private recovered(): void {
    if (this.reachable) return;
    this.reachable = true;
    // Opened behind the schema gate, the first success is no news: the gate says the database is reached.
    if (this.outageSaid) this.logger?.info('postgres reachable again: the lockout count is shared again');
    this.outageSaid = false;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    await this.listener?.close();
    await Promise.allSettled([...this.chains.values(), this.refreshing]);
    await this.pool.end().catch(() => {});
  }
}

function isLiftNotice(value: unknown): value is { lifted: string; by: string } {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as { lifted?: unknown }).lifted === 'string' &&
    typeof (value as { by?: unknown }).by === 'string'
  );
}
