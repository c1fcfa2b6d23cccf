import type { IncomingMessage, ServerResponse } from 'node:http';
import express, { type NextFunction } from 'express';
import type { Logger } from 'pino';
import type { Config } from './config/schema.js';
import { HttpError, sendError } from './errors.js';
import { createClientIpResolver } from './gateway/client-ip.js';
import { Authenticator } from './gateway/credentials/authenticate.js';
import { prepareUpstreamHeaders } from './gateway/forward-headers.js';
import { compileAddressMatcher, parseAddress } from './gateway/ip-allowlist.js';
import type { FailureLockout } from './gateway/lockout.js';
import { checkApiPath } from './gateway/path-gate.js';
import { createUpstreamProxy } from './gateway/proxy.js';
import { beginRequest, type RequestContext } from './gateway/request-context.js';

type Next = NextFunction;
type Req = IncomingMessage & { gatehouse: RequestContext };

export interface GatewayApp {
  /** The request listener (an Express app). */
  handle: (req: IncomingMessage, res: ServerResponse) => void;
  authenticator: Authenticator;
  /** Prefetches remote keys (JWKS); returns a problem to log, if any. */
  warmUp(): Promise<string | undefined>;
  /** Releases idle upstream connections (after a reload swapped this app out). */
  close(): void;
}

/**
 * Builds the /api/ edge from a Config: the pipeline path gate → client IP → allowedIPs →
 * lockout → credentials → upstream headers → proxy, each a named middleware.
 * Everything that can be compiled (matchers, keys, verifiers) is compiled here, once.
 * Never listens: server.ts does, so tests can mount it anywhere.
 */
export async function buildGatewayApp(config: Config, deps: { logger: Logger; lockout: FailureLockout }): Promise<GatewayApp> {
  const { gateway } = config;
  const { logger, lockout } = deps;
  const resolveClientIp = createClientIpResolver(gateway.trustProxy);
  const allowed = gateway.auth.allowedIPs ? compileAddressMatcher(gateway.auth.allowedIPs) : undefined;
  const authenticator = await Authenticator.create(gateway.auth);
  const encrypted = gateway.tls !== undefined;
  const proxy = createUpstreamProxy(gateway.upstream, (req, error) => noteError(req, error));

  function startContext(req: IncomingMessage, res: ServerResponse, next: Next) {
    beginRequest(req, res, logger);
    next();
  }

  function healthz(_req: IncomingMessage, res: ServerResponse) {
    res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
    res.end('{"status":"ok"}');
  }

  function pathGate(req: IncomingMessage, _res: ServerResponse, next: Next) {
    next(checkApiPath(req));
  }

  function clientAddress(req: Req, _res: ServerResponse, next: Next) {
    const origin = resolveClientIp(req);
    if (origin.ip === undefined) return next(new HttpError('invalid_client_ip', `unusable address in ${origin.chain.join(', ') || 'socket'}`));
    req.gatehouse.origin = origin;
    req.gatehouse.clientIp = origin.ip;
    next();
  }

  function ipAllowlist(req: Req, _res: ServerResponse, next: Next) {
    const ip = req.gatehouse.clientIp!;
    if (allowed && !allowed.matches(parseAddress(ip)!)) return next(new HttpError('ip_not_allowed', `${ip} is not in allowedIPs`));
    next();
  }

  async function failureLockout(req: Req, _res: ServerResponse, next: Next) {
    const seconds = await lockout.lockedFor(req.gatehouse.clientIp!);
    if (seconds > 0) return next(new HttpError('too_many_failures', `locked out for ${seconds}s more`, { 'retry-after': String(seconds) }));
    next();
  }

  async function credentials(req: Req, _res: ServerResponse, next: Next) {
    const outcome = await authenticator.authenticate(req);
    if (!outcome.ok) {
      if (outcome.presentedBadCredential) {
        const lockedFor = await lockout.recordFailure(req.gatehouse.clientIp!);
        if (lockedFor > 0) logger.warn({ ip: req.gatehouse.clientIp, seconds: lockedFor }, 'client locked out after repeated authentication failures');
      }
      return next(outcome.error);
    }
    req.gatehouse.identity = outcome.identity;
    prepareUpstreamHeaders(req, {
      requestId: req.gatehouse.id,
      origin: req.gatehouse.origin!,
      identity: outcome.identity,
      encrypted,
      forwardCredentials: gateway.auth.forwardCredentials,
    });
    next();
  }

  function noteError(req: IncomingMessage, error: HttpError) {
    if (req.gatehouse) {
      req.gatehouse.errorCode = error.code;
      req.gatehouse.detail = error.detail;
    }
  }

  function errorResponse(err: unknown, req: IncomingMessage, res: ServerResponse, _next: Next) {
    if (err instanceof HttpError) {
      noteError(req, err);
      return sendError(res, err);
    }
    logger.error({ err, id: req.gatehouse?.id }, 'unexpected error');
    const error = new HttpError('internal_error', err instanceof Error ? err.message : String(err));
    noteError(req, error);
    sendError(res, error);
  }

  const app = express();
  app.disable('x-powered-by');
  app.disable('etag');
  app.use(startContext);
  app.get('/healthz', healthz);
  app.use(pathGate, clientAddress as never, ipAllowlist as never, failureLockout as never, credentials as never, proxy.handler);
  app.use(errorResponse);

  return {
    handle: app,
    authenticator,
    warmUp: async () => authenticator.jwt?.prefetch(),
    close: proxy.close,
  };
}
