import { isUtf8 } from 'node:buffer';
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import express, { type NextFunction } from 'express';
import type { Logger } from 'pino';
import type { Config, HttpLimits, WebhookAction } from '../config/schema.js';
import { HttpError, type ErrorCode } from '../errors.js';
import { createClientIpResolver } from '../http/client-ip.js';
import type { FailureLockout, LockoutSlot } from '../http/lockout.js';
import { admitRequest, answerHealthy, requestLogger, respondWithError } from '../http/request-context.js';
import { countRequests } from '../observability/metrics.js';
import { traceWebhookRequests } from '../observability/request-spans.js';
import { activeTracing } from '../observability/tracing.js';
import { readBody } from '../http/read-body.js';
import type { EventStore } from './store.js';
import { jsonNestsDeeperThan } from './json-depth.js';
import { recordedHeaders } from './received-headers.js';
import { compileTemplate, prepareEnvelope, type CompiledTemplate } from './translate.js';
import { createVerifier, type DirectAnswer, type WebhookVerifier } from './verifiers/index.js';

type Next = NextFunction;

interface Endpoint {
  path: string;
  action: WebhookAction;
  /** How the sender is verified, for logs (`secret`, `github`, `gmail push`, `channel telegram`…). */
  verifyType: string;
  verifier: WebhookVerifier;
  /** The catalogue code a failed verification answers with. */
  failureCode: ErrorCode;
  template?: CompiledTemplate;
  /** An integration's route (Gmail push): it processes the verified body itself instead of queueing it. */
  consume?: (body: Record<string, unknown>, traceContext?: string) => Promise<DirectAnswer>;
  /** Fields an integration adds to the envelope (a channel's `channel`, `from`, `text`). */
  envelopeExtra?: (body: Record<string, unknown>, headers: IncomingHttpHeaders) => Record<string, unknown>;
  /** Called after an event of this route is stored (a channel's "last event"). */
  onStored?: () => void;
  /**
   * Whether the lockout guards this route (default true): its failed checks count, a client
   * locked out is refused, and concurrent checks of one client hold lockout slots. true for
   * what can be guessed: a `secret` endpoint's header secret, a device token. false for senders
   * that sign (every `verify` type but `secret`, Gmail push, the chat platforms): their servers
   * share egress addresses, so anyone pointing their own repo or bot at the URL with a wrong
   * secret could get the sender's addresses locked out and its deliveries lost, and a
   * signature cannot be guessed anyway. Such routes neither count nor are refused.
   */
  countsFailures?: boolean;
}

/**
 * A verified route an integration adds to the receiver (Gmail push, channel events); it goes
 * through the same steps as a configured endpoint.
 */
export type IntegrationRoute = Pick<
  Endpoint,
  'path' | 'action' | 'verifyType' | 'verifier' | 'consume' | 'envelopeExtra' | 'onStored' | 'countsFailures'
> & { failureCode?: ErrorCode };

/**
 * The lockout as a prefix handler sees it: its request already holds a lockout slot (taken
 * before the handler runs, given back when it returns), so concurrent guesses cannot all pass
 * the check before one fails. `ip` is the request's own client address (`RouteTools.clientIp`).
 */
export interface RouteLockout {
  /** Seconds the client is locked out for now: another request's failure may have locked it meanwhile. */
  lockedFor(ip: string): Promise<number>;
  /** Counts this request's failure (once per request); returns the seconds of lockout it set off. */
  recordFailure(ip: string): Promise<number>;
}

/** What a prefix handler gets: the client address (already past the lockout check) and helpers. */
export interface RouteTools {
  clientIp: string;
  lockout: RouteLockout;
  /** The body as a JSON object (size, time and nesting limits as for webhooks); throws an HttpError. */
  readJson(): Promise<Record<string, unknown>>;
}

/** Requests under `prefix` are an integration's own (channel pairing and outbox): it answers them. */
export interface PrefixRoute {
  prefix: string;
  handle(req: IncomingMessage, res: ServerResponse, rest: string, tools: RouteTools): Promise<void>;
}

const SANE_DELIVERY_ID = /^[\x21-\x7e]{1,256}$/;
const JSON_MEDIA_TYPE = /^application\/(?:[\w.+-]+\+)?json\s*(?:;.*)?$/i;
const STORE_RETRY_AFTER_SECONDS = '5';

export interface WebhookApp {
  handle: (req: IncomingMessage, res: ServerResponse) => void;
}

/**
 * The webhook receiver: path → method → lockout (on the routes it guards: `countsFailures`) and
 * the sender's proof (header secret, or signature headers) → content type → raw body → signature
 * over those bytes → JSON → the sender's handshake, or durable store → 202. Nothing unverified is parsed or stored.
 * Never listens (server.ts does).
 */
