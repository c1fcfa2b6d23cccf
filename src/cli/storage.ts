import { existsSync } from 'node:fs';
import type { Command } from 'commander';
import type { PostgresStorageConfig } from '../config/schema.js';
import { UsageError } from '../errors.js';
import {
  channelGrantContext,
  gmailGrantContext,
  openSealed,
  PREVIOUS_SECRET_KEYS_VARIABLE,
  SECRET_KEY_VARIABLE,
  sealSecret,
  secretKeysFromEnv,
} from '../storage/secrets.js';
import { describeStorage, openChannelStore, openEventStore, openGmailStore } from '../storage/open.js';
import type { SealedChange } from '../storage/contracts/sealed.js';
import { importChannelState, NotEmpty } from '../storage/postgres/channels.js';
import { PostgresEventStore } from '../storage/postgres/events.js';
import { importGmailState } from '../storage/postgres/gmail.js';
import { exportChannelState } from '../storage/sqlite/channels.js';
import { SqliteEventStore } from '../storage/sqlite/events.js';
import { exportGmailState } from '../storage/sqlite/gmail.js';
import { WriterLockBusyError } from '../storage/sqlite/writer-lock.js';
import { DEFAULT_CONFIG_FILE, envFileOption, storageConfigOf, type StorageOptions } from './config.js';

/**
 * `gatehouse storage migrate|status|copy|reseal`: the storage a config names, on either driver.
 * `migrate` brings the schema up to date (servers also do at start, under an advisory lock on
 * Postgres); `status` shows the schema version and the queue; `copy` moves an SQLite store into
 * an empty PostgreSQL database; `reseal` finishes a GATEHOUSE_SECRET_KEY rotation.
 */
