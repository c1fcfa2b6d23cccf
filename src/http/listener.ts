import http from 'node:http';
import net, { type AddressInfo, type Socket } from 'node:net';
import { acceptGraceOver, currentAcceptGrace } from './accept-grace.js';
import type { HttpLimits } from '../config/schema.js';
import { errorCatalogue, HttpError, sendError, UsageError, type ErrorCode } from '../errors.js';
import { httpsServer, type ServedCertificate, type TlsFiles, type TlsPem } from './tls.js';

export interface Listening {
  server: http.Server;
  /** e.g. http://127.0.0.1:8080 (the port actually bound when configured as 0). */
  url: string;
  /** With TLS: the certificate served to new connections now. */
  certificate?: ServedCertificate;
}

/**
 * Opens a listener with every HTTP parser limit set explicitly (`gateway.limits`, `webhooks.limits`).
 * Node's silent cut of header lines past `maxHeadersCount` is the reason for `+ 1`: the parser
 * keeps one line more than allowed, so `checkFraming` can tell "exactly at the limit" from "cut"
 * and refuse the latter (its body framing may have come from a line nobody else can see).
 */
export async function listen(
  name: string,
  at: { host: string; port: number },
  tls: TlsFiles | TlsPem | undefined,
  limits: HttpLimits,
  handler: http.RequestListener,
  /**
   * Requests asking to switch protocols (`Upgrade`). Each gets a ServerResponse on its socket, so
   * a refusal is an ordinary answer, in its turn on the connection like any request; the socket
   * closes after such an answer. Without it, Node serves them as ordinary requests.
   */
  upgrade?: (req: http.IncomingMessage, res: http.ServerResponse, head: Buffer) => void,
): Promise<Listening> {
  const options: http.ServerOptions = {
    maxHeaderSize: limits.maxHeaderBytes,
    headersTimeout: limits.headersTimeoutMs,
    requestTimeout: limits.requestTimeoutMs,
    keepAliveTimeout: limits.keepAliveTimeoutMs,
    // Node checks the two timeouts above only this often (default 30 s, which made a 15 s limit 45 s).
    connectionsCheckingInterval: Math.min(1_000, limits.headersTimeoutMs),
    // checkFraming refuses a missing Host itself, with the JSON error (Node's own 400 has no body).
    requireHostHeader: false,
    joinDuplicateHeaders: false,
  };
  const serve = oneAtATime((req, res) => {
    if (inAcceptGrace.has(server)) res.shouldKeepAlive = false; // Node then says `Connection: close` and closes after
    handler(req, res);
  });
  const open = new Set<Socket>();
  // A reload that changed the client-certificate CA, CRL or mode: a connection verified under the
  // old ones takes no further request (idle: closed now; busy: after its current answer).
  const closeRetired = (isRetired: (socket: Socket) => boolean) => {
    for (const socket of open) {
      if (!isRetired(socket)) continue;
      const inFlight = answering.get(socket);
      if (inFlight && !inFlight.writableFinished) closeAfterAnswer(inFlight);
      else socket.destroy();
    }
  };
  const secure = tls ? httpsServer(name, tls, options, serve, closeRetired) : undefined;
  const server = secure?.server ?? http.createServer(options, serve);
  server.maxHeadersCount = limits.maxHeaderCount + 1;
  server.maxRequestsPerSocket = 0;
  connections.set(server, open);
  server.on(secure ? 'secureConnection' : 'connection', (socket: Socket) => {
    open.add(socket);
    socket.once('close', () => open.delete(socket));
  });
  server.on('clientError', answerParseError);
  // `Expect: 100-continue` reaches the handler unanswered: gatehouse says "continue" only once the
  // request passed its checks (continueIfExpected), so a refused client never sends its body.
  server.on('checkContinue', (req: http.IncomingMessage, res: http.ServerResponse) => {
    expectingContinue.add(res);
    serve(req, res);
  });
  // Any other expectation: 417 in JSON, and the connection closes (Node's own 417 kept it open,
  // so what was pipelined behind was served although this request never met the framing checks).
  // In its turn on the connection, as any request: the ones ahead of it are answered first.
  server.on(
    'checkExpectation',
    oneAtATime((req: http.IncomingMessage, res: http.ServerResponse) => {
      closeAfterAnswer(res);
      sendError(res, new HttpError('expectation_failed', `Expect: ${req.headers.expect}`));
    }),
  );
  if (upgrade) {
    const runUpgrade = inTurn((req, res) => upgrade(req, res, upgradeHeads.get(req) ?? EMPTY));
    server.on('upgrade', (req: http.IncomingMessage, socket: Socket, head: Buffer) => {
      open.delete(socket); // no longer an HTTP connection: the WebSocket drain has it (or it closes after a refusal)
      socket.once('error', () => socket.destroy());
      lastParsed.set(socket, req);
      if (isClosing(socket)) return void socket.destroy(); // behind an answer that closes the connection
      if (head.length > 0) upgradeHeads.set(req, head);
      // Its answer is made only in its turn: a request before it on this connection may still hold the socket.
      const start = () => {
        if (isClosing(socket)) return; // the answer before it closed the connection
        const res = new http.ServerResponse(req);
        res.assignSocket(socket);
        res.shouldKeepAlive = false; // the parser has let go of this socket: nothing more is read as HTTP
        res.once('finish', () => socket.end());
        runUpgrade(req, res);
      };
      const queue = waiting.get(socket);
      if (queue === undefined) {
        waiting.set(socket, []);
        start();
      } else if (queue.length >= MAX_PIPELINED) {
        tooManyWaiting(socket, queue);
      } else {
        queue.push(start);
      }
    });
  }
  // gatehouse tunnels nothing: CONNECT gets an answer instead of a silently dropped socket.
  server.on('connect', (_req: http.IncomingMessage, socket: Socket) => writeRawError(socket, 'method_not_allowed'));
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) => reject(describeListenError(name, at, err)));
    server.listen(at.port, at.host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  const host = address.family === 'IPv6' ? `[${address.address}]` : address.address;
  return { server, url: `${tls ? 'https' : 'http'}://${host}:${address.port}`, certificate: secure?.certificate };
}

