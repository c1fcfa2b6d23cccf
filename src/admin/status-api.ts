import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Config } from '../config/schema.js';
import { HttpError } from '../errors.js';
import { describeChannels, type ChannelStatus } from '../integrations/channels/status.js';
import type { GmailStore } from '../integrations/gmail/state.js';
import { describeGmailAccount, type GmailStatus } from '../integrations/gmail/status.js';
import type { DeliveryStatus, QueueStats } from '../storage/contracts/events.js';
import { describeStorage, openGmailStore } from '../storage/open.js';
import { VERSION } from '../version.js';
import { queryParameters, requireMethod, sendJsonText, toJsonWithIsoDates } from './json.js';
import type { AdminSources, ListenerUrls } from './sources.js';

/** Each part of the status (the store, Gmail, channels, lockouts) gets this long, then says it did not answer. */
export const STATUS_PART_TIMEOUT_MS = 5_000;

/** A part read from a store: what it said, or that it could not say (never a made-up "fine"). */
type Part<T> = ({ available: true } & T) | { available: false; error: string };

/** Events per status; delivered is null while its first count has not landed (as on /metrics). */
type QueueCounts = Record<Exclude<DeliveryStatus, 'delivered'>, number> & { delivered: number | null };

export interface StatusView {
  version: string;
  node: string;
  pid: number;
  startedAt: number;
  uptimeSeconds: number;
  listeners: { gateway: string; webhooks: string | null; admin: string | null };
  gatewayWorkers: Config['gateway']['workers'];
  /** The webhook event store; null when webhooks are off (no store is opened). */
  store:
    | ({ driver: string; location: string } & Part<{
        schemaVersion: number;
        queue: QueueCounts & { byAction: Record<string, QueueCounts>; oldestDueAt: number | null };
      }>)
    | null;
  /** null without webhooks.gmail; `state` null when the account was never set up. */
  gmail: ({ account: string; mode: string } & Part<{ state: GmailStatus | null }>) | null;
  channels: Part<{ list: ChannelStatus[] }>;
  lockouts: Part<{ active: number }>;
}

/**
 * `GET /admin/api/status`: what `gatehouse storage status`, `webhooks gmail status` and
 * `channels status` show (the same functions: describeChannels, describeGmailAccount), plus the
 * listeners, the version and the uptime. The queue counts are /metrics' (queueStats: indexes and
 * a background count of the delivered), not `storage status`'s full count, which on a large
 * SQLite store would hold the server's event loop. Each part is read side by side, within
 * STATUS_PART_TIMEOUT_MS: one that fails or does not answer is `available: false` with why, and
 * the rest is answered all the same.
 */
export function statusApi(options: {
  sources: AdminSources;
  config: () => Config;
  now?: () => number;
  timeoutMs?: number;
}) {
  const { sources } = options;
  const now = options.now ?? Date.now;
  const timeoutMs = options.timeoutMs ?? STATUS_PART_TIMEOUT_MS;
  let gmailStore: GmailStore | undefined; // opened at the first status that needs it, then kept

  async function status(): Promise<StatusView> {
    const config = options.config();
    const at = now();
    const store = sources.store;
    const gmail = config.webhooks.gmail;
    const [storePart, gmailPart, channelsPart, lockoutsPart] = await Promise.all([
      store &&
        part(timeoutMs, async () => {
          const [schemaVersion, stats] = await Promise.all([store.schemaVersion(), store.queueStats(at)]);
          return { schemaVersion, queue: queueCounts(stats) };
        }),
      gmail &&
        store &&
        part(timeoutMs, async () => {
          const state = await (gmailStore ??= openGmailStore(store)).get(gmail.account);
          return { state: state ? describeGmailAccount(state, at) : null };
        }),
      part(timeoutMs, async () => ({
        list: sources.channelStore ? await describeChannels(config.channels, sources.channelStore) : [],
      })),
      part(timeoutMs, async () => ({ active: (await sources.lockouts.list(at)).length })),
    ]);
    const listeners: ListenerUrls = sources.listeners();
    const uptime = process.uptime();
    return {
      version: VERSION,
      node: process.version,
      pid: process.pid,
      startedAt: Math.round(at - uptime * 1000),
      uptimeSeconds: Math.floor(uptime),
      listeners: {
        gateway: listeners.gateway,
        webhooks: listeners.webhooks ?? null,
        admin: listeners.admin ?? null,
      },
      gatewayWorkers: config.gateway.workers,
      store: storePart
        ? { driver: config.storage.driver, location: describeStorage(config.storage), ...storePart }
        : null,
      gmail: gmail && store ? { account: gmail.account, mode: gmail.mode, ...gmailPart! } : null,
      channels: channelsPart,
      lockouts: lockoutsPart,
    };
  }

  return async function handleStatusApi(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    if (url.pathname !== '/admin/api/status') throw new HttpError('not_found', `no admin route ${url.pathname}`);
    requireMethod(req, url, 'GET');
    queryParameters(url, []);
    // Times as ISO 8601, by the rule of the CLI's --json (`…At`, `…Expiration`).
    sendJsonText(res, 200, toJsonWithIsoDates(await status()));
  };
}

/** Per status over every action, and per action; delivered null while not counted yet. */
function queueCounts(
  stats: QueueStats,
): QueueCounts & { byAction: Record<string, QueueCounts>; oldestDueAt: number | null } {
  const empty = (): QueueCounts => ({ queued: 0, delivered: stats.deliveredCounted ? 0 : null, dead: 0 });
  const total = empty();
  const byAction: Record<string, QueueCounts> = {};
  for (const { action, status, events } of stats.counts) {
    const counts = (byAction[action] ??= empty());
    counts[status] = (counts[status] ?? 0) + events;
    total[status] = (total[status] ?? 0) + events;
  }
  return { ...total, byAction, oldestDueAt: stats.oldestDueAt ?? null };
}

/** What `read` resolves to, marked available; or why it failed or did not answer within `ms`. */
async function part<T extends object>(ms: number, read: () => Promise<T>): Promise<Part<T>> {
  let timer: NodeJS.Timeout | undefined;
  try {
    const value = await Promise.race([
      read(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms);
      }),
    ]);
    return { available: true, ...value };
  } catch (err) {
    return { available: false, error: (err as Error).message || String(err) };
  } finally {
    clearTimeout(timer);
  }
}
