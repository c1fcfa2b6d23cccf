import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { Config } from '../config/schema.js';
import { HttpError } from '../errors.js';
import { eventsApi } from './events-api.js';
import type { AdminSources } from './sources.js';

/**
 * The admin API under /admin/api/, after the listener has authenticated the request: each group of
 * routes (events, …) lives in its own module; this picks the group by the first path segment.
 */
export function adminApi(options: {
  sources: AdminSources;
  config: () => Config;
  logger: Logger;
  bodyTimeoutMs: number;
}) {
  const events = eventsApi({
    store: () => options.sources.store,
    logger: options.logger,
    bodyTimeoutMs: options.bodyTimeoutMs,
  });
  return async function handleAdminApi(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    const group = url.pathname.slice('/admin/api/'.length).split('/', 1)[0];
    if (group === 'events') return events(req, res, url);
    throw new HttpError('not_found', `no admin route ${url.pathname}`);
  };
}