/** A bind failure a user can fix, as one line naming the listener (`webhooks.listen 127.0.0.1:7081 is already in use`). */
function describeListenError(name: string, at: { host: string; port: number }, err: NodeJS.ErrnoException): Error {
  const address = `${at.host.includes(':') ? `[${at.host}]` : at.host}:${at.port}`;
  const why =
    err.code === 'EADDRINUSE'
      ? 'is already in use'
      : err.code === 'EACCES'
        ? 'is not permitted (a port below 1024 needs privileges)'
        : err.code === 'EADDRNOTAVAIL'
          ? 'is not an address of this machine'
          : err.code === 'ENOTFOUND' || err.code === 'EAI_AGAIN'
            ? 'names a host that does not resolve'
            : undefined;
  return why ? new UsageError(`${name} ${address} ${why}`) : err;
}

/** Listeners in a shutdown's accept grace: still accepting, every answer closes its connection. */
const inAcceptGrace = new WeakSet<http.Server>();
/** Each listener's open HTTP connections (upgraded ones leave it). */
const connections = new WeakMap<http.Server, Set<Socket>>();

/**
 * Drain: within a close that has an accept grace (`withAcceptGrace`), keep accepting until it is
 * over, every answer saying `Connection: close`; then stop accepting, close idle keep-alive
 * sockets, wait for in-flight requests (up to `graceMs`), then cut the rest.
 */