export function registerStorageCommands(program: Command): void {
  const storage = program.command('storage').description('the durable storage (SQLite file or PostgreSQL database)');

  storage
    .command('migrate')
    .description('create or bring up to date the storage schema')
    .option('-c, --config <file>', 'config file (for storage)', DEFAULT_CONFIG_FILE)
    .addOption(envFileOption())
    .action(async (options: StorageOptions) => {
      const settings = storageConfigOf(options);
      // Opening migrates: SQLite creates its tables, Postgres applies what schema_migrations lacks.
      const store = await openEventStore(settings, { role: 'setup' }).catch(unreachable(describeStorage(settings)));
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
    .addOption(envFileOption())
    .option('--json', 'as JSON')
    .action(async (options: StorageOptions & { json?: boolean }) => {
      const settings = storageConfigOf(options);
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

  registerCopyCommand(storage);
  registerResealCommand(storage);
}

/**
 * `storage reseal`: after a GATEHOUSE_SECRET_KEY rotation (the old key in
 * GATEHOUSE_SECRET_KEY_PREVIOUS), seals every stored grant again under the current key, so the
 * old one can be dropped. Every grant is opened first: if one opens with none of the keys,
 * nothing is written. Each is replaced only while it still holds what was read (a running
 * server may refresh it meanwhile), so running it again is safe and reports what is left.
 */
function registerResealCommand(storage: Command): void {
  storage
    .command('reseal')
    .description(
      `seal every stored secret (Gmail and channel grants) again under the current ${SECRET_KEY_VARIABLE}, after a key rotation`,
    )
    .option('-c, --config <file>', 'config file (for storage)', DEFAULT_CONFIG_FILE)
    .addOption(envFileOption())
    .option('--json', 'the counts as JSON')
    .action(async (options: StorageOptions & { json?: boolean }) => {
      const settings = storageConfigOf(options);
      const keys = secretKeysFromEnv();
      const where = describeStorage(settings);
      const events = await openEventStore(settings, { role: 'cli' }).catch(unreachable(where));
      try {
        const channels = await openChannelStore(settings, { role: 'cli' }).catch(unreachable(where));
        try {
          const gmail = openGmailStore(events);
          const stored = [
            ...(await gmail.sealedGrants()).map((g) => ({
              what: `Gmail account ${g.account}`,
              of: 'gmail' as const,
              key: g.account,
              sealed: g.sealed,
              context: gmailGrantContext(g.account),
            })),
            ...(await channels.grants()).map((g) => ({
              what: `channel ${g.name}`,
              of: 'channels' as const,
              key: g.name,
              sealed: g.sealed,
              context: channelGrantContext(g.name),
            })),
          ];
          const changes: Record<'gmail' | 'channels', SealedChange[]> = { gmail: [], channels: [] };
          const unreadable: string[] = [];
          for (const secret of stored) {
            try {
              const { plaintext, underCurrentKey } = openSealed(secret.sealed, keys, secret.context);
              if (!underCurrentKey)
                changes[secret.of].push({
                  key: secret.key,
                  from: secret.sealed,
                  to: sealSecret(plaintext, keys, secret.context),
                });
            } catch (err) {
              unreadable.push(`${secret.what}: ${(err as Error).message}`);
            }
          }
          if (unreadable.length > 0) {
            throw new UsageError(
              `nothing resealed: ${unreadable.length} stored secret(s) open with none of the keys given (put the key they were sealed with in ${PREVIOUS_SECRET_KEYS_VARIABLE}):\n  ${unreadable.join('\n  ')}`,
            );
          }
          const toReseal = changes.gmail.length + changes.channels.length;
          const resealed = {
            gmail: await gmail.replaceSealedGrants(changes.gmail),
            channels: await channels.replaceSealedGrants(changes.channels),
          };
          const changedMeanwhile = toReseal - resealed.gmail - resealed.channels;
          const counts = {
            stored: stored.length,
            resealed: resealed.gmail + resealed.channels,
            alreadyCurrent: stored.length - toReseal,
            changedMeanwhile,
            gmail: resealed.gmail,
            channels: resealed.channels,
            // Every stored secret opens with the current key now: the previous ones can go.
            allUnderCurrentKey: changedMeanwhile === 0,
          };
          if (options.json) return print(JSON.stringify({ storage: where, ...counts }));
          print(
            `${where}: ${counts.resealed} of ${counts.stored} stored secret(s) sealed again under ${SECRET_KEY_VARIABLE} (Gmail ${counts.gmail}, channels ${counts.channels}); ${counts.alreadyCurrent} already were`,
          );
          if (changedMeanwhile > 0)
            print(
              `${counts.changedMeanwhile} changed meanwhile (a running server sealed it again): run storage reseal again to check`,
            );
          else if (keys.previous.length > 0)
            print(
              `every stored secret is now under ${SECRET_KEY_VARIABLE}: ${PREVIOUS_SECRET_KEYS_VARIABLE} can be removed (from every instance)`,
            );
        } finally {
          await channels.close();
        }
      } finally {
        await events.close();
      }
    });
}

/**
 * `storage copy`: the config's SQLite store into an empty PostgreSQL database, all or nothing.
 * The order makes every refusal change nothing: the SQLite file first (the writer lock, so no
 * server accepts on it meanwhile), and only then the target (migrated, then checked empty inside
 * the one transaction that copies events, Gmail state and channel state together).
 */
function registerCopyCommand(storage: Command): void {
  storage
    .command('copy')
    .description(
      'copy the SQLite store (events, attempts, dedupe keys, Gmail and channel state) into an empty PostgreSQL database',
    )
    .requiredOption('--to <url>', 'the target: a postgres:// URL (migrated here; it must hold no events)')
    .option('-c, --config <file>', 'config file (its storage is the SQLite source)', DEFAULT_CONFIG_FILE)
    .addOption(envFileOption())
    .option('--json', 'the counts as JSON')
    .action(async (options: StorageOptions & { to: string; json?: boolean }) => {
      const settings = storageConfigOf(options);
      if (settings.driver !== 'sqlite')
        throw new UsageError(
          `storage copy reads the SQLite store the config names, and this config's storage.driver is "${settings.driver}"`,
        );
      if (!/^postgres(ql)?:\/\/./.test(options.to))
        throw new UsageError('--to must be a postgres:// (or postgresql://) URL');
      if (!existsSync(settings.path)) throw new UsageError(`no SQLite store at ${settings.path} (storage.path)`);
      const target: PostgresStorageConfig = { driver: 'postgres', url: options.to, pool: { max: 2 } };

      let source: SqliteEventStore;
      try {
        // The server's lock: refused while a server has the file, and no server starts on it until the copy is done.
        source = new SqliteEventStore(settings.path, { mustExist: true, singleWriter: true });
      } catch (err) {
        if (err instanceof WriterLockBusyError) {
          throw new UsageError(
            `${settings.path} is in use by a gatehouse server (pid ${err.holder ?? 'unknown'}): stop it first, so that no event is accepted there once the copy has started`,
          );
        }
        throw new UsageError(`cannot open the SQLite store ${settings.path}: ${(err as Error).message}`);
      }
      try {
        // Small (a few rows per account, channel and device): read whole, from the file the lock keeps still.
        const gmail = exportGmailState(source.database);
        const channels = exportChannelState(source.database);
        const where = describeStorage(target);
        const store = await PostgresEventStore.open(target, { migrate: true }).catch(unreachable(where));
        try {
          const counts = await store
            .importAll(source.exportAll(), async (client) => {
              await importGmailState(client, gmail);
              await importChannelState(client, channels);
            })
            .catch((err: unknown) => {
              if (err instanceof UsageError) throw err;
              if (err instanceof NotEmpty)
                throw new UsageError(
                  `the target ${where} is not empty (${err.message}): storage copy only writes into an empty schema`,
                );
              throw new UsageError(`the copy to ${where} failed and was rolled back: ${(err as Error).message}`);
            });
          const copiedGmail = { accounts: gmail.accounts.length, seenIds: gmail.seen.length };
          const copiedChannels = {
            grants: channels.grants.length,
            devices: channels.devices.length,
            pairings: channels.pairings.length,
            outbox: channels.outbox.length,
            oauthRequests: channels.oauthRequests.length,
          };
          const { schemaVersion } = await store.status(Date.now());
          if (options.json)
            return print(
              JSON.stringify({
                from: settings.path,
                to: where,
                schemaVersion,
                ...counts,
                gmail: copiedGmail,
                channels: copiedChannels,
              }),
            );
          const { queued, delivered, dead } = counts.byStatus;
          print(`copied ${counts.events} event(s) from ${settings.path} to ${where} (schema version ${schemaVersion})`);
          print(
            `  ${queued} queued, ${delivered} delivered, ${dead} dead; ${counts.attempts} attempt(s), ${counts.idempotencyKeys} delivery id(s), ${counts.replayKeys} replay key(s)`,
          );
          print(`  Gmail: ${copiedGmail.accounts} account(s), ${copiedGmail.seenIds} remembered message id(s)`);
          print(
            `  channels: ${copiedChannels.grants} login(s), ${copiedChannels.devices} device(s), ${copiedChannels.pairings} pairing code(s), ${copiedChannels.outbox} outbox message(s), ${copiedChannels.oauthRequests} login request(s)`,
          );
          print(
            'next: set storage to { driver: "postgres", url: … } in the config and start the servers; the SQLite file is left as it was',
          );
        } finally {
          await store.close();
        }
      } finally {
        await source.close();
      }
    });
}

/** A connection failure is the user's to fix (address, credentials, server down): said plainly, without a stack. */
export function unreachable(where: string) {
  return (err: unknown): never => {
    if (err instanceof UsageError) throw err;
    throw new UsageError(`cannot use the storage ${where}: ${(err as Error).message}`);
  };
}

function print(line: string): void {
  process.stdout.write(line + '\n');
}
