import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import pino, { type Logger } from 'pino';
import type { HttpLimits } from '../config/schema.js';
import { HttpError, sendError } from '../errors.js';
import { bodyPending, checkFraming, closeAfterAnswer, isClosing } from './listener.js';
import type { ClientOrigin } from './client-ip.js';
import type { CorsPolicy } from '../gateway/cors.js';
import type { Identity } from '../gateway/credentials/authenticate.js';

/** What gatehouse learns about a request on its way through the pipeline; read by the request log. */
export interface RequestContext {
  id: string;
  startedAt: number;
  clientIp?: string;
  origin?: ClientOrigin;
  identity?: Identity;
  /** The decoded path gateway.auth.rules and gateway.rateLimits match (path-pattern.ts). */
  path?: string;
  /** The request target as received, kept for the log when a route's stripPrefix rewrote req.url. */
  url?: string;
  /** Catalogue code of the error sent, if any. */
  errorCode?: string;
  /** Internal reason for the log (never sent to the client). */
  detail?: string;
  /** What a webhook endpoint did with a request it accepted: accepted, duplicate, answered (a handshake). */
  outcome?: 'accepted' | 'duplicate' | 'answered';
  /** The configured prefix of the route the gateway chose (`/api/` for gateway.upstream): the metrics' `route` label. */
  route?: string;
  /** When the request was handed to the proxy (performance.now()), for the upstream timing. */
  upstreamStartedAt?: number;
  /** The status written straight to the socket for this request (listener.ts), when its own answer never was. */
  rawStatus?: number;
  /**
   * The request's trace (src/observability/request-spans.ts; opaque here), kept on the context
   * rather than in a WeakMap keyed by the request: an entry per request was most of the cost of
   * an unsampled request's tracing (the garbage collector's work on weak entries).
   */
  trace?: object;
  /** The CORS policy that allowed this request's Origin (src/gateway/cors.ts), or false when it did not; unset without Origin or CORS. */
  cors?: CorsPolicy | false;
}

declare module 'node:http' {
  interface IncomingMessage {
    gatehouse?: RequestContext;
  }
}

const PAIRING_CODE_IN_PATH = /^(\/webhook\/channels\/[^/]+\/pair\/)[^/]*/;

// Printable, no spaces, bounded: safe to echo into logs and upstream headers.
const SANE_REQUEST_ID = /^[A-Za-z0-9._:@-]{1,128}$/;

/**
 * Writes the one line per request; made once per app from the configured logger. `ctx`: the
 * request's context, for the metrics wrapped around it (src/observability/metrics.ts).
 */
export type RequestLog = (line: Record<string, unknown>, ctx?: RequestContext) => void;

/**
 * The request-line writer. Its fields are built by logRequest alone and never hold a secret, so
 * it skips pino's redaction and generic serialiser (together ~5 % of the /api/ hot path under
 * load) and writes pino's own line format to the logger's destination: the level and time as the
 * logger writes them (`log.format` json: `"level":"info"` and an ISO time; pino's defaults: 30 and
 * epoch milliseconds), then name and msg. The fixed parts are strings made once and the fields one
 * JSON.stringify: 2 µs a line against 4 for one object spread together and stringified, and 4 times
 * that when built from pino's own fragments (bench/log-line.ts).
 */
export function requestLogger(logger: Logger): RequestLog {
  const internals = logger as unknown as Record<symbol, unknown>;
  const stream = internals[pino.symbols.streamSym] as { write(line: string): void } | undefined;
  const formatters = internals[pino.symbols.formattersSym] as
    { level(label: string, number: number): Record<string, unknown> } | undefined;
  const time = internals[pino.symbols.timeSym];
  const formatted = formatters?.level('info', logger.levels.values.info!);
  const isoTime = time === pino.stdTimeFunctions.isoTime;
  // Any other shape (a logger gatehouse does not make) is left to pino.
  if (
    !stream ||
    Object.keys(formatted ?? {}).join() !== 'level' ||
    !(isoTime || time === pino.stdTimeFunctions.epochTime)
  )
    return (fields) => logger.info(fields, 'request');
  const head = `{"level":${JSON.stringify(formatted!.level)},"time":`;
  // name, and the worker number under gateway.workers
  const bound = JSON.stringify(logger.bindings()).slice(1, -1);
  const afterTime = bound === '' ? ',' : `,${bound},`;
  const now = isoTime ? () => `"${isoNow()}"` : () => String(Date.now());
  return function writeRequestLine(fields) {
    if (!logger.isLevelEnabled('info')) return;
    const own = JSON.stringify(fields);
    stream.write(head + now() + afterTime + (own.length > 2 ? own.slice(1, -1) + ',' : '') + '"msg":"request"}\n');
  };
}

