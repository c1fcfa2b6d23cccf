import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import express, { type NextFunction } from 'express';
import type { Logger } from 'pino';
import type { Config, WebhookAction } from '../config/schema.js';
import { HttpError } from '../errors.js';
import { createClientIpResolver } from '../gateway/client-ip.js';
import type { FailureLockout } from '../gateway/lockout.js';
import { beginRequest, requestLogger, respondWithError } from '../gateway/request-context.js';
import type { EventStore } from './store.js';
import { buildEnvelope, compileTemplate, type CompiledTemplate } from './translate.js';

type Next = NextFunction;

interface Endpoint {
  path: string;
  action: WebhookAction;
  secretDigest: Buffer;
  template?: CompiledTemplate;
}

/** Delivery id headers senders use, in order of preference. */
const DELIVERY_ID_HEADERS = ['idempotency-key', 'webhook-id', 'x-github-delivery'] as const;
const SANE_DELIVERY_ID = /^[\x21-\x7e]{1,256}$/;
const JSON_MEDIA_TYPE = /^application\/(?:[\w.+-]+\+)?json\s*(?:;.*)?$/i;
const STORE_RETRY_AFTER_SECONDS = '5';

function digest(value: string): Buffer {
  return createHash('sha256').update(value, 'utf8').digest();
}

/** Constant time: both sides are hashed to 32 bytes first, so length does not leak either. */
export function verifyWebhookSecret(presented: string | string[] | undefined, expectedDigest: Buffer): boolean {
  const value = typeof presented === 'string' ? presented : '';
  return timingSafeEqual(digest(value), expectedDigest) && value !== '';
}

export interface WebhookApp {
  handle: (req: IncomingMessage, res: ServerResponse) => void;
}

/**
 * The webhook receiver: path → method → lockout and secret → content type → body → durable
 * store → 202. Nothing unverified is read, parsed or stored. Never listens (server.ts does).
 */
