import type { Command } from 'commander';
import { UsageError } from '../errors.js';
import { describeStorage, openEventStore } from '../storage/open.js';
import {
  DELIVERY_STATUSES as STATUSES,
  IDEMPOTENCY_WINDOW_MS,
  type DeliveryStatus,
  type EventStore,
  type PurgeResult,
  type StoredEvent,
} from '../storage/contracts/events.js';
import { listEvents, retryEvents } from '../admin/deliveries.js';
import { DEFAULT_CONFIG_FILE, envFileOption, storageConfigOf, type StorageOptions } from './config.js';
import { registerGmailCommands } from './gmail.js';
import { toJsonWithIsoDates } from '../admin/json.js';
import { parseDuration } from './gateway.js';
import { unreachable } from './storage.js';

/**
 * `gatehouse webhooks deliveries list|show|retry|purge`: reads and edits the store the config
 * names, beside the running servers (SQLite: WAL lets both work at once, the server polls for
 * requeued events; Postgres: a requeue also NOTIFYs the servers).
 */
export function registerWebhooksCommands(program: Command): void {
  const webhooks = program.command('webhooks').description('the webhook receiver');
  registerGmailCommands(webhooks);
  const deliveries = webhooks
    .command('deliveries')
    .description('inspect and manage stored webhook events and their deliveries');

  const withStore = async <T>(options: StorageOptions, work: (store: EventStore) => Promise<T>): Promise<T> => {
    const storage = storageConfigOf(options);
    const store = await openEventStore(storage, { role: 'cli' }).catch(unreachable(describeStorage(storage)));
    try {
      return await work(store);
    } finally {
      await store.close();
    }
  };

  deliveries
    .command('list')
    .description('list events, newest first')
    .option('-c, --config <file>', 'config file (for storage)', DEFAULT_CONFIG_FILE)
    .addOption(envFileOption())
    .option('--status <status>', 'queued | delivered | dead')
    .option('--endpoint <path>', 'only events received on this endpoint path')
    .option('--limit <n>', 'at most this many', '100')
    .option('--json', 'one JSON array')
    .action(async (options: StorageOptions & { status?: string; endpoint?: string; limit: string; json?: boolean }) => {
      if (options.status !== undefined && !STATUSES.includes(options.status as DeliveryStatus)) {
        throw new UsageError(`--status must be one of ${STATUSES.join(', ')} (got "${options.status}")`);
      }
      const limit = Number(options.limit);
      // Safe integers only: 1e20 is an integer to JavaScript, and a stack from the database's bigint.
      if (!Number.isSafeInteger(limit) || limit < 1)
        throw new UsageError(`--limit must be a positive integer (got "${options.limit}")`);
      const { events } = await withStore(options, (store) =>
        listEvents(store, {
          filter: { status: options.status as DeliveryStatus | undefined, endpoint: options.endpoint },
          limit,
        }),
      );
      if (options.json) return print(toJsonWithIsoDates(events.map(summary)));
      if (events.length === 0) return print('no events');
      print(['id', 'status', 'attempts', 'endpoint', 'action', 'received', 'last error'].join('\t'));
      for (const e of events) {
        print(
          [
            e.id,
            e.status,
            e.attempts,
            e.endpoint,
            e.action,
            new Date(e.receivedAt).toISOString(),
            e.lastError ?? '',
          ].join('\t'),
        );
      }
    });

  deliveries
    .command('show <id>')
    .description('one event: its envelope and every delivery attempt')
    .option('-c, --config <file>', 'config file (for storage)', DEFAULT_CONFIG_FILE)
    .addOption(envFileOption())
    .option('--json', 'as JSON')
    .action(async (id: string, options: StorageOptions & { json?: boolean }) => {
      const found = await withStore(options, (store) => store.get(id));
      if (!found) throw new UsageError(`no event ${id}`);
      if (options.json)
        return print(
          toJsonWithIsoDates({
            event: { ...summary(found.event), envelope: JSON.parse(found.event.envelope) },
            attempts: found.attempts,
          }),
        );
      const e = found.event;
      print(`${e.id}  ${e.status}  ${e.endpoint} -> ${e.action}  received ${new Date(e.receivedAt).toISOString()}`);
      if (e.status === 'queued') print(`next attempt ${new Date(e.nextAttemptAt).toISOString()}`);
      print(`envelope: ${e.envelope}`);
      if (found.attempts.length === 0) print('no attempts yet');
      for (const a of found.attempts) {
        print(
          `  #${a.attempt} ${new Date(a.at).toISOString()}  ${a.status ?? '-'}  ${a.durationMs} ms${a.error ? `  ${a.error}` : ''}`,
        );
      }
    });

  deliveries
    .command('retry [id]')
    .description(
      'deliver one event again now, with a fresh attempt budget (delivered, dead, or queued waiting for a retry); or every dead one (--dead), or every one waiting for a retry (--queued)',
    )
    .option('-c, --config <file>', 'config file (for storage)', DEFAULT_CONFIG_FILE)
    .addOption(envFileOption())
    .option('--dead', 'requeue every dead event')
    .option('--queued', 'every queued event waiting for a retry: due now')
    .action(async (id: string | undefined, options: StorageOptions & { dead?: boolean; queued?: boolean }) => {
      if ([id !== undefined, options.dead, options.queued].filter(Boolean).length !== 1)
        throw new UsageError('give one of: an event id, --dead, --queued');
      if (options.dead) {
        const count = await withStore(options, (store) =>
          retryEvents(store, { filter: { status: 'dead' }, includeDelivered: false }, Date.now()),
        );
        return print(`requeued ${count} dead event(s)`);
      }
      if (options.queued) {
        const count = await withStore(options, (store) =>
          retryEvents(store, { filter: { status: 'queued' }, includeDelivered: false }, Date.now()),
        );
        return print(`${count} queued event(s) waiting for a retry are due now`);
      }
      const done = await withStore(options, (store) =>
        retryEvents(store, { ids: [id!], includeDelivered: true }, Date.now()),
      );
      if (!done)
        throw new UsageError(
          `no event ${id} to retry (unknown, or queued and already due: being delivered or next in line)`,
        );
      print(`requeued ${id}`);
    });

  deliveries
    .command('purge')
    .description('delete delivered events (and their attempts) older than a duration')
    .option('-c, --config <file>', 'config file (for storage)', DEFAULT_CONFIG_FILE)
    .addOption(envFileOption())
    .option('--delivered', 'required: only delivered events are ever purged')
    .requiredOption('--older-than <duration>', 'e.g. 7d, 12h')
    .option('--json', 'one JSON object: purged, keptInWindow')
    .action(async (options: StorageOptions & { delivered?: boolean; olderThan: string; json?: boolean }) => {
      if (!options.delivered) throw new UsageError('purge needs --delivered (queued and dead events are never purged)');
      const cutoff = Date.now() - parseDuration(options.olderThan, '--older-than');
      const result = await withStore(options, (store) => store.purgeDelivered(cutoff, Date.now()));
      if (options.json) return print(JSON.stringify({ ...result, olderThan: options.olderThan }));
      print(purgeSummary(result, options.olderThan));
    });
}