export async function closeServer(server: http.Server, graceMs: number): Promise<void> {
  if (!server.listening) return;
  const grace = currentAcceptGrace();
  if (grace) {
    inAcceptGrace.add(server);
    await acceptGraceOver(grace);
    // One more pass through the event loop's I/O phase: connections the kernel completed before the
    // grace ended are accepted, not reset with the listening socket.
    await new Promise((resolve) => setImmediate(resolve));
    if (!server.listening) return;
  }
  const closed = new Promise<void>((resolve) => {
    if (!grace) return void server.close(() => resolve());
    // Node's own close also cuts connections whose request it has not read yet (it counts them idle):
    // after a grace those were accepted moments ago, on a loaded machine many of them, and are owed
    // an answer (the header and request timeouts still hold them). Only connections idle after an
    // answer (kept alive since before the grace) go now.
    net.Server.prototype.close.call(server, () => resolve());
    for (const socket of connections.get(server) ?? []) if (keptAliveIdle(socket)) socket.destroy();
  });
  if (!grace) server.closeIdleConnections();
  const timer = setTimeout(() => server.closeAllConnections(), graceMs);
  timer.unref();
  await closed;
  clearTimeout(timer);
}

/**
 * What the parser refused (malformed framing, headers too large, too slow) gets the catalogue's
 * JSON answer instead of Node's bare one; the connection is closed either way.
 */
function answerParseError(err: NodeJS.ErrnoException, socket: Socket): void {
  if (err.code === 'ECONNRESET' || !socket.writable) {
    socket.destroy();
    return;
  }
  // A request before the bad bytes is still being answered: it gets its own answer (it may have
  // run upstream already; a 400 written over it would tell the client it did not), then the
  // connection closes. The bad bytes get nothing.
  const inFlight = answering.get(socket);
  const last = lastParsed.get(socket);
  const code: ErrorCode =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? 'request_header_fields_too_large'
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? 'request_timeout'
        : 'invalid_request';
  if (last && !last.complete) {
    // The bad bytes are the last request's own body (a broken chunk): it can never be whole. While
    // its answer has not begun it is refused now (400, as Node does without this handler), not
    // left to the body timeout; closing the socket aborts its handler's read and whatever it had
    // begun sending upstream, unfinished. Waiting behind another request, it gets nothing; its
    // answer begun or sent already (an upstream that answered early), it gets no second one.
    if (inFlight && inFlight.req !== last && !inFlight.writableFinished) return closeAfterAnswer(inFlight);
    if (inFlight?.req !== last || inFlight.headersSent) {
      socket.destroy();
      return;
    }
    // This answer is the request's own: its log line says so, not 499 ("the client left").
    if (last.gatehouse) Object.assign(last.gatehouse, { rawStatus: errorCatalogue[code].status, errorCode: code });
  } else if (inFlight && !inFlight.writableFinished) return closeAfterAnswer(inFlight);
  writeRawError(socket, code);
}

/** A catalogue error written straight to a socket Node's HTTP layer has given up on; then closed. */
function writeRawError(socket: Socket, code: ErrorCode): void {
  const { status, message } = errorCatalogue[code];
  const body = JSON.stringify({ error: { code, message } });
  socket.end(
    `HTTP/1.1 ${status} ${http.STATUS_CODES[status]}\r\ncontent-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\ncache-control: no-store\r\nconnection: close\r\n\r\n${body}`,
  );
  socket.destroySoon();
}

/** The bytes that came after an upgrade request's headers (the new protocol's first ones). */
const upgradeHeads = new WeakMap<http.IncomingMessage, Buffer>();
const EMPTY = Buffer.alloc(0);

/** Requests pipelined behind one still being answered, per connection; past this the connection is cut. */
const MAX_PIPELINED = 16;
const waiting = new WeakMap<Socket, (() => void)[]>();
/** The answer each connection is working on (the one request of it being served). */
const answering = new WeakMap<Socket, http.ServerResponse>();
/** The request each connection's parser handed over last (a parse error is in its body, or after it). */
const lastParsed = new WeakMap<Socket, http.IncomingMessage>();

