import http from 'node:http';
import https from 'node:https';
import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { createProxyMiddleware, type Plugin, type RequestHandler } from 'http-proxy-middleware';
import type { GatewayConfig } from '../config/schema.js';
import { HttpError, sendError } from '../errors.js';
import { hasBody } from '../http/listener.js';
import { replaceUpstreamCors } from './cors.js';

const UPSTREAM_TIMEOUT = 'GATEHOUSE_UPSTREAM_TIMEOUT';
const SAFE_REASON = /^[\t\x20-\x7e\x80-\xff]*$/;

/** Response headers about the upstream connection, not the client's (RFC 9110 7.6.1). */
const HOP_BY_HOP_RESPONSE = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'te',
  'trailer',
  'upgrade',
]);
const TIMEOUT_CODES = new Set([UPSTREAM_TIMEOUT, 'ETIMEDOUT', 'ESOCKETTIMEDOUT']);

/** The upstream request a client request was sent as (see `mayResend`). */
const SENT_AS = Symbol('gatehouse.upstreamRequest');
/** A request already sent a second time: never a third. */
const RESENT = Symbol('gatehouse.resent');
/** The upstream socket's bytesRead when the request got it: more at the failure means an answer had begun. */
const READ_BEFORE = Symbol('gatehouse.readBefore');
type ProxiedRequest = IncomingMessage & {
  [SENT_AS]?: http.ClientRequest;
  [RESENT]?: true;
  [READ_BEFORE]?: number;
};

/** RFC 9110 9.2.2: the methods whose repetition does what one request does (nginx's proxy_next_upstream default too). */
const IDEMPOTENT_METHODS = new Set(['GET', 'HEAD', 'OPTIONS', 'TRACE', 'PUT', 'DELETE']);
/** How a reused keep-alive connection fails when the upstream closed it as the request went out. */
const STALE_CONNECTION_CODES = new Set(['ECONNRESET', 'EPIPE', 'ECONNABORTED']);

/**
 * Whether an upstream failure may be answered by sending the request once more, on a new
 * connection: the connection was a reused keep-alive one and failed before any byte of an
 * answer (the upstream closed it idle as the request left: it never saw it), the request has no
 * body (bodies stream through, they are not kept to send again), its method is idempotent or it
 * carries an Idempotency-Key, and it was not resent already. Node's http docs name this case
 * (`request.reusedSocket`); nginx and Envoy retry it the same way.
 */
function mayResend(req: ProxiedRequest, res: ServerResponse, err: NodeJS.ErrnoException): boolean {
  const sent = req[SENT_AS];
  return (
    sent?.reusedSocket === true &&
    req[RESENT] === undefined &&
    STALE_CONNECTION_CODES.has(err.code ?? '') &&
    // Not one byte of an answer: a status line the upstream began means it saw the request.
    sent.socket !== null &&
    sent.socket.bytesRead === req[READ_BEFORE] &&
    !res.headersSent &&
    !res.destroyed &&
    !hasBody(req) &&
    (IDEMPOTENT_METHODS.has(req.method ?? '') || hasOneIdempotencyKey(req))
  );
}

/** One Idempotency-Key header with a value: an empty one is no key, and two (joined "a, b") are no single key. */
function hasOneIdempotencyKey(req: IncomingMessage): boolean {
  const key = req.headers['idempotency-key'];
  if (typeof key !== 'string' || key.trim() === '') return false;
  let count = 0;
  for (let i = 0; i < req.rawHeaders.length; i += 2)
    if (req.rawHeaders[i]!.toLowerCase() === 'idempotency-key') count++;
  return count === 1;
}

/** What http-proxy pipes into the upstream request of a client request without a body: nothing, it ends at once. */
const NO_BODY = {
  pipe<T extends { end(): unknown }>(upstreamRequest: T): T {
    upstreamRequest.end();
    return upstreamRequest;
  },
};

/**
 * A web pass of our own, first: a request without a body ends its upstream request at once
 * instead of piping an empty stream into it (http-proxy pipes `options.buffer` when one is given;
 * the options are a copy per request). The pipe's listeners on both streams were per-request work
 * for nothing.
 */