/**
 * "purged 1 delivered event older than 7d; kept 1,191 still inside the 24 h delivery-id window
 * (purged once it passes)": what went, and what the window held back, so a small count is not
 * taken for a purge that did not work.
 */
export function purgeSummary(result: PurgeResult, olderThan: string): string {
  const count = (n: number) => `${n.toLocaleString('en-US')} delivered event${n === 1 ? '' : 's'}`;
  const line = `purged ${count(result.purged)} older than ${olderThan}`;
  if (result.keptInWindow === 0) return line;
  const hours = IDEMPOTENCY_WINDOW_MS / 3_600_000;
  return `${line}; kept ${result.keptInWindow.toLocaleString('en-US')} still inside the ${hours} h delivery-id window (purged once it passes)`;
}

function summary(e: Omit<StoredEvent, 'envelope'>) {
  return {
    id: e.id,
    status: e.status,
    endpoint: e.endpoint,
    action: e.action,
    attempts: e.attempts,
    receivedAt: new Date(e.receivedAt).toISOString(),
    nextAttemptAt: e.status === 'queued' ? new Date(e.nextAttemptAt).toISOString() : null,
    deliveredAt: e.deliveredAt !== null ? new Date(e.deliveredAt).toISOString() : null,
    lastError: e.lastError,
    idempotencyKey: e.idempotencyKey,
  };
}

function print(line: string): void {
  process.stdout.write(line + '\n');
}
