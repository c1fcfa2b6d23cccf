import { existsSync } from 'node:fs';
import type { Logger } from 'pino';
import type { StorageConfig } from '../config/schema.js';
import type { LockoutStore } from '../http/lockout.js';
import { UsageError } from '../errors.js';
import type { ChannelStore } from './contracts/channels.js';
import type { EventStore } from './contracts/events.js';
import type { GmailStore } from './contracts/gmail.js';
import { PostgresChannelStore } from './postgres/channels.js';
import { PostgresEventStore } from './postgres/events.js';
import { PostgresGmailStore } from './postgres/gmail.js';
import { PostgresLockoutStore } from './postgres/lockout.js';
import { createPool, describeUrl } from './postgres/pool.js';
import { PostgresRateLimitStore } from './postgres/rate-limits.js';
import type { RateLimitStore } from './contracts/rate-limits.js';
import { SqliteChannelStore } from './sqlite/channels.js';
import { SqliteEventStore } from './sqlite/events.js';
import { peekSqliteStoredProject, SqliteGmailStore } from './sqlite/gmail.js';

/**
 * The event store a config names. `server`: the one a running gatehouse uses (SQLite: this
 * process becomes the file's single writer; Postgres: migrations applied, LISTEN for other
 * instances). `cli`: an existing store only, beside any running servers. `setup`: beside any
 * running servers too, but created (SQLite) or migrated (Postgres) when it is not there yet
 * (`webhooks gmail setup`, the first command of a new install).
 */
export async function openEventStore(
  storage: StorageConfig,
  options: { role: 'server' | 'cli' | 'setup'; logger?: Logger },
): Promise<EventStore> {
  if (storage.driver === 'postgres') {
    return PostgresEventStore.open(storage, {
      logger: options.logger,
      migrate: options.role !== 'cli',
      listen: options.role === 'server',
      waitForDatabase: waitsForDatabase(storage, options.role),
    });
  }
  if (options.role === 'cli') refuseMissingSqliteStore(storage.path);
  try {
    if (options.role === 'server')
      return new SqliteEventStore(storage.path, { singleWriter: true, logger: options.logger });
    return new SqliteEventStore(storage.path, { mustExist: options.role === 'cli' });
  } catch (err) {
    // A path that is a folder, under a file, not SQLite: one line, not the driver's stack (found by an outside attack).
    if (err instanceof UsageError) throw err;
    throw new UsageError(`cannot open the event store ${storage.path} (storage.path): ${(err as Error).message}`);
  }
}

/**
 * Whether a server's event store can be used yet, and when it can: at once, except a PostgreSQL
 * store still waiting for its database after a start without it (src/storage/postgres/schema-gate.ts).
 */
export function storeReadiness(store: EventStore): { ready: boolean; whenReady(): Promise<void> } {
  if (store instanceof PostgresEventStore)
    return { ready: store.schemaReady, whenReady: () => store.whenSchemaReady() };
  return { ready: true, whenReady: () => Promise.resolve() };
}

/**
 * The Gmail state beside an event store, on the same engine and connection (its commits include
 * events): the SQLite file's, or the database's pool.
 */
export function openGmailStore(events: EventStore): GmailStore {
  if (events instanceof SqliteEventStore) return new SqliteGmailStore(events);
  if (events instanceof PostgresEventStore) return new PostgresGmailStore(events);
  throw new Error('webhooks.gmail needs an event store of one of the storage drivers');
}

/**
 * The channel state a config names, on a connection of its own (the receiver, each gateway
 * worker and the CLI open one each). `server` and `setup` (`channels login`, the first command
 * of a new install): created (SQLite) or migrated (Postgres) when not there yet; `cli`: an
 * existing store only.
 */
export async function openChannelStore(
  storage: StorageConfig,
  options: { role: 'server' | 'setup' | 'cli'; logger?: Logger },
): Promise<ChannelStore> {
  if (storage.driver === 'postgres')
    return PostgresChannelStore.open(storage, {
      migrate: options.role !== 'cli',
      logger: options.logger,
      waitForDatabase: waitsForDatabase(storage, options.role),
    });
  if (options.role === 'cli') refuseMissingSqliteStore(storage.path);
  return new SqliteChannelStore(storage.path);
}

/**
 * A server starts without its database unless `storage.requireAtStart`: its stores open at once
 * and wait behind the schema check (src/storage/postgres/schema-gate.ts). Commands never wait.
 */
function waitsForDatabase(storage: StorageConfig & { driver: 'postgres' }, role: string): boolean {
  return role === 'server' && !storage.requireAtStart;
}

/** A command that only reads the store never creates one: said as what to do instead (found by a newcomer, and an outside attack). */
function refuseMissingSqliteStore(file: string): void {
  if (!existsSync(file))
    throw new UsageError(
      `no store at ${file} (storage.path) yet: gatehouse creates it at its first start, or run \`gatehouse storage migrate\``,
    );
}

/**
 * The rate-limit buckets shared by every instance on the storage (Postgres; its schema is
 * migrated by the server's other stores), on a connection of its own per gateway process.
 * Undefined on SQLite: one instance, buckets in memory.
 */
export function openRateLimitStore(storage: StorageConfig): RateLimitStore | undefined {
  return storage.driver === 'postgres' ? new PostgresRateLimitStore(storage) : undefined;
}

/**
 * The failure lockout every instance shares on PostgreSQL (counted there, checked in memory), on
 * a connection of its own; undefined on SQLite (one instance: counted in memory).
 */
export async function openSharedLockoutStore(
  storage: StorageConfig,
  options: { logger?: Logger } = {},
): Promise<(LockoutStore & { close(): Promise<void> }) | undefined> {
  return storage.driver === 'postgres'
    ? PostgresLockoutStore.open(storage, { ...options, waitForDatabase: waitsForDatabase(storage, 'server') })
    : undefined;
}

/**
 * The project stored with a Gmail account's grant, read without creating or changing anything
 * (setup reads it before it opens the store, and --dry-run never opens it): undefined when the
 * storage, its schema or the row is not there, or it cannot be read.
 */
export async function peekStoredProject(storage: StorageConfig, account: string): Promise<string | undefined> {
  if (storage.driver === 'sqlite') return peekSqliteStoredProject(storage.path, account);
  const pool = createPool({ ...storage, pool: { max: 1 } });
  try {
    const { rows } = await pool.query<{ project: string | null }>(
      'SELECT project FROM gmail_accounts WHERE account = $1',
      [account],
    );
    return rows[0]?.project ?? undefined;
  } catch {
    return undefined; // unreachable or no schema: as if nothing were kept (opening it for real says why)
  } finally {
    await pool.end().catch(() => {});
  }
}

/** Where the storage is, for logs and messages (never a password). */
export function describeStorage(storage: StorageConfig): string {
  return storage.driver === 'sqlite' ? storage.path : describeUrl(storage.url);
}