export function buildWebhookApp(
  config: Config,
  deps: {
    logger: Logger;
    lockout: FailureLockout;
    store: EventStore;
    onAccepted: () => void;
    limits: HttpLimits;
    routes?: IntegrationRoute[];
    prefixRoutes?: PrefixRoute[];
  },
): WebhookApp {
  const { webhooks } = config;
  const { logger, lockout, store } = deps;
  const resolveClientIp = createClientIpResolver(config.gateway.trustProxy);
  const endpoints = new Map<string, Endpoint>(
    webhooks.endpoints.map((e) => [
      e.path,
      {
        path: e.path,
        action: e.action,
        verifyType: e.verify.type,
        verifier: createVerifier(e.verify),
        failureCode: e.verify.type === 'secret' ? 'invalid_webhook_secret' : 'invalid_webhook_signature',
        countsFailures: e.verify.type === 'secret',
        template: e.template !== undefined ? compileTemplate(e.template) : undefined,
      },
    ]),
  );
  for (const route of deps.routes ?? [])
    endpoints.set(route.path, { failureCode: 'invalid_webhook_signature', ...route });
  const prefixRoutes = deps.prefixRoutes ?? [];
  // Endpoint labels are the configured paths (the keys here), never a path a client made up.
  const requestLog = countRequests('webhooks', requestLogger(logger), new Set(endpoints.keys()));
  // Undefined while tracing is off: no tracing call is made then.
  const tracing = activeTracing();
  const spans = tracing ? traceWebhookRequests(tracing) : undefined;

  /** A sender's own answer (a handshake, an integration's reply); an accepted event's outcome stays as set. */
  function answer(req: IncomingMessage, res: ServerResponse, direct: DirectAnswer) {
    req.gatehouse!.outcome ??= 'answered';
    res.writeHead(direct.status, {
      'content-type': direct.contentType,
      'content-length': Buffer.byteLength(direct.body),
      'cache-control': 'no-store',
    });
    res.end(direct.body);
  }

  /** A lockout slot for the client of a guarded route, or the 429 while it is locked out. */
  async function takeLockoutSlot(ip: string): Promise<LockoutSlot | HttpError> {
    let admission = lockout.acquire(ip);
    if (admission instanceof Promise) admission = await admission;
    if (typeof admission === 'number')
      return new HttpError('too_many_failures', `locked out for ${admission}s more`, {
        'retry-after': String(admission),
      });
    return admission;
  }

  /** The sender failed its proof: counted (through its slot) when the route is guarded. */
  function rejectSender(endpoint: Endpoint, reason: string, slot: LockoutSlot | undefined): HttpError {
    slot?.failed();
    return new HttpError(endpoint.failureCode, `${endpoint.verifyType}: ${reason}`);
  }

  /**
   * The sender's proof: the GET subscription check (answered, nothing stored), or the header
   * checks → content type → raw body → signature over those bytes. Gives the slot back as soon
   * as the verdict is known.
   */
  async function proveSender(
    req: IncomingMessage,
    res: ServerResponse,
    endpoint: Endpoint,
    query: string,
    slot: LockoutSlot | undefined,
  ): Promise<{ body: Buffer } | { answer: DirectAnswer } | { error: unknown }> {
    const { verifier } = endpoint;
    if (req.method === 'GET') {
      // The sender's subscription check (Meta).
      const outcome = verifier.answerGet!(new URLSearchParams(query));
      if ('failed' in outcome) {
        slot?.failed();
        return { error: new HttpError('invalid_verify_token', outcome.failed) };
      }
      return { answer: outcome.answer };
    }

    // Only headers count: a secret or signature in the query string is never looked at.
    const now = Date.now();
    const headerVerdict = await verifier.checkHeaders(req.headers, now);
    if (!headerVerdict.ok && headerVerdict.unavailable) {
      // The sender's key set is unreachable: not its fault, and it retries a 503.
      return {
        error: new HttpError('auth_unavailable', `${endpoint.verifyType}: ${headerVerdict.reason}`, {
          'retry-after': '5',
        }),
      };
    }
    if (!headerVerdict.ok) return { error: rejectSender(endpoint, headerVerdict.reason, slot) };
    if (!verifier.verifyBody) slot?.succeeded(); // proven by its headers: no slot held while the body arrives

    if (!JSON_MEDIA_TYPE.test(req.headers['content-type'] ?? ''))
      return {
        error: new HttpError('unsupported_media_type', `content-type ${req.headers['content-type'] ?? '(none)'}`),
      };

    let rawBody: Buffer;
    try {
      rawBody = await readBody(req, res, webhooks.maxBodyBytes, webhooks.bodyTimeoutMs);
    } catch (err) {
      return { error: err };
    }
    const bodyVerdict = verifier.verifyBody?.(req.headers, rawBody, now) ?? { ok: true };
    if (!bodyVerdict.ok) return { error: rejectSender(endpoint, bodyVerdict.reason, slot) };
    return { body: rawBody };
  }

  async function receiveWebhook(
    req: IncomingMessage,
    res: ServerResponse,
    endpoint: Endpoint,
    query: string,
    next: Next,
  ) {
    const { verifier } = endpoint;
    const getAllowed = verifier.answerGet !== undefined;
    if (req.method !== 'POST' && !(getAllowed && req.method === 'GET')) {
      return next(
        new HttpError('method_not_allowed', `${req.method} on a webhook endpoint`, {
          allow: getAllowed ? 'GET, POST' : 'POST',
        }),
      );
    }

    const origin = req.gatehouse!.origin ?? resolveClientIp(req);
    if (origin.ip === undefined) return next(new HttpError('invalid_client_ip', 'unusable client address'));
    req.gatehouse!.clientIp = origin.ip;
    let slot: LockoutSlot | undefined;
    if (endpoint.countsFailures !== false) {
      const admission = await takeLockoutSlot(origin.ip);
      if (admission instanceof HttpError) return next(admission);
      slot = admission;
    }
    let proof: Awaited<ReturnType<typeof proveSender>>;
    try {
      proof = await proveSender(req, res, endpoint, query, slot);
    } finally {
      slot?.succeeded(); // proven, or refused for what does not count (a no-op once given back)
    }
    if ('error' in proof) return next(proof.error);
    if ('answer' in proof) return answer(req, res, proof.answer);
    const rawBody = proof.body;

    let text: string;
    try {
      text = decodeUtf8(rawBody);
    } catch (err) {
      return next(err);
    }
    let fields: Record<string, unknown>;
    try {
      fields = parseJsonObject(text, webhooks.maxJsonDepth);
    } catch (err) {
      return next(err);
    }

    const handshake = verifier.handshake?.(fields);
    if (handshake) return answer(req, res, handshake);

    if (endpoint.consume) {
      let reply: DirectAnswer;
      try {
        reply = await endpoint.consume(fields, spans?.traceparentOf(req));
      } catch (err) {
        logger.error(
          { err: (err as Error).message, endpoint: endpoint.path },
          'notification not processed: the sender will retry',
        );
        return next(
          new HttpError('integration_unavailable', (err as Error).message, {
            'retry-after': STORE_RETRY_AFTER_SECONDS,
          }),
        );
      }
      return answer(req, res, reply);
    }

    const deliveryId = verifier.deliveryId(req.headers, fields);
    if (deliveryId !== undefined && !SANE_DELIVERY_ID.test(deliveryId))
      return next(new HttpError('invalid_idempotency_key', 'delivery id too long or not printable'));
    const payloadText = verifier.payload
      ? JSON.stringify(verifier.payload(fields, { maxJsonDepth: webhooks.maxJsonDepth }))
      : text;

    const receivedAt = Date.now();
    // Rendered here, not in the store's callback: a failure in it is a bug (500, with its stack),
    // never reported as the store's (503, which senders retry forever).
    const envelope = prepareEnvelope(
      {
        action: endpoint.action,
        endpoint: endpoint.path,
        receivedAt,
        template: endpoint.template,
        extra: endpoint.envelopeExtra?.(fields, req.headers),
      },
      fields,
      payloadText,
    );
    let result;
    try {
      result = await store.accept({
        endpoint: endpoint.path,
        action: endpoint.action,
        idempotencyKey: deliveryId,
        replayKey: verifier.replayKey?.(req.headers),
        receivedAt,
        envelope,
        headers: recordedHeaders(req.headers),
        traceContext: spans?.traceparentOf(req),
      });
    } catch (err) {
      logger.error({ err: (err as Error).message, endpoint: endpoint.path }, 'event store refused a webhook');
      return next(
        new HttpError('store_unavailable', (err as Error).message, { 'retry-after': STORE_RETRY_AFTER_SECONDS }),
      );
    }
    if (!result.duplicate) {
      deps.onAccepted();
      endpoint.onStored?.();
    }
    res.setHeader('x-gatehouse-event-id', result.id);
    req.gatehouse!.outcome = result.duplicate ? 'duplicate' : 'accepted';
    const direct = verifier.acceptedAnswer?.(fields);
    if (direct) return answer(req, res, direct);
    const reply = JSON.stringify({ id: result.id, status: result.duplicate ? 'duplicate' : 'queued' });
    res.writeHead(result.duplicate ? 200 : 202, {
      'content-type': 'application/json; charset=utf-8',
      'cache-control': 'no-store',
    });
    res.end(reply);
  }

  async function handlePrefixed(
    req: IncomingMessage,
    res: ServerResponse,
    route: PrefixRoute,
    rest: string,
  ): Promise<void> {
    const origin = resolveClientIp(req);
    if (origin.ip === undefined) throw new HttpError('invalid_client_ip', 'unusable client address');
    req.gatehouse!.clientIp = origin.ip;
    const clientIp = origin.ip;
    // Every prefix route counts its failures (pairing codes, device tokens, OAuth states):
    // the request holds a slot for as long as the handler runs.
    const admission = await takeLockoutSlot(clientIp);
    if (admission instanceof HttpError) throw admission;
    const slot = admission;
    const tools: RouteTools = {
      clientIp,
      lockout: {
        lockedFor: async () => lockout.lockedFor(clientIp),
        recordFailure: async () => slot.failed(),
      },
      async readJson() {
        if (!JSON_MEDIA_TYPE.test(req.headers['content-type'] ?? ''))
          throw new HttpError('unsupported_media_type', `content-type ${req.headers['content-type'] ?? '(none)'}`);
        const raw = await readBody(req, res, webhooks.maxBodyBytes, webhooks.bodyTimeoutMs);
        return parseJsonObject(decodeUtf8(raw), webhooks.maxJsonDepth);
      },
    };
    try {
      await route.handle(req, res, rest, tools);
    } finally {
      slot.succeeded(); // a no-op when the handler recorded a failure
    }
  }

  const app = express();
  app.disable('x-powered-by');
  app.disable('etag');
  app.get('/healthz', (_req: IncomingMessage, res: ServerResponse) => answerHealthy(res));
  // Configured endpoints never reach Express (see handle below): everything left is not found.
  app.use((_req: IncomingMessage, _res: ServerResponse, next: Next) =>
    next(new HttpError('not_found', 'no webhook endpoint at this path')),
  );
  app.use((err: unknown, req: IncomingMessage, res: ServerResponse, _next: Next) =>
    respondWithError(req, res, err, logger),
  );

  // As for /api/: requests to a configured endpoint skip Express's router (the hot path);
  // everything else (health, 404) is the Express app.
  function handle(req: IncomingMessage, res: ServerResponse): void {
    if (!admitRequest(req, res, requestLog, deps.limits, logger)) return;
    const url = req.url ?? '';
    const queryAt = url.indexOf('?');
    const endpoint = endpoints.get(queryAt === -1 ? url : url.slice(0, queryAt));
    const fail = (err?: unknown) => respondWithError(req, res, err, logger);
    if (endpoint) {
      if (spans) spans.begin(req, res, endpoint.path, (req.gatehouse!.origin = resolveClientIp(req)));
      receiveWebhook(req, res, endpoint, queryAt === -1 ? '' : url.slice(queryAt + 1), fail).catch(fail);
      return;
    }
    const path = queryAt === -1 ? url : url.slice(0, queryAt);
    const prefixed = prefixRoutes.find((r) => path.startsWith(r.prefix));
    if (prefixed) handlePrefixed(req, res, prefixed, path.slice(prefixed.prefix.length)).catch(fail);
    else app(req, res);
  }
  return { handle };
}

/**
 * The body as text, or HttpError `invalid_json`: JSON is UTF-8 (RFC 8259 §8.1), and decoding
 * invalid bytes would replace them with U+FFFD, so the payload a target gets would no longer be
 * the bytes the sender signed.
 */
function decodeUtf8(raw: Buffer): string {
  if (!isUtf8(raw)) throw new HttpError('invalid_json', 'body is not valid UTF-8');
  return raw.toString('utf8');
}

/**
 * A request body as a JSON object, or HttpError `invalid_json` (400: the sender's fault, not to be
 * retried): nested at most `maxDepth` levels, checked before parsing so that nothing recursive
 * ever meets a deeper value; valid JSON; an object at the top. Every JSON body the webhook
 * listener takes goes through here (endpoints, integration routes, prefix routes' readJson).
 */
function parseJsonObject(text: string, maxDepth: number): Record<string, unknown> {
  if (jsonNestsDeeperThan(text, maxDepth))
    throw new HttpError('invalid_json', `nested deeper than webhooks.maxJsonDepth (${maxDepth})`);
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    throw new HttpError('invalid_json', 'body is not valid JSON');
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body))
    throw new HttpError('invalid_json', 'top level is not an object');
  return body as Record<string, unknown>;
}
