import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { Config } from '../config/schema.js';
import { HttpError } from '../errors.js';
import { eventsApi } from './events-api.js';
import { keysApi } from './keys-api.js';
import { lockoutsApi } from './lockouts-api.js';
import type { AdminSources } from './sources.js';
import { statusApi } from './status-api.js';

/**
 * The admin API under /admin/api/, after the listener has authenticated the request: each group of
 * routes (events, lockouts, keys, status) lives in its own module; this picks the group by the
 * first path segment.
 */
export function adminApi(options: {
  sources: AdminSources;
  config: () => Config;
  logger: Logger;
  bodyTimeoutMs: number;
  /** Whether the token the request was admitted with is still the token (asked after a body arrives). */
  stillAuthorized: (req: IncomingMessage) => boolean;
  /** Who made the request, for the log of a change: `admin token`, or `console session <label>`. */
  who: (req: IncomingMessage) => string;
}) {
  const groups: Record<string, (req: IncomingMessage, res: ServerResponse, url: URL) => Promise<void>> = {
    events: eventsApi({
      store: () => options.sources.store,
      logger: options.logger,
      bodyTimeoutMs: options.bodyTimeoutMs,
      stillAuthorized: options.stillAuthorized,
      who: options.who,
    }),
    lockouts: lockoutsApi({ lockouts: options.sources.lockouts, logger: options.logger, who: options.who }),
    keys: keysApi({ config: options.config }),
    status: statusApi({ sources: options.sources, config: options.config }),
  };
  return async function handleAdminApi(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    const group = url.pathname.slice('/admin/api/'.length).split('/', 1)[0]!;
    const handle = Object.hasOwn(groups, group) ? groups[group] : undefined;
    if (!handle) throw new HttpError('not_found', `no admin route ${url.pathname}`);
    return handle(req, res, url);
  };
}
