import type { Command } from 'commander';
import { loadConfig } from '../config/load.js';
import { UsageError } from '../errors.js';
import { describeStorage, openEventStore } from '../storage/open.js';
import { PostgresEventStore } from '../storage/postgres/events.js';
import { SqliteEventStore } from '../storage/sqlite/events.js';
import { DEFAULT_CONFIG_FILE } from './config.js';

/**
 * `gatehouse storage migrate|status`: the storage a config names, on either driver. `migrate`
 * brings the schema up to date (servers also do at start, under an advisory lock on Postgres);
 * `status` shows the schema version and the queue.
 */
export function registerStorageCommands(program: Command): void {
  const storage = program.command('storage').description('the durable storage (SQLite file or PostgreSQL database)');

  storage
    .command('migrate')
    .description('create or bring up to date the storage schema')
    .option('-c, --config <file>', 'config file (for storage)', DEFAULT_CONFIG_FILE)
    .action(async (options: { config: string }) => {
      const { storage: settings } = loadConfig(options.config).config;
      // Opening migrates: SQLite creates its tables, Postgres applies what schema_migrations lacks.
      const store = settings.driver === 'postgres'
        ? await PostgresEventStore.open(settings, { migrate: true }).catch(unreachable(describeStorage(settings)))
        : new SqliteEventStore(settings.path);
      try {
        const { schemaVersion } = await store.status(Date.now());
        print(`${settings.driver} ${describeStorage(settings)}: schema at version ${schemaVersion}`);
      } finally {
        await store.close();
      }
    });

  storage
    .command('status')
    .description('schema version and queued, delivered and dead event counts')
    .option('-c, --config <file>', 'config file (for storage)', DEFAULT_CONFIG_FILE)
    .option('--json', 'as JSON')
    .action(async (options: { config: string; json?: boolean }) => {
      const { storage: settings } = loadConfig(options.config).config;
      const store = await openEventStore(settings, { role: 'cli' }).catch(unreachable(describeStorage(settings)));
      try {
        const status = await store.status(Date.now());
        if (options.json) return print(JSON.stringify(status));
        print(`driver          ${status.driver}`);
        print(`location        ${status.location}`);
        print(`schema version  ${status.schemaVersion}`);
        print(`queued          ${status.counts.queued}${status.leased ? ` (${status.leased} being delivered)` : ''}`);
        print(`delivered       ${status.counts.delivered}`);
        print(`dead            ${status.counts.dead}`);
      } finally {
        await store.close();
      }
    });
}

/** A connection failure is the user's to fix (address, credentials, server down): said plainly, without a stack. */
function unreachable(where: string) {
  return (err: unknown): never => {
    if (err instanceof UsageError) throw err;
    throw new UsageError(`cannot use the storage ${where}: ${(err as Error).message}`);
  };
}

function print(line: string): void {
  process.stdout.write(line + '\n');
}