function endsAtOnce(req: IncomingMessage, _res: ServerResponse, options: { buffer?: unknown }): void {
  if (!hasBody(req)) options.buffer = NO_BODY;
}

/** Upstream failure → client status, in one place: timeouts 504, everything else 502. */
export function upstreamError(err: NodeJS.ErrnoException): HttpError {
  const detail = `upstream ${err.code ?? 'error'}: ${err.message}`;
  return new HttpError(TIMEOUT_CODES.has(err.code ?? '') ? 'upstream_timeout' : 'upstream_unreachable', detail);
}

export interface UpstreamProxy {
  handler: RequestHandler<IncomingMessage, ServerResponse>;
  /** Closes idle upstream connections; in-flight requests finish (their sockets idle out later). */
  close(): void;
}

/**
 * The proxy to the upstream: http-proxy-middleware with its default plugins ejected
 * (their logging and error pages are replaced by ours) and a keep-alive agent.
 * Bodies stream both ways; the path goes up byte for byte (`toProxy` skips url.parse).
 */
export function createUpstreamProxy(
  upstream: GatewayConfig['upstream'],
  onError: (req: IncomingMessage, error: HttpError) => void,
  /** Called when the upstream's response headers arrive (the upstream timing). */
  onAnswer?: (req: IncomingMessage) => void,
  /** Called when a request is sent again on a new connection (see mayResend). */
  onResend?: (req: IncomingMessage) => void,
): UpstreamProxy {
  const target = new URL(upstream.target);
  const basePath = target.pathname.replace(/\/+$/, '');
  // No agent-level socket timeout: Node keeps idle sockets for the upstream's Keep-Alive hint
  // minus a second, and a per-reuse setTimeout showed up in profiles.
  const agentOptions = { keepAlive: true, maxFreeSockets: 256, scheduling: 'lifo' as const };
  const agent = target.protocol === 'https:' ? new https.Agent(agentOptions) : new http.Agent(agentOptions);

  const gatehousePlugin: Plugin = (proxyServer) => {
    // http-proxy's deleteLength pass turns a chunked DELETE/OPTIONS into `Content-Length: 0` and
    // still pipes the body: the upstream would read that body as a second, smuggled request
    // (http-party/node-http-proxy#1720). Without it, Node frames the body as the headers say.
    const passes = proxyServer as unknown as { webPasses?: { name: string }[] };
    // An http-proxy internal: an upgrade that renames or drops it must be looked at, not run past.
    if (!Array.isArray(passes.webPasses) || !passes.webPasses.some((pass) => pass.name === 'deleteLength')) {
      throw new Error(
        'http-proxy internals changed: webPasses has no deleteLength pass to remove (src/gateway/proxy.ts)',
      );
    }
    passes.webPasses = [endsAtOnce, ...passes.webPasses.filter((pass) => pass.name !== 'deleteLength')];

    proxyServer.on('proxyReq', (proxyReq, req, res) => {
      (req as ProxiedRequest)[SENT_AS] = proxyReq;
      // What the socket had read when this request got it (a reused one at once, a new one later): earlier answers'.
      const readBefore = (socket: { bytesRead: number }) => ((req as ProxiedRequest)[READ_BEFORE] = socket.bytesRead);
      if (proxyReq.socket) readBefore(proxyReq.socket);
      else proxyReq.once('socket', readBefore);
      proxyReq.setTimeout(upstream.timeoutMs, () => {
        proxyReq.destroy(
          Object.assign(new Error(`no answer within ${upstream.timeoutMs} ms`), { code: UPSTREAM_TIMEOUT }),
        );
      });
      // The path must go up exactly as the gate checked it (http-proxy's urlJoin rewrites some).
      if (proxyReq.path !== basePath + req.url) {
        proxyReq.destroy(
          Object.assign(new Error(`path changed on the way up: ${proxyReq.path}`), { code: 'GATEHOUSE_PATH_CHANGED' }),
        );
        return;
      }
      // A body on DELETE/OPTIONS is legal but many servers never read it: such a connection is
      // not reused, so unread bytes cannot be taken for the next request on it.
      if (hasBody(req) && (req.method === 'DELETE' || req.method === 'OPTIONS')) proxyReq.shouldKeepAlive = false;
      // A 101 hands the socket over with no response or error event (the client would wait
      // forever): answer 502 here. gatehouse proxies no upgrades.
      proxyReq.on('upgrade', (_upRes, socket) => {
        socket.destroy();
        const error = new HttpError('upstream_unreachable', 'upstream switched protocols (101)');
        onError(req, error);
        sendError(res as ServerResponse, error);
      });
      // The client left before the upstream answered: stop the upstream work now, not at the timeout.
      res.once('close', () => {
        if (!res.writableFinished) proxyReq.destroy();
      });
    });
    proxyServer.on('error', (err, req, res) => {
      if ('writeHead' in res && mayResend(req, res, err as NodeJS.ErrnoException)) {
        (req as ProxiedRequest)[RESENT] = true;
        onResend?.(req);
        // `agent: false`: a connection of its own, not another idle one that may be just as stale.
        proxyServer.web(req, res, { ...proxyOptions, agent: false });
        return;
      }
      const error = upstreamError(err as NodeJS.ErrnoException);
      onError(req, error);
      // Once the upstream's headers went out, the only honest signal left is a cut connection.
      if ('writeHead' in res) sendError(res, error);
      else res.destroy();
    });
    // The client went away first: http-proxy aborts the upstream request; nothing to answer.
    proxyServer.on('econnreset', () => {});
    // selfHandleResponse: one writeHead with the upstream's headers instead of http-proxy's
    // header-by-header copy (a measured hot spot), hop-by-hop headers left behind.
    proxyServer.on('proxyRes', (proxyRes, req, res) => {
      onAnswer?.(req);
      if (res.destroyed) return void proxyRes.destroy();
      const headers: OutgoingHttpHeaders = {};
      for (const name in proxyRes.headers) if (!HOP_BY_HOP_RESPONSE.has(name)) headers[name] = proxyRes.headers[name];
      // Gatehouse answers CORS on this route (src/gateway/cors.ts): the upstream's own Access-Control-* would contradict it.
      if (req.gatehouse?.cors !== undefined) replaceUpstreamCors(headers);
      const status = proxyRes.statusCode ?? 0;
      const reason =
        proxyRes.statusMessage !== undefined && SAFE_REASON.test(proxyRes.statusMessage)
          ? proxyRes.statusMessage
          : undefined;
      try {
        // Node refuses some statuses and reasons an upstream can send: a 502 for this request, not a crash.
        if (status < 100 || status > 599 || status === 101) throw new Error(`unusable upstream status ${status}`);
        res.writeHead(status, reason, headers);
      } catch (err) {
        proxyRes.destroy();
        const error = new HttpError('upstream_unreachable', `upstream answer refused: ${(err as Error).message}`);
        onError(req, error);
        sendError(res, error);
        return;
      }
      proxyRes.pipe(res);
      proxyRes.on('error', () => res.destroy());
      // The client left mid-response (or a stream that never ends): stop reading the upstream.
      res.on('close', () => {
        if (!res.writableFinished) proxyRes.destroy();
      });
    });
  };

  // What http-proxy is given for every request (http-proxy-middleware passes a copy per request).
  const proxyOptions = {
    // Pre-parsed: given a string, http-proxy would url.parse() it on every request.
    target: {
      protocol: target.protocol,
      host: target.host,
      hostname: target.hostname.replace(/^\[|\]$/g, ''),
      port: target.port || (target.protocol === 'https:' ? '443' : '80'),
      path: basePath,
    } as never,
    changeOrigin: true,
    toProxy: true,
    xfwd: false,
    agent,
    selfHandleResponse: true,
  };
  const handler = createProxyMiddleware<IncomingMessage, ServerResponse>({
    ...proxyOptions,
    ejectPlugins: true,
    plugins: [gatehousePlugin],
  });
  const close = () => {
    for (const sockets of Object.values(agent.freeSockets)) for (const socket of sockets ?? []) socket.destroy();
  };
  return { handler, close };
}