/**
 * One request per connection at a time. Node parses pipelined requests and hands them all over
 * at once, so one connection carrying thousands would open as many upstream requests together
 * (descriptors, memory): each waits until the one before it on its connection is answered.
 */
function oneAtATime(handler: http.RequestListener): http.RequestListener {
  const run = inTurn(handler);
  return function serveInTurn(req, res) {
    lastParsed.set(req.socket, req);
    if (isClosing(req.socket)) return; // behind an answer that closes the connection: never handled
    const queue = waiting.get(req.socket);
    if (queue === undefined) {
      waiting.set(req.socket, []);
      return run(req, res);
    }
    if (queue.length >= MAX_PIPELINED) return tooManyWaiting(req.socket, queue);
    // Checked again in its turn: the answer before it may have closed the connection meanwhile
    // (an early answer to a request with a body), and then this one is never handled.
    queue.push(() => {
      if (!isClosing(req.socket)) run(req, res);
    });
  };
}

/** Too many waiting: the one being served still gets its answer, nothing behind it does. */
function tooManyWaiting(socket: Socket, queue: (() => void)[]): void {
  queue.length = 0;
  const inFlight = answering.get(socket);
  if (inFlight) closeAfterAnswer(inFlight);
  else socket.destroy();
}

/** Runs `handler` as the request its connection is answering now; the next one waiting goes once this answer closes. */
function inTurn(handler: http.RequestListener): http.RequestListener {
  return function run(req, res) {
    answering.set(req.socket, res);
    res.once('close', () => {
      answering.delete(req.socket);
      const queue = waiting.get(req.socket);
      const next = queue?.shift();
      if (next) next();
      else waiting.delete(req.socket);
    });
    handler(req, res);
  };
}

/** Answers whose request sent `Expect: 100-continue` and has not been told to continue yet. */
const expectingContinue = new WeakSet<http.ServerResponse>();

/** `Expect: 100-continue`: the request passed gatehouse's checks, so the client may send its body now. */
export function continueIfExpected(res: http.ServerResponse): void {
  if (!expectingContinue.delete(res) || res.headersSent) return;
  res.writeContinue();
}

/** Connections that will take no further request: what was pipelined behind is never handled. */
const closing = new WeakSet<Socket>();

/**
 * Ends the connection once this answer is out: `Connection: close` for the client, requests
 * already pipelined behind it are dropped (see `isClosing`), and the socket is destroyed a moment
 * after the answer is written (at once could reset it before the client has read it).
 * For answers sent before a body arrived, and for requests whose framing was refused: the rest of
 * the bytes on such a connection are never read as anything.
 */
export function closeAfterAnswer(res: http.ServerResponse): void {
  const { req } = res;
  const socket = req.socket;
  const closeSoon = () => setTimeout(() => socket.destroy(), 1_000).unref();
  // A body still arriving is never read now; one already received may still be on its way upstream.
  if (bodyPending(req)) req.pause();
  if (closing.has(socket)) return;
  closing.add(socket);
  if (res.writableFinished) return void closeSoon();
  if (!res.headersSent) res.setHeader('connection', 'close');
  res.once('finish', closeSoon);
}

/** Between requests: answered at least once, nothing being answered or waiting, not closing already. */
function keptAliveIdle(socket: Socket): boolean {
  return lastParsed.has(socket) && !answering.has(socket) && !waiting.has(socket) && !socket.writableEnded;
}

/** The connection was told to close: a request parsed from it after that is not handled. */
export function isClosing(socket: Socket): boolean {
  // Node's own decision counts too: an answer it ended with `Connection: close` (a request body
  // never read) ends the socket's writing side, and what was parsed behind it must not run.
  return closing.has(socket) || socket.writableEnded || socket.destroyed;
}

/** The request has body bytes that have not all arrived yet. */
export function bodyPending(req: http.IncomingMessage): boolean {
  return !req.complete && hasBody(req);
}

