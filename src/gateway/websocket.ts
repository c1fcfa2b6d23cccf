import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';
import type { GatewayConfig } from '../config/schema.js';
import { HttpError } from '../errors.js';
import { acceptGraceOver, currentAcceptGrace } from '../http/accept-grace.js';
import { countWebSocket, trackWebSocket } from '../observability/metrics.js';
import { GATEHOUSE_PROTOCOL, offeredGatehouseProtocol } from './browser-credentials.js';
import { upstreamError } from './proxy.js';

/** RFC 6455 §4.1: an opening handshake is a GET with `Upgrade: websocket`. */
export function isWebSocketUpgrade(req: IncomingMessage): boolean {
  const upgrade = req.headers.upgrade;
  return req.method === 'GET' && typeof upgrade === 'string' && upgrade.trim().toLowerCase() === 'websocket';
}

/** Why an open connection was closed by gatehouse (metrics `outcome`, and the log). */
export type CloseReason = 'revoked' | 'expired' | 'idle' | 'lifetime' | 'drained';

/** What authenticated a connection, kept to check again when the config changes. */
export interface ConnectionCredentials {
  apiKey: string | undefined;
  authorization: string | undefined;
  method: string;
  /** The decoded path its rules matched. */
  path: string;
  clientIp: string;
  /** The client's connection: its certificate (mTLS) is checked again, as it stands then. */
  socket: Socket;
}

/** One open, proxied WebSocket. */
export interface OpenWebSocket {
  readonly route: string;
  readonly subject: string | undefined;
  readonly credentials: ConnectionCredentials;
  close(reason: CloseReason): void;
}

/**
 * The open WebSockets of one gateway process. It outlives each config: a reload checks every
 * connection against the new one (`recheck`), so a connection lives no longer than the key,
 * token or rule that let it in.
 */
export class WebSocketConnections {
  private readonly open = new Set<OpenWebSocket>();
  /** Connections open or being opened (a slot is taken before the upstream is asked, so a burst cannot overshoot a limit). */
  private taken = 0;
  private readonly perSubject = new Map<string, number>();
  private drained: (() => void) | undefined;

  /** Connections open or being opened. */
  get size(): number {
    return this.taken;
  }

  countFor(subject: string): number {
    return this.perSubject.get(subject) ?? 0;
  }

  /** Takes a slot for a handshake about to be relayed; give it back with `release` unless it opens. */
  reserve(subject: string | undefined): void {
    this.taken++;
    if (subject !== undefined) this.perSubject.set(subject, this.countFor(subject) + 1);
  }

  /** Gives back a slot (a handshake that did not open, a connection that ended). */
  release(subject: string | undefined): void {
    this.taken--;
    if (subject !== undefined) {
      const left = this.countFor(subject) - 1;
      if (left > 0) this.perSubject.set(subject, left);
      else this.perSubject.delete(subject);
    }
    if (this.taken === 0) this.drained?.();
  }

  /** A reserved handshake opened. */
  add(connection: OpenWebSocket): void {
    this.open.add(connection);
  }

  /** An open connection ended: its slot is given back. */
  delete(connection: OpenWebSocket): void {
    if (!this.open.delete(connection)) return;
    this.release(connection.subject);
  }

  /** Closes (`revoked`) every connection `allowed` now refuses; resolves with how many. */
  async recheck(allowed: (credentials: ConnectionCredentials) => Promise<boolean>): Promise<number> {
    const verdicts = await Promise.all(
      [...this.open].map(
        async (connection) => [connection, await allowed(connection.credentials).catch(() => false)] as const,
      ),
    );
    let closed = 0;
    for (const [connection, ok] of verdicts) {
      if (ok) continue;
      connection.close('revoked');
      closed++;
    }
    return closed;
  }