export function buildWebhookApp(config: Config, deps: { logger: Logger; lockout: FailureLockout; store: EventStore; onAccepted: () => void }): WebhookApp {
  const { webhooks } = config;
  const { logger, lockout, store } = deps;
  const resolveClientIp = createClientIpResolver(config.gateway.trustProxy);
  const requestLog = requestLogger(logger);
  const endpoints = new Map<string, Endpoint>(webhooks.endpoints.map((e) => [e.path, {
    path: e.path,
    action: e.action,
    secretDigest: digest(e.secret),
    template: e.template !== undefined ? compileTemplate(e.template) : undefined,
  }]));

  function startContext(req: IncomingMessage, res: ServerResponse, next: Next) {
    beginRequest(req, res, requestLog);
    next();
  }

  function healthz(_req: IncomingMessage, res: ServerResponse) {
    res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
    res.end('{"status":"ok"}');
  }

  async function receiveWebhook(req: IncomingMessage, res: ServerResponse, next: Next) {
    const url = req.url ?? '';
    const queryAt = url.indexOf('?');
    const endpoint = endpoints.get(queryAt === -1 ? url : url.slice(0, queryAt));
    if (!endpoint) return next(new HttpError('not_found', 'no webhook endpoint at this path'));
    if (req.method !== 'POST') return next(new HttpError('method_not_allowed', `${req.method} on a webhook endpoint`, { allow: 'POST' }));

    const origin = resolveClientIp(req);
    if (origin.ip === undefined) return next(new HttpError('invalid_client_ip', 'unusable client address'));
    req.gatehouse!.clientIp = origin.ip;
    const lockedFor = await lockout.lockedFor(origin.ip);
    if (lockedFor > 0) return next(new HttpError('too_many_failures', `locked out for ${lockedFor}s more`, { 'retry-after': String(lockedFor) }));
    // A secret in the query string is never looked at: only the header counts.
    if (!verifyWebhookSecret(req.headers['x-webhook-secret'], endpoint.secretDigest)) {
      await lockout.recordFailure(origin.ip);
      return next(new HttpError('invalid_webhook_secret', req.headers['x-webhook-secret'] === undefined ? 'no X-Webhook-Secret' : 'wrong X-Webhook-Secret'));
    }

    if (!JSON_MEDIA_TYPE.test(req.headers['content-type'] ?? '')) return next(new HttpError('unsupported_media_type', `content-type ${req.headers['content-type'] ?? '(none)'}`));
    const deliveryId = firstDeliveryId(req);
    if (deliveryId === null) return next(new HttpError('invalid_idempotency_key', 'delivery id header too long or not printable'));

    let rawBody: string;
    try {
      rawBody = await readBody(req, res, webhooks.maxBodyBytes, webhooks.bodyTimeoutMs);
    } catch (err) {
      return next(err);
    }
    let body: unknown;
    try {
      body = JSON.parse(rawBody);
    } catch {
      return next(new HttpError('invalid_json', 'body is not valid JSON'));
    }
    if (body === null || typeof body !== 'object' || Array.isArray(body)) return next(new HttpError('invalid_json', 'top level is not an object'));

    const receivedAt = Date.now();
    let result;
    try {
      result = await store.accept({
        endpoint: endpoint.path,
        action: endpoint.action,
        idempotencyKey: deliveryId,
        receivedAt,
        envelope: (id) => buildEnvelope(id, { action: endpoint.action, endpoint: endpoint.path, receivedAt, template: endpoint.template }, body as Record<string, unknown>, rawBody),
      });
    } catch (err) {
      logger.error({ err: (err as Error).message, endpoint: endpoint.path }, 'event store refused a webhook');
      return next(new HttpError('store_unavailable', (err as Error).message, { 'retry-after': STORE_RETRY_AFTER_SECONDS }));
    }
    if (!result.duplicate) deps.onAccepted();
    const reply = JSON.stringify({ id: result.id, status: result.duplicate ? 'duplicate' : 'queued' });
    res.writeHead(result.duplicate ? 200 : 202, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
    res.end(reply);
  }

  const app = express();
  app.disable('x-powered-by');
  app.disable('etag');
  app.use(startContext);
  app.get('/healthz', healthz);
  app.use(receiveWebhook);
  app.use((err: unknown, req: IncomingMessage, res: ServerResponse, _next: Next) => respondWithError(req, res, err, logger));
  return { handle: app };
}

/** The sender's delivery id: undefined when none is given, null when one is given but unusable. */
function firstDeliveryId(req: IncomingMessage): string | undefined | null {
  for (const name of DELIVERY_ID_HEADERS) {
    const value = req.headers[name];
    if (value === undefined) continue;
    return typeof value === 'string' && SANE_DELIVERY_ID.test(value) ? value : null;
  }
  return undefined;
}

/**
 * Reads the body up to `limit` bytes within `timeoutMs`. Past the limit (declared or actual) it
 * stops reading at once: 413, and the connection is closed rather than drained.
 */
function readBody(req: IncomingMessage, res: ServerResponse, limit: number, timeoutMs: number): Promise<string> {
  // The rest of the body is never read: tell the client, and close once the answer is out.
  const abandonBody = () => {
    req.pause();
    res.setHeader('connection', 'close');
    res.once('finish', () => setTimeout(() => req.socket.destroy(), 1_000).unref());
  };
  const declared = Number(req.headers['content-length'] ?? NaN);
  if (declared > limit) {
    abandonBody();
    return Promise.reject(new HttpError('payload_too_large', `content-length ${declared} > ${limit}`));
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const finish = (error: HttpError | undefined) => {
      clearTimeout(timer);
      req.off('data', onData);
      req.off('end', onEnd);
      req.off('error', onError);
      if (!error) return resolve(Buffer.concat(chunks).toString('utf8'));
      abandonBody();
      reject(error);
    };
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) return finish(new HttpError('payload_too_large', `body over ${limit} bytes`));
      chunks.push(chunk);
    };
    const onEnd = () => finish(undefined);
    const onError = (err: Error) => finish(new HttpError('request_timeout', `body aborted: ${err.message}`));
    const timer = setTimeout(() => finish(new HttpError('request_timeout', `body not complete after ${timeoutMs} ms`)), timeoutMs);
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
  });
}