/** `host[:port]` with a DNS-style name, IPv4 or [IPv6]: nothing a list or path could hide in (RFC 9112 3.2). */
const HOST = /^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~-]+)(?::[0-9]{1,5})?$/;

export function isValidHost(value: string | undefined): value is string {
  return value !== undefined && HOST.test(value);
}

/** Headers that frame the message: a client may not have them dropped by naming them in Connection. */
export const FRAMING_HEADERS = ['content-length', 'transfer-encoding', 'host'];
/** Connection values that name no other header: the common case skips parsing it. */
export const PLAIN_CONNECTION = /^\s*(keep-alive|close)\s*$/i;

/**
 * Refuses, before anything else reads the request, framing that gatehouse and a server behind
 * it could read differently (request smuggling):
 * - more header lines than `maxHeaderCount` (Node drops the rest from `req.headers` while its
 *   parser still frames the body by them: a hidden Content-Length or chunked);
 * - Host missing in HTTP/1.1, repeated, or not `host[:port]`; Content-Type repeated;
 * - a transfer coding other than exactly `chunked` (the only one gatehouse re-frames);
 * - a body on GET/HEAD/TRACE (many servers never read it, so its bytes become the next request);
 * - a Connection header naming a framing header (honouring it would strip the body's length).
 * Duplicate or conflicting Content-Length, and Content-Length with Transfer-Encoding, never get
 * here: Node's parser answers them 400.
 */
export function checkFraming(req: http.IncomingMessage, limits: HttpLimits): HttpError | undefined {
  const raw = req.rawHeaders;
  if (raw.length > 2 * limits.maxHeaderCount)
    return new HttpError('request_header_fields_too_large', `more than ${limits.maxHeaderCount} header lines`);
  let hosts = 0;
  let contentTypes = 0;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === 4 && name.toLowerCase() === 'host') hosts++;
    else if (name.length === 12 && name.toLowerCase() === 'content-type') contentTypes++;
  }
  if (hosts > 1) return new HttpError('invalid_host', `${hosts} Host headers`);
  // One field (RFC 9110 §8.3): Node keeps the first, a server behind may read another.
  if (contentTypes > 1) return new HttpError('invalid_request', `${contentTypes} Content-Type headers`);
  if (hosts === 0 && req.httpVersionMajor === 1 && req.httpVersionMinor >= 1)
    return new HttpError('invalid_host', 'no Host (HTTP/1.1 requires one)');
  if (hosts === 1 && !isValidHost(req.headers.host)) return new HttpError('invalid_host', 'Host is not host[:port]');

  const coding = req.headers['transfer-encoding'];
  if (coding !== undefined && coding.toLowerCase() !== 'chunked')
    return new HttpError('invalid_request', `transfer-encoding ${coding}`);
  // HTTP/1.0 has no chunked coding: RFC 9112 §6.1 has such a message treated as faulty framing (a server behind may frame it otherwise).
  if (coding !== undefined && req.httpVersionMajor === 1 && req.httpVersionMinor === 0)
    return new HttpError('invalid_request', 'transfer-encoding in an HTTP/1.0 request');
  if ((req.method === 'GET' || req.method === 'HEAD' || req.method === 'TRACE') && hasBody(req)) {
    return new HttpError('invalid_request', `${req.method} with a body`);
  }
  const connection = req.headers.connection;
  if (connection === undefined || PLAIN_CONNECTION.test(connection)) return undefined;
  const named = connection
    .toLowerCase()
    .split(',')
    .map((t) => t.trim());
  return named.some((name) => FRAMING_HEADERS.includes(name))
    ? new HttpError('invalid_request', `Connection names a framing header: ${connection}`)
    : undefined;
}

/** The request carries a body, as its (complete, checked) headers frame it. */
export function hasBody(req: http.IncomingMessage): boolean {
  return req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) > 0;
}
