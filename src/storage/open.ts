import type { Logger } from 'pino';
import type { StorageConfig } from '../config/schema.js';
import { UsageError } from '../errors.js';
import type { EventStore } from './events.js';
import { PostgresEventStore } from './postgres/events.js';
import { describeUrl } from './postgres/pool.js';
import { SqliteEventStore } from './sqlite/events.js';

/**
 * The event store a config names. `server`: the one a running gatehouse uses (SQLite: this
 * process becomes the file's single writer; Postgres: migrations applied, LISTEN for other
 * instances). `cli`: an existing store only, beside any running servers.
 */
export async function openEventStore(storage: StorageConfig, options: { role: 'server' | 'cli'; logger?: Logger }): Promise<EventStore> {
  if (storage.driver === 'postgres') {
    return PostgresEventStore.open(storage, { logger: options.logger, migrate: options.role === 'server', listen: options.role === 'server' });
  }
  if (options.role === 'server') return new SqliteEventStore(storage.path, { singleWriter: true });
  try {
    return new SqliteEventStore(storage.path, { mustExist: true });
  } catch (err) {
    throw new UsageError(`cannot open the event store ${storage.path} (storage.path): ${(err as Error).message}`);
  }
}

/**
 * storage.path, for what keeps its state in the SQLite file only for now (Gmail, channels).
 * On another driver, a UsageError saying so (the config check refuses them there already).
 */
export function sqliteStoragePath(storage: StorageConfig, what: string): string {
  if (storage.driver !== 'sqlite') throw new UsageError(`${what} needs storage.driver "sqlite" for now (this config uses "${storage.driver}")`);
  return storage.path;
}

/** Where the storage is, for logs and messages (never a password). */
export function describeStorage(storage: StorageConfig): string {
  return storage.driver === 'sqlite' ? storage.path : describeUrl(storage.url);
}
