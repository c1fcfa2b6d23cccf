import pg from 'pg';
import type { Logger } from 'pino';
import type { PostgresStorageConfig } from '../../config/schema.js';
import { UsageError } from '../../errors.js';
import { connectionOptions, describeUrl } from './pool.js';

/** Capped exponential backoff between checks while the database cannot be reached (undici's shape). */
const FIRST_RETRY_MS = 1_000;
const MAX_RETRY_MS = 30_000;
/** A check that gets no answer fails this soon: the next one is scheduled, nothing waits on it. */
const CHECK_TIMEOUT_MS = 5_000;

type Check = (pool: pg.Pool) => Promise<unknown>;

/**
 * The schema check a server's pools wait behind when gatehouse starts without its database
 * (`storage.requireAtStart` false): migrations are applied (or the version is checked) once
 * PostgreSQL answers, retried in the background with capped backoff. Until then every query
 * through a gated pool fails at once with the reason, as during an outage (webhooks 503,
 * `/readyz` fails `store`, the lockout and rate limits count locally); once checked the gate
 * stays open and later outages are the pool's, as before. One gate per process and database,
 * so each change of state is logged once, one line.
 */
export class SchemaGate {
  private open = false;
  private checking: Promise<void> | undefined;
  private reason: Error | undefined;
  private loggedReason: string | undefined;
  private retryMs = FIRST_RETRY_MS;
  private timer: NodeJS.Timeout | undefined;
  private users = 0;
  private readonly opened: Promise<void>;
  private markOpened!: () => void;

  constructor(
    private readonly storage: PostgresStorageConfig,
    private readonly check: Check,
    private readonly logger: Pick<Logger, 'warn' | 'info' | 'error'> | undefined,
  ) {
    this.opened = new Promise((resolve) => (this.markOpened = resolve));
  }

  get isOpen(): boolean {
    return this.open;
  }

  /** Resolves once the schema is current; rejects at once with the last reason while it is not (a check is scheduled). */
  enter(): Promise<void> {
    if (this.open) return Promise.resolve();
    if (!this.checking && !this.timer) this.runCheck();
    if (this.reason) return Promise.reject(this.reason);
    return this.checking!;
  }

  /** Resolves when the gate opens (Gmail waits for it); never rejects. */
  whenOpen(): Promise<void> {
    if (!this.open && !this.checking && !this.timer) this.runCheck();
    return this.opened;
  }

  /** Counted so the last store to close stops the retries. */
  acquire(): void {
    this.users++;
  }

  release(): void {
    if (--this.users > 0) return;
    clearTimeout(this.timer);
    this.timer = undefined;
    gates.delete(gateKey(this.storage));
  }

  private runCheck(): void {
    this.timer = undefined;
    const pool = new pg.Pool({
      ...connectionOptions(this.storage.url),
      connectionTimeoutMillis: CHECK_TIMEOUT_MS,
      max: 1,
    });
    pool.on('error', () => {}); // the check's own connection: its failure is the check's
    this.checking = this.check(pool)
      .then(() => {
        this.open = true;
        this.reason = undefined;
        if (this.loggedReason !== undefined)
          this.logger?.info(`postgres: reached ${describeUrl(this.storage.url)}, schema current: storage resumes`);
        this.markOpened();
      })
      .catch((err: unknown) => {
        this.reason = asOneLine(err, this.storage);
        if (this.reason.message !== this.loggedReason) {
          this.loggedReason = this.reason.message;
          const log = err instanceof UsageError ? this.logger?.error : this.logger?.warn;
          log?.call(
            this.logger,
            `${this.reason.message}: webhooks answer 503 and the lockout and rate limits count locally until it is; retrying every ${MAX_RETRY_MS / 1000} s at most`,
          );
        }
        if (this.users > 0) {
          this.timer = setTimeout(() => this.runCheck(), this.retryMs);
          this.timer.unref();
        }
        this.retryMs = Math.min(this.retryMs * 2, MAX_RETRY_MS);
        throw this.reason;
      })
      .finally(() => {
        this.checking = undefined;
        void pool.end().catch(() => {});
      });
    this.checking.catch(() => {}); // a check nobody waits on is not an unhandled rejection
  }
}

/** The database's own refusal (a newer schema) as it is; a connection failure as one line naming the database. */
function asOneLine(err: unknown, storage: PostgresStorageConfig): Error {
  return err instanceof UsageError ? err : unreachable(storage, err);
}

/** "postgres: cannot reach <url> (storage.url): <why>": one line, no password, no stack. */
export function unreachable(storage: PostgresStorageConfig, err: unknown): UsageError {
  const e = err as NodeJS.ErrnoException;
  // A refused `localhost` is an AggregateError (one per address): its message is empty, its code says it.
  const why = !e.message
    ? (e.code ?? 'no answer')
    : e.code && !e.message.includes(e.code)
      ? `${e.message} (${e.code})`
      : e.message;
  const error: UsageError & { code?: string } = new UsageError(
    `postgres: cannot reach ${describeUrl(storage.url)} (storage.url): ${why}`,
  );
  error.code = e.code; // /readyz names it
  return error;
}

const gates = new Map<string, SchemaGate>();
const gateKey = (storage: PostgresStorageConfig) => storage.url;

/** This process's gate for the database (see SchemaGate), made at first use. */
export function schemaGateFor(
  storage: PostgresStorageConfig,
  check: Check,
  logger?: Pick<Logger, 'warn' | 'info' | 'error'>,
): SchemaGate {
  let gate = gates.get(gateKey(storage));
  if (!gate) {
    gate = new SchemaGate(storage, check, logger);
    gates.set(gateKey(storage), gate);
  }
  return gate;
}

/**
 * A pool whose connections wait behind a gate: `pool.query` takes its connection through
 * `connect` (pg-pool), so one override covers both. Once the gate is open it costs one check.
 */
export class GatedPool extends pg.Pool {
  constructor(
    config: pg.PoolConfig,
    readonly gate: SchemaGate,
  ) {
    super(config);
    gate.acquire();
  }

  // pg-pool's connect has a promise form and a callback form (the one pool.query uses).
  override connect(...args: unknown[]): never {
    const callback = args[0] as
      ((err: Error | undefined, client?: pg.PoolClient, done?: () => void) => void) | undefined;
    const connect = (super.connect as (...a: unknown[]) => unknown).bind(this);
    if (this.gate.isOpen) return connect(...args) as never;
    const entered = this.gate.enter();
    if (callback) {
      entered.then(
        () => connect(callback),
        (err: Error) => callback(err, undefined, () => {}),
      );
      return undefined as never;
    }
    return entered.then(() => connect()) as never;
  }

  private released = false;

  override async end(): Promise<void> {
    if (!this.released) {
      this.released = true;
      this.gate.release();
    }
    await super.end();
  }
}

/** Resolves once a pool's schema is checked: at once for an ungated pool (checked before it was returned). */
export function whenSchemaReady(pool: pg.Pool): Promise<void> {
  return pool instanceof GatedPool ? pool.gate.whenOpen() : Promise.resolve();
}