  /**
   * Waits up to `graceMs` for the connections to end by themselves, then closes the rest (`drained`).
   * Within a shutdown's accept grace the listener still takes upgrades: the wait begins once it is over.
   */
  async drain(graceMs: number): Promise<void> {
    await acceptGraceOver(currentAcceptGrace());
    if (this.taken === 0) return;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, graceMs);
      timer.unref();
      this.drained = () => {
        clearTimeout(timer);
        resolve();
      };
    });
    for (const connection of [...this.open]) connection.close('drained');
  }
}

/** Response headers about the upstream connection that never go to the client (the 101's own Connection and Upgrade do). */
const NOT_RELAYED = new Set(['keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer']);

export interface WebSocketRelay {
  target: URL;
  /** The target URL's path, without a trailing slash, put before the request path. */
  basePath: string;
  /** How long the upstream may take to answer the handshake. */
  timeoutMs: number;
  settings: GatewayConfig['websocket'];
  connections: WebSocketConnections;
  route: string;
  subject: string | undefined;
  credentials: ConnectionCredentials;
  /** When the credential stops being accepted (a JWT's `exp` plus the clock tolerance, an API key's `expiresAt`: ms since the epoch). */
  expiresAt: number | undefined;
  /** The request failed before an answer (the upstream could not be reached, or took too long). */
  onError(error: HttpError): void;
  /** The upstream answered the handshake with 101; the bytes now flow both ways. */
  onUpgraded(): void;
}

