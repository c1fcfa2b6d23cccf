import { createHash } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { HttpError } from '../errors.js';
import { readBody } from '../http/read-body.js';
import type { EventStore } from '../storage/contracts/events.js';
import { listEvents, parseListQuery, parseRetryRequest, retryEvents, showEvent, summaryOf } from './deliveries.js';
import { requireMethod, sendJson } from './json.js';

/** A retry's body is small: ids or a filter. */
const MAX_BODY_BYTES = 256 * 1024;
/** How long, and how many, Idempotency-Keys of retries are remembered (in this process). */
export const IDEMPOTENCY_KEY_TTL_MS = 10 * 60 * 1000;
const MAX_REMEMBERED_KEYS = 1_000;
const IDEMPOTENCY_KEY = /^[\x21-\x7e]{1,256}$/;
const EVENT_ID = /^[A-Za-z0-9_-]{1,256}$/;

interface Remembered {
  at: number;
  fingerprint: string;
  answer: Promise<{ requeued: number }>;
}

/**
 * The admin API's events routes, under /admin/api/ on the admin listener (which authenticates
 * first): GET events (list), GET events/<id> (detail), POST events/retry. JSON in and out, errors
 * from the catalogue. A retry is logged with who (`admin token`, or the console session: the token has no id yet) and what.
 * A retry with an `Idempotency-Key` header (as Svix's API takes it) is answered from memory when the
 * same key comes again within IDEMPOTENCY_KEY_TTL_MS; without one, a repeat is harmless anyway
 * (see retryEvents).
 */
export function eventsApi(options: {
  store: () => EventStore | undefined;
  logger: Logger;
  bodyTimeoutMs: number;
  stillAuthorized: (req: IncomingMessage) => boolean;
  who: (req: IncomingMessage) => string;
  now?: () => number;
}) {
  const now = options.now ?? Date.now;
  const remembered = new Map<string, Remembered>();

  function storeOrFail(): EventStore {
    const store = options.store();
    if (!store) throw new HttpError('not_found', 'webhooks are not enabled: no event store');
    return store;
  }

  async function retry(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const type = req.headers['content-type'] ?? '';
    // JSON only: a browser cannot send it cross-site without a preflight, which this listener never grants.
    if (!/^application\/json\s*(;|$)/i.test(type))
      throw new HttpError('unsupported_media_type', `content-type ${type}`);
    const raw = await readBody(req, res, MAX_BODY_BYTES, options.bodyTimeoutMs);
    // The body may have taken until after a rotation: the token it came with must still be the token.
    if (!options.stillAuthorized(req))
      throw new HttpError('invalid_admin_token', 'the admin token changed while the request was sent', {
        'www-authenticate': 'Bearer realm="gatehouse-admin"',
      });
    let body: unknown;
    try {
      body = JSON.parse(raw.toString('utf8'));
    } catch {
      throw new HttpError('invalid_json', 'the retry body is not JSON');
    }
    const request = parseRetryRequest(body);
    const key = req.headersDistinct['idempotency-key'];
    if (key !== undefined && (key.length !== 1 || !IDEMPOTENCY_KEY.test(key[0]!)))
      throw new HttpError('invalid_parameter', 'Idempotency-Key: one line of 1-256 printable characters');
    const fingerprint = createHash('sha256').update(JSON.stringify(request)).digest('base64url');
    const at = now();
    for (const [k, r] of remembered) if (at - r.at >= IDEMPOTENCY_KEY_TTL_MS) remembered.delete(k);
    const earlier = key && remembered.get(key[0]!);
    if (earlier) {
      if (earlier.fingerprint !== fingerprint) throw new HttpError('idempotency_key_reused', 'different request body');
      const answer = await earlier.answer;
      options.logger.info(
        { who: options.who(req), idempotencyKey: key[0] },
        'admin: events retry repeated; answered from memory',
      );
      return sendJson(res, 200, answer, { 'idempotent-replayed': 'true' });
    }
    const what = 'ids' in request ? { ids: request.ids.length } : { filter: request.filter };
    const answer = retryEvents(storeOrFail(), request, at).then((requeued) => ({ requeued }));
    if (key) {
      if (remembered.size >= MAX_REMEMBERED_KEYS) remembered.delete(remembered.keys().next().value!);
      remembered.set(key[0]!, { at, fingerprint, answer });
      answer.catch(() => remembered.delete(key[0]!)); // a failed retry may be sent again
    }
    const result = await answer;
    options.logger.info(
      { who: options.who(req), ...what, includeDelivered: request.includeDelivered, requeued: result.requeued },
      'admin: events requeued',
    );
    sendJson(res, 200, result);
  }

  /** Answers a request whose path starts with /admin/api/ (already authenticated). */
  return async function handleEventsApi(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    const rest = url.pathname.slice('/admin/api/'.length);
    if (rest === 'events/retry') {
      requireMethod(req, url, 'POST');
      return retry(req, res);
    }
    if (rest === 'events' || rest.startsWith('events/')) {
      requireMethod(req, url, 'GET');
      if (rest === 'events') {
        const query = parseListQuery(url.searchParams);
        const page = await listEvents(storeOrFail(), query);
        return sendJson(res, 200, { events: page.events.map(summaryOf), nextCursor: page.nextCursor });
      }
      const id = rest.slice('events/'.length); // ids are [A-Za-z0-9_-]: nothing to decode
      if (url.search !== '') throw new HttpError('invalid_parameter', 'an event takes no query parameters');
      const event = EVENT_ID.test(id) ? await showEvent(storeOrFail(), id) : undefined;
      if (!event) throw new HttpError('event_not_found', `no event ${id.slice(0, 100)}`);
      return sendJson(res, 200, event);
    }
    throw new HttpError('not_found', `no admin route ${url.pathname}`);
  };
}
