import type { IncomingMessage, ServerResponse } from 'node:http';
import express, { type NextFunction } from 'express';
import type { Logger } from 'pino';
import type { ChannelSender } from '../integrations/channels/outbound.js';
import { CHANNEL_SEND_PREFIX, channelSendPath, type Config, type HttpLimits } from '../config/schema.js';
import { HttpError } from '../errors.js';
import { continueIfExpected, hasBody } from '../http/listener.js';
import { compileAuthorizer, type Authorizer, type ImpliedRule } from './authorize.js';
import { createClientIpResolver, type ClientOrigin } from '../http/client-ip.js';
import { Authenticator, type AuthOutcome } from './credentials/authenticate.js';
import { prepareUpstreamHeaders } from './forward-headers.js';
import { compileAddressMatcher, parseAddress } from '../http/ip-ranges.js';
import type { FailureLockout, LockoutSlot } from '../http/lockout.js';
import { connectionRetired } from '../http/tls.js';
import { API_PREFIX, checkApiPath } from './path-gate.js';
import { matchablePath } from './path-pattern.js';
import { compileRateLimiter, type RateLimitState } from './rate-limit.js';
import { createUpstreamRoutes } from './routes.js';
import { ANSWERED, compileCors } from './cors.js';
import { compileBrowserCredentials } from './browser-credentials.js';
import {
  isWebSocketUpgrade,
  relayWebSocket,
  type ConnectionCredentials,
  type WebSocketConnections,
} from './websocket.js';
import {
  countAuthFailure,
  countRequests,
  countWebSocket,
  metricsEnabled,
  observeUpstream,
} from '../observability/metrics.js';
import { activeTracing } from '../observability/tracing.js';
import { traceApiRequests } from '../observability/request-spans.js';
import {
  admitRequest,
  answerHealthy,
  requestLogger,
  noteError,
  respondWithError,
  type RequestContext,
} from '../http/request-context.js';

type Next = NextFunction;
type Req = IncomingMessage & { gatehouse: RequestContext };

export interface GatewayApp {
  /** The request listener: /api/ through the pipeline, everything else through the Express app. */
  handle: (req: IncomingMessage, res: ServerResponse) => void;
  authenticator: Authenticator;
  /** Prefetches remote keys (JWKS); returns a problem to log, if any. */
  warmUp(): Promise<string | undefined>;
  /** Releases idle upstream connections (after a reload swapped this app out). */
  close(): void;
  /** The rate limits this app counts with (RateLimitState.retain once it is in force). */
  rateLimitSignatures: ReadonlySet<string>;
  /** Requests to switch protocols (the listener's `upgrade`): WebSockets on /api/ through the whole pipeline. */
  upgrade: (req: IncomingMessage, res: ServerResponse, head: Buffer) => void;
  /** Whether an open WebSocket's credentials still pass this config (its key, token, address and rules). */
  stillAllowed(credentials: ConnectionCredentials): Promise<boolean>;
}

/**
 * Builds the /api/ edge from a Config: framing (src/http/listener.ts) → the pipeline path gate → client IP → allowedIPs →
 * lockout → credentials → upstream headers → authorization (rules) → rate limits → route → proxy, each a named step.
 * Everything that can be compiled (matchers, keys, verifiers) is compiled here, once.
 * Never listens: server.ts does, so tests can mount it anywhere.
 */