let isoSecond = NaN;
let isoSecondPrefix = '';
/** `new Date().toISOString()`, with the part up to the second made once a second (it was half a request line's cost). */
export function isoNow(now = Date.now()): string {
  const second = Math.floor(now / 1000);
  if (second !== isoSecond) {
    isoSecond = second;
    isoSecondPrefix = new Date(second * 1000).toISOString().slice(0, 20);
  }
  const ms = now - second * 1000;
  return isoSecondPrefix + (ms < 10 ? '00' : ms < 100 ? '0' : '') + ms + 'Z';
}

/**
 * Every request on either listener starts here: the context and its log line, then the framing
 * checks (src/http/listener.ts) before anything else reads the request. Returns false when the
 * request was refused (answered, and its connection closed) or came on a connection that is closing.
 */
export function admitRequest(
  req: IncomingMessage,
  res: ServerResponse,
  log: RequestLog,
  limits: HttpLimits,
  logger: Logger,
): boolean {
  // Pipelined behind a request that closed the connection: its bytes are not trusted as a request.
  if (isClosing(req.socket)) return false;
  beginRequest(req, res, log);
  const refused = checkFraming(req, limits);
  if (refused) {
    // What else is on this connection cannot be trusted to be framed as we think: close it.
    closeAfterAnswer(res);
    respondWithError(req, res, refused, logger);
    return false;
  }
  // Answered before the body arrived (an error, an upstream that did not read it): Node would
  // read and discard the rest for as long as the client trickles it, holding the connection. So
  // such an answer says `Connection: close` from its head on (a client that reused the connection
  // would have its next request cut), whoever writes it; the body still flows (an upstream that
  // streams its answer while it reads), and if the answer ends before the body, the connection
  // is closed then.
  if (bodyPending(req)) {
    const writeHead = res.writeHead;
    res.writeHead = function (this: ServerResponse, ...args: unknown[]) {
      if (bodyPending(req) && !res.headersSent) res.setHeader('connection', 'close');
      return (writeHead as (...a: unknown[]) => ServerResponse).apply(this, args);
    } as ServerResponse['writeHead'];
    res.once('finish', () => {
      if (bodyPending(req)) closeAfterAnswer(res);
    });
  }
  return true;
}

/** Starts the context: keeps a client's sane X-Request-Id, else makes one; logs one line (to `logger`) when done. */
export function beginRequest(req: IncomingMessage, res: ServerResponse, log: RequestLog): RequestContext {
  const given = req.headers['x-request-id'];
  const ctx: RequestContext = {
    id: typeof given === 'string' && SANE_REQUEST_ID.test(given) ? given : randomUUID(),
    startedAt: performance.now(),
  };
  req.gatehouse = ctx;
  res.setHeader('x-request-id', ctx.id);
  res.once('close', () => logRequest(log, req, res, ctx));
  return ctx;
}

function logRequest(log: RequestLog, req: IncomingMessage, res: ServerResponse, ctx: RequestContext): void {
  const url = ctx.url ?? req.url ?? '';
  const queryAt = url.indexOf('?');
  // The query string is left out: clients put credentials there despite being told not to.
  const path = queryAt === -1 ? url : url.slice(0, queryAt);
  log(
    {
      id: ctx.id,
      method: req.method,
      // A pairing code in a path (channels) is a credential too.
      path: path.includes('/pair/') ? path.replace(PAIRING_CODE_IN_PATH, '$1[redacted]') : path,
      // 499: the client left before an answer (nginx's convention).
      status: res.writableFinished ? res.statusCode : (ctx.rawStatus ?? 499),
      ms: Math.round((performance.now() - ctx.startedAt) * 100) / 100,
      auth: ctx.identity?.methods.join(',') || undefined,
      subject: ctx.identity?.subject,
      ip: ctx.clientIp ?? req.socket.remoteAddress,
      error: ctx.errorCode,
      detail: ctx.detail,
      outcome: ctx.outcome,
    },
    ctx,
  );
}

/** Records an error on the request's context, for its log line. */
export function noteError(req: IncomingMessage, error: HttpError): void {
  if (req.gatehouse) {
    req.gatehouse.errorCode = error.code;
    req.gatehouse.detail = error.detail;
  }
}

/** Answers with a catalogue error; anything that is not an HttpError is logged and becomes a 500. */
export function respondWithError(req: IncomingMessage, res: ServerResponse, err: unknown, logger: Logger): void {
  let error: HttpError;
  if (err instanceof HttpError) error = err;
  else {
    logger.error({ err, id: req.gatehouse?.id }, 'unexpected error');
    error = new HttpError('internal_error', err instanceof Error ? err.message : String(err));
  }
  noteError(req, error);
  if (bodyPending(req)) closeAfterAnswer(res);
  sendError(res, error);
}

/** `GET /healthz` on either listener: 200 without auth, never proxied or stored. */
export function answerHealthy(res: ServerResponse): void {
  res.writeHead(200, { 'content-type': 'application/json; charset=utf-8', 'cache-control': 'no-store' });
  res.end('{"status":"ok"}');
}