const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * Proxies an accepted WebSocket handshake (its slot reserved in `relay.connections`) to the
 * upstream on a connection of its own (an
 * upgraded connection is never pooled). The upstream's 101 is relayed (with `Sec-WebSocket-
 * Protocol: gatehouse` added when the browser offered it and the upstream chose none: a browser
 * fails a handshake that offered protocols and got none back), then bytes flow both ways
 * untouched. Any other answer is relayed as an ordinary response on `res`, and the connection
 * closes after it. `req.headers` are the upstream's already (prepareUpstreamHeaders).
 */
export function relayWebSocket(req: IncomingMessage, res: ServerResponse, head: Buffer, relay: WebSocketRelay): void {
  const client = req.socket;
  const { target } = relay;
  const headers = { ...req.headers, host: target.host, connection: 'Upgrade', upgrade: 'websocket' };
  const request = target.protocol === 'https:' ? https.request : http.request;
  const upstreamReq = request({
    hostname: target.hostname.replace(/^\[|\]$/g, ''),
    port: target.port || (target.protocol === 'https:' ? 443 : 80),
    method: 'GET',
    path: relay.basePath + req.url,
    headers,
    agent: false,
  });
  let answered = false;
  const fail = (err: NodeJS.ErrnoException) => {
    if (answered) return;
    answered = true;
    relay.connections.release(relay.subject);
    relay.onError(upstreamError(err));
  };
  upstreamReq.setTimeout(relay.timeoutMs, () => {
    upstreamReq.destroy(
      Object.assign(new Error(`no answer to the upgrade within ${relay.timeoutMs} ms`), {
        code: 'GATEHOUSE_UPSTREAM_TIMEOUT',
      }),
    );
  });
  upstreamReq.on('error', fail);
  // The client left while the upstream was still answering.
  const clientGone = () => upstreamReq.destroy();
  client.once('close', clientGone);

  upstreamReq.on('response', (upstreamRes) => {
    // A 101 Node did not take as an upgrade (no Upgrade header) switches to nothing: no answer to relay.
    if (upstreamRes.statusCode === 101) {
      upstreamReq.destroy();
      return fail(Object.assign(new Error('101 without Upgrade: websocket'), { code: 'GATEHOUSE_BAD_UPGRADE' }));
    }
    answered = true;
    relay.connections.release(relay.subject);
    client.off('close', clientGone);
    countWebSocket('not_upgraded');
    const relayed: Record<string, string | string[]> = {};
    for (const [name, value] of Object.entries(upstreamRes.headers)) {
      if (value !== undefined && !NOT_RELAYED.has(name) && name !== 'connection' && name !== 'upgrade')
        relayed[name] = value;
    }
    res.writeHead(upstreamRes.statusCode ?? 502, relayed);
    upstreamRes.pipe(res);
  });

  upstreamReq.on('upgrade', (upstreamRes: IncomingMessage, upstream: Socket, upstreamHead: Buffer) => {
    // A 101 that does not switch to WebSocket (RFC 6455 §4.2.2: Upgrade: websocket, Connection: Upgrade) is no handshake.
    if (!isWebSocketAnswer(upstreamRes)) {
      upstream.destroy();
      return fail(Object.assign(new Error('101 without Upgrade: websocket'), { code: 'GATEHOUSE_BAD_UPGRADE' }));
    }
    answered = true;
    client.off('close', clientGone);
    upstreamReq.setTimeout(0);
    const lines = ['HTTP/1.1 101 Switching Protocols'];
    const raw = upstreamRes.rawHeaders;
    let protocolChosen = false;
    for (let i = 0; i < raw.length; i += 2) {
      const name = raw[i]!;
      const lower = name.toLowerCase();
      if (NOT_RELAYED.has(lower) || lower.startsWith('proxy-')) continue;
      if (lower === 'sec-websocket-protocol') protocolChosen = true;
      lines.push(`${name}: ${raw[i + 1]}`);
    }
    if (!protocolChosen && offeredGatehouseProtocol(req)) lines.push(`Sec-WebSocket-Protocol: ${GATEHOUSE_PROTOCOL}`);
    const requestId = res.getHeader('x-request-id');
    if (typeof requestId === 'string') lines.push(`X-Request-Id: ${requestId}`);
    client.write(`${lines.join('\r\n')}\r\n\r\n`);
    if (upstreamHead.length > 0) client.write(upstreamHead);
    if (head.length > 0) upstream.write(head);
    open(client, upstream, relay);
    relay.onUpgraded();
  });
  upstreamReq.end();
}

function isWebSocketAnswer(res: IncomingMessage): boolean {
  const { upgrade, connection } = res.headers;
  return (
    typeof upgrade === 'string' &&
    upgrade.trim().toLowerCase() === 'websocket' &&
    typeof connection === 'string' &&
    connection
      .toLowerCase()
      .split(',')
      .some((token) => token.trim() === 'upgrade')
  );
}

/** Both sockets piped, tracked and timed: idle, lifetime and credential expiry each close it. */
function open(client: Socket, upstream: Socket, relay: WebSocketRelay): void {
  const { settings, connections } = relay;
  const timers: NodeJS.Timeout[] = [];
  let closed = false;
  const connection: OpenWebSocket = {
    route: relay.route,
    subject: relay.subject,
    credentials: relay.credentials,
    close(reason) {
      countWebSocket(reason);
      finish();
    },
  };
  function finish() {
    if (closed) return;
    closed = true;
    for (const timer of timers) clearTimeout(timer);
    connections.delete(connection);
    trackWebSocket(relay.route, -1);
    client.destroy();
    upstream.destroy();
  }
  connections.add(connection);
  trackWebSocket(relay.route, 1);
  countWebSocket('accepted');
  client.setNoDelay(true);
  upstream.setNoDelay(true);
  // Activity either way is a read or a write on the client's socket: its timeout is idleness in both directions.
  client.setTimeout(settings.idleTimeout, () => connection.close('idle'));
  if (settings.maxLifetime !== undefined)
    timers.push(setTimeout(() => connection.close('lifetime'), Math.min(settings.maxLifetime, MAX_TIMER_MS)));
  if (relay.expiresAt !== undefined) {
    const at = () => {
      const left = relay.expiresAt! - Date.now();
      if (left <= 0) return connection.close('expired');
      timers.push(setTimeout(at, Math.min(left, MAX_TIMER_MS)));
    };
    at();
  }
  for (const socket of [client, upstream]) {
    socket.on('error', () => finish());
    socket.on('close', () => {
      if (!closed) countWebSocket('closed');
      finish();
    });
  }
  upstream.pipe(client);
  client.pipe(upstream);
}