export async function buildGatewayApp(
  config: Config,
  deps: {
    logger: Logger;
    lockout: FailureLockout;
    rateLimits: RateLimitState;
    channels?: ChannelSender;
    limits: HttpLimits;
    websockets: WebSocketConnections;
  },
): Promise<GatewayApp> {
  const { gateway } = config;
  const { logger, lockout } = deps;
  const resolveClientIp = createClientIpResolver(gateway.trustProxy);
  const allowed = gateway.auth.allowedIPs ? compileAddressMatcher(gateway.auth.allowedIPs) : undefined;
  const authenticator = await Authenticator.create(gateway.auth);
  const encrypted = gateway.tls !== undefined;
  const requestLog = countRequests('gateway', requestLogger(logger));
  // Undefined while tracing is off: every call below is skipped by one test of a constant.
  const tracing = activeTracing();
  const spans = tracing ? traceApiRequests(tracing) : undefined;
  // Once per request: the answer's headers or the error, whichever comes first.
  const timeUpstream = metricsEnabled()
    ? (req: IncomingMessage) => {
        const startedAt = req.gatehouse?.upstreamStartedAt;
        if (startedAt === undefined) return;
        req.gatehouse!.upstreamStartedAt = undefined;
        observeUpstream(req.gatehouse!.route!, startedAt);
      }
    : undefined;
  const routes = createUpstreamRoutes(
    gateway,
    (req, error) => {
      noteError(req, error);
      timeUpstream?.(req);
    },
    timeUpstream,
  );
  // Undefined without any `cors` setting: the pipeline then does no CORS work at all.
  const cors = compileCors(gateway, (url, path) => routes.select(url, path));
  const authorize = compileAuthorizer(gateway.auth);
  // Sending through a channel is an egress point: its `send.scopes` act as one more rule, for the channel API only.
  const channelSendRules: ImpliedRule[] = Object.entries(config.channels).flatMap(([name, channel]) =>
    channel.send
      ? [{ name: `channels.${name}.send`, rule: { paths: [channelSendPath(name)], scopes: channel.send.scopes } }]
      : [],
  );
  const authorizeChannelSend = compileAuthorizer(gateway.auth, channelSendRules);
  // Undefined while gateway.auth.browser is off (both forms): nothing more per request.
  const readBrowserCredential = compileBrowserCredentials(gateway.auth.browser);
  const jwtToleranceMs = (gateway.auth.bearer?.jwt.clockToleranceSeconds ?? 0) * 1000;
  // When each expiring key stops being accepted: an open WebSocket on it closes then.
  const keyExpiry = new Map(
    gateway.auth.apiKeys.flatMap((key) =>
      key.expiresAt === undefined ? [] : [[key.id, Date.parse(key.expiresAt)] as const],
    ),
  );
  const rateLimiter = compileRateLimiter(
    gateway.rateLimits,
    gateway.auth.apiKeys.map((key) => key.rateLimit),
    deps.rateLimits,
  );

  // The /api/ pipeline: each step returns the error to answer with, or undefined to go on.

  function clientAddress(req: Req): HttpError | undefined {
    const origin = req.gatehouse.origin ?? resolveClientIp(req);
    if (origin.ip === undefined)
      return new HttpError('invalid_client_ip', `unusable address in ${origin.chain.join(', ') || 'socket'}`);
    req.gatehouse.origin = origin;
    req.gatehouse.clientIp = origin.ip;
    return undefined;
  }

  // Decisions per origin: without trusted proxies an origin is per connection (see client-ip.ts).
  const allowedOrigins = new WeakMap<ClientOrigin, boolean>();
  function ipAllowlist(req: Req): HttpError | undefined {
    if (!allowed) return undefined;
    const origin = req.gatehouse.origin!;
    let ok = allowedOrigins.get(origin);
    if (ok === undefined) {
      ok = allowed.matches(parseAddress(origin.ip!)!);
      allowedOrigins.set(origin, ok);
    }
    return ok ? undefined : new HttpError('ip_not_allowed', `${origin.ip} is not in allowedIPs`);
  }

  // The lockout slot a request takes in failureLockout and gives back in credentials, the step
  // that always follows it: concurrent requests cannot all pass the check before one fails.
  const lockoutSlots = new WeakMap<Req, LockoutSlot>();

  function refuseAuth(req: Req, error: HttpError): HttpError {
    countAuthFailure(error.code);
    spans?.endAuthentication(req, error.code);
    return error;
  }

  async function failureLockout(req: Req): Promise<HttpError | undefined> {
    let admission = lockout.acquire(req.gatehouse.clientIp!);
    if (admission instanceof Promise) admission = await admission;
    if (typeof admission === 'number')
      return refuseAuth(
        req,
        new HttpError('too_many_failures', `locked out for ${admission}s more`, { 'retry-after': String(admission) }),
      );
    lockoutSlots.set(req, admission);
    return undefined;
  }

  async function credentials(req: Req): Promise<HttpError | undefined> {
    const slot = lockoutSlots.get(req)!;
    let outcome: AuthOutcome;
    try {
      outcome = await authenticator.authenticate(req);
    } catch (err) {
      slot.succeeded(); // a bug, not the client's guess: given back uncounted
      throw err;
    }
    if (!outcome.ok) {
      if (outcome.presentedBadCredential) {
        const lockedFor = slot.failed();
        if (lockedFor > 0)
          logger.warn(
            { ip: req.gatehouse.clientIp, seconds: lockedFor },
            'client locked out after repeated authentication failures',
          );
      } else {
        slot.succeeded();
      }
      return refuseAuth(req, outcome.error);
    }
    slot.succeeded();
    req.gatehouse.identity = outcome.identity;
    spans?.endAuthentication(req);
    prepareUpstreamHeaders(req, {
      requestId: req.gatehouse.id,
      origin: req.gatehouse.origin!,
      identity: outcome.identity,
      encrypted,
      forwardCredentials: gateway.auth.forwardCredentials,
    });
    return undefined;
  }

  // After the credentials passed: a refusal here is no guess at a credential (never counted by the lockout).
  function authorization(req: Req, by: Authorizer = authorize): HttpError | undefined {
    const path = matchablePath(req.url!);
    if (typeof path !== 'string') return path;
    req.gatehouse.path = path;
    // The request line logs a refusal with its detail: which rule, which scope or claim.
    return by(req.method!, path, req.gatehouse.identity!);
  }

  function rateLimit(req: Req, res: ServerResponse): HttpError | undefined {
    const { headers, refused } = rateLimiter.check(
      req.method!,
      req.gatehouse.path!,
      req.gatehouse.identity!,
      req.gatehouse.clientIp!,
    );
    if (headers) for (const name in headers) res.setHeader(name, headers[name]!);
    return refused;
  }

  /*
   * The hot path runs the steps directly rather than through Express's router: profiling showed
   * Express's per-request work (router dispatch, prototype swaps on req/res) was the largest
   * cost gatehouse added on top of proxying. Everything that is not /api/ still goes to Express.
   */
  async function apiPipeline(req: Req, res: ServerResponse): Promise<void> {
    if (spans) spans.begin(req, res, (req.gatehouse.origin = resolveClientIp(req)), encrypted);
    const error =
      cors?.decorate(req, res) ??
      checkApiPath(req) ??
      readBrowserCredential?.(req, false) ??
      clientAddress(req) ??
      ipAllowlist(req) ??
      cors?.preflight(req, res) ??
      spans?.beginAuthentication(req) ??
      (await failureLockout(req)) ??
      (await credentials(req)) ??
      authorization(req) ??
      rateLimit(req, res);
    if (error === ANSWERED) return;
    if (error) return respondWithError(req, res, error, logger);
    continueIfExpected(res);
    const route = routes.select(req.url!, req.gatehouse.path!);
    if (route instanceof HttpError) return respondWithError(req, res, route, logger);
    req.gatehouse.route = route.prefix;
    req.gatehouse.url = req.url;
    routes.aim(req, route);
    spans?.beginUpstream(req, route.upstream.target);
    req.gatehouse.upstreamStartedAt = performance.now();
    await route.proxy.handler(req, res, (err?: unknown) => respondWithError(req, res, err, logger));
  }

  function refuseUpgrade(req: Req, res: ServerResponse, error: HttpError): void {
    countWebSocket(`refused_${error.code}`);
    respondWithError(req, res, error, logger);
  }

  /** The WebSocket limits, checked last: a slot is taken here, given back if the handshake does not open. */
  function connectionLimits(req: Req): HttpError | undefined {
    const { websocket } = gateway;
    const subject = req.gatehouse.identity!.subject;
    if (deps.websockets.size >= websocket.maxConnections) {
      return new HttpError(
        'too_many_connections',
        `${deps.websockets.size} WebSockets open (gateway.websocket.maxConnections)`,
        { 'retry-after': '5' },
      );
    }
    if (
      websocket.maxConnectionsPerSubject !== undefined &&
      subject !== undefined &&
      deps.websockets.countFor(subject) >= websocket.maxConnectionsPerSubject
    ) {
      return new HttpError(
        'rate_limited',
        `${subject} has ${websocket.maxConnectionsPerSubject} WebSockets open (gateway.websocket.maxConnectionsPerSubject)`,
        { 'retry-after': '5' },
      );
    }
    deps.websockets.reserve(subject);
    return undefined;
  }

  /**
   * A WebSocket handshake: the whole /api/ pipeline (a refusal is an ordinary answer, and nothing
   * reaches the upstream), the connection limits, then the relay to the route's upstream.
   */
  async function websocketPipeline(req: Req, res: ServerResponse, head: Buffer): Promise<void> {
    // No CORS here: browsers do not apply it to WebSockets (RFC 6455 §10.2 leaves Origin to the server; credentials are explicit).
    if (spans) spans.begin(req, res, (req.gatehouse.origin = resolveClientIp(req)), encrypted);
    const before =
      checkApiPath(req) ??
      (gateway.websocket.enabled
        ? undefined
        : new HttpError('upgrade_not_supported', 'gateway.websocket.enabled is false')) ??
      readBrowserCredential?.(req, true) ??
      clientAddress(req) ??
      ipAllowlist(req) ??
      spans?.beginAuthentication(req) ??
      (await failureLockout(req));
    if (before) return refuseUpgrade(req, res, before);
    // Kept to check again at each reload (credentials() strips them from the headers).
    const presentedKey = req.headers['x-api-key'];
    const presentedAuthorization = req.headers.authorization;
    const error = (await credentials(req)) ?? authorization(req) ?? rateLimit(req, res);
    if (error) return refuseUpgrade(req, res, error);
    const route = routes.select(req.url!, req.gatehouse.path!);
    if (route instanceof HttpError) return refuseUpgrade(req, res, route);
    req.gatehouse.route = route.prefix;
    const limited = connectionLimits(req);
    if (limited) return refuseUpgrade(req, res, limited);
    req.gatehouse.url = req.url;
    routes.aim(req, route);
    spans?.beginUpstream(req, route.upstream.target);
    const identity = req.gatehouse.identity!;
    const target = new URL(route.upstream.target);
    const exp = identity.claims?.exp;
    const expiries = [
      typeof exp === 'number' ? exp * 1000 + jwtToleranceMs : undefined,
      identity.keyId === undefined ? undefined : keyExpiry.get(identity.keyId),
      identity.clientCertificate?.notAfter,
    ].filter((at): at is number => at !== undefined);
    relayWebSocket(req, res, head, {
      target,
      basePath: target.pathname.replace(/\/+$/, ''),
      timeoutMs: route.upstream.timeoutMs,
      settings: gateway.websocket,
      connections: deps.websockets,
      route: route.prefix,
      subject: identity.subject,
      credentials: {
        apiKey: typeof presentedKey === 'string' ? presentedKey : undefined,
        authorization: presentedAuthorization,
        method: req.method!,
        path: req.gatehouse.path!,
        clientIp: req.gatehouse.clientIp!,
        socket: req.socket,
      },
      expiresAt: expiries.length > 0 ? Math.min(...expiries) : undefined,
      onError: (err) => refuseUpgrade(req, res, err),
      onUpgraded: () => {
        req.gatehouse.rawStatus = 101;
      },
    });
  }

  /** Requests to switch protocols: WebSockets on /api/; any other upgrade is served as an ordinary request (RFC 9110 §7.8 lets a server ignore Upgrade). */
  function upgrade(req: IncomingMessage, res: ServerResponse, head: Buffer): void {
    if (!isWebSocketUpgrade(req) || !req.url?.startsWith(API_PREFIX)) {
      // Node's parser stopped at the headers: a body behind them cannot be read as this request's.
      if (hasBody(req) && admitRequest(req, res, requestLog, deps.limits, logger)) {
        return respondWithError(
          req,
          res,
          new HttpError('invalid_request', `a body on a request that asks to upgrade (${req.headers.upgrade})`),
          logger,
        );
      }
      return handle(req, res);
    }
    if (!admitRequest(req, res, requestLog, deps.limits, logger)) return;
    websocketPipeline(req as Req, res, head).catch((err: unknown) => respondWithError(req, res, err, logger));
  }

  /** An open WebSocket against this config: its address, its credentials (not their lockout), its rules. */
  async function stillAllowed(presented: ConnectionCredentials): Promise<boolean> {
    if (!gateway.websocket.enabled) return false;
    // Its TLS connection was judged by client-certificate settings a reload replaced (an optional → required reload left key-opened WebSockets open).
    if (connectionRetired(presented.socket)) return false;
    if (allowed && !allowed.matches(parseAddress(presented.clientIp)!)) return false;
    const headers: Record<string, string> = {};
    if (presented.apiKey !== undefined) headers['x-api-key'] = presented.apiKey;
    if (presented.authorization !== undefined) headers.authorization = presented.authorization;
    const probe = {
      headers,
      headersDistinct: presented.authorization === undefined ? {} : { authorization: [presented.authorization] },
      socket: presented.socket,
    } as unknown as IncomingMessage;
    const outcome = await authenticator.authenticate(probe);
    // The identity provider being down is not the connection's fault: it stays.
    if (!outcome.ok) return outcome.error.code === 'auth_unavailable';
    return authorize(presented.method, presented.path, outcome.identity) === undefined;
  }

  /**
   * Gatehouse's own channel API: the same steps as /api/ (rules, defaultAllow, rate limits
   * included, and the channels' `send.scopes`), then the channel instead of the proxy.
   */
  async function channelPipeline(req: Req, res: ServerResponse): Promise<void> {
    const error =
      clientAddress(req) ??
      ipAllowlist(req) ??
      (await failureLockout(req)) ??
      (await credentials(req)) ??
      authorization(req, authorizeChannelSend) ??
      rateLimit(req, res);
    if (error) return respondWithError(req, res, error, logger);
    continueIfExpected(res);
    await deps.channels!.handle(req, res);
  }

  const app = express();
  app.disable('x-powered-by');
  app.disable('etag');
  app.get('/healthz', (_req: IncomingMessage, res: ServerResponse) => answerHealthy(res));
  app.use((req: IncomingMessage, _res: ServerResponse, next: Next) => next(checkApiPath(req)));
  app.use((err: unknown, req: IncomingMessage, res: ServerResponse, _next: Next) =>
    respondWithError(req, res, err, logger),
  );

  function handle(req: IncomingMessage, res: ServerResponse): void {
    if (!admitRequest(req, res, requestLog, deps.limits, logger)) return;
    if (req.url?.startsWith(API_PREFIX)) {
      apiPipeline(req as Req, res).catch((err: unknown) => respondWithError(req, res, err, logger));
    } else if (deps.channels && req.url?.startsWith(CHANNEL_SEND_PREFIX)) {
      channelPipeline(req as Req, res).catch((err: unknown) => respondWithError(req, res, err, logger));
    } else {
      app(req, res);
    }
  }

  return {
    handle,
    authenticator,
    warmUp: async () => authenticator.jwt?.prefetch(),
    close: routes.close,
    rateLimitSignatures: rateLimiter.signatures,
    upgrade,
    stillAllowed,
  };
}
