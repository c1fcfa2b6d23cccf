/**
 * WebSockets through /api/: the handshake runs the whole pipeline (a refusal is an ordinary
 * answer and the upstream sees nothing), an accepted one is relayed to a real `ws` upstream with
 * gatehouse's identity headers and without the credentials, frames flow both ways, and a
 * connection lives no longer than its credential (reload, JWT expiry), its limits or the drain.
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import { fileURLToPath } from 'node:url';
import { SignJWT } from 'jose';
import WebSocket, { WebSocketServer } from 'ws';
import { parseConfig } from '../../src/config/load.js';
import { hashApiKey } from '../../src/gateway/credentials/api-key.js';
import { startTestGatehouse, type TestGatehouse } from '../helpers/gatehouse.js';
import { request } from '../helpers/http.js';
import { waitFor } from '../helpers/wait.js';
import { startServerProcess } from '../helpers/process.js';
import { rawExchange } from '../helpers/raw-socket.js';

const KEY_A = 'ws-key-a-0123456789abcdefghijklmnopqrstuv';
const KEY_B = 'ws-key-b-0123456789abcdefghijklmnopqrstuv';
const JWT_SECRET = 'websocket-test-hs256-secret-0123456789abc';
const sign = (claims: Record<string, unknown>, expiresIn: string | number = '5m') =>
  new SignJWT(claims)
    .setProtectedHeader({ alg: 'HS256' })
    .setSubject(String(claims.sub ?? 'browser-user'))
    .setExpirationTime(expiresIn)
    .sign(new TextEncoder().encode(JWT_SECRET));

interface Handshake {
  url: string;
  headers: http.IncomingHttpHeaders;
}

/** A real WebSocket upstream (ws): echoes text, records every handshake; `/api/refuse…` paths get 403 instead of 101. */
async function startWsUpstream(options: { selectProtocol?: (offered: Set<string>) => string | false } = {}) {
  const handshakes: Handshake[] = [];
  /** Ordinary requests (not handshakes) that reached it. */
  const plain: Handshake[] = [];
  const server = http.createServer((req, res) => {
    plain.push({ url: req.url!, headers: req.headers });
    res.end('plain');
  });
  const wss = new WebSocketServer({ noServer: true, handleProtocols: options.selectProtocol ?? (() => false) });
  server.on('upgrade', (req, socket, head) => {
    handshakes.push({ url: req.url!, headers: req.headers });
    if (req.url!.includes('refuse')) {
      socket.end(
        'HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: 18\r\nx-upstream: yes\r\n\r\n{"why":"upstream"}',
      );
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) =>
      ws.on('message', (data, binary) => ws.send(binary ? data : `echo:${data.toString()}`, { binary })),
    );
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    handshakes,
    plain,
    close: () =>
      new Promise<void>((resolve) => {
        for (const client of wss.clients) client.terminate();
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

type Upstream = Awaited<ReturnType<typeof startWsUpstream>>;

/** An upstream that answers every handshake `101` without `Upgrade: websocket`, then speaks HTTP. */
async function startBadUpgradeUpstream() {
  const server = http.createServer();
  server.on('upgrade', (_req, socket) =>
    socket.end(
      'HTTP/1.1 101 Switching Protocols\r\nConnection: close\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi',
    ),
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const wsUrl = (httpUrl: string, path: string) => httpUrl.replace(/^http/, 'ws') + path;

/** Opens a client; resolves once open, rejects with the HTTP status when the handshake is refused. */
function connect(
  url: string,
  options: { headers?: Record<string, string>; protocols?: string[]; ca?: Buffer } = {},
): Promise<WebSocket> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, options.protocols ?? [], { headers: options.headers, ca: options.ca });
    ws.once('open', () => resolve(ws));
    ws.once('unexpected-response', (_req, res) =>
      reject(Object.assign(new Error(`refused ${res.statusCode}`), { status: res.statusCode })),
    );
    ws.once('error', reject);
  });
}

function echo(ws: WebSocket, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    ws.once('message', (data) => resolve(data.toString()));
    ws.once('error', reject);
    ws.send(text);
  });
}

const closed = (ws: WebSocket) =>
  new Promise<number>((resolve) =>
    ws.readyState === WebSocket.CLOSED ? resolve(0) : ws.once('close', (code) => resolve(code)),
  );

/** A raw handshake (exact bytes), for answers a WebSocket client would not show. */
const handshake = (path: string, extra = '') =>
  `GET ${path} HTTP/1.1\r\nHost: gatehouse.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n${extra}\r\n`;

function gatewayConfig(upstream: Upstream, gateway: Record<string, unknown> = {}, auth: Record<string, unknown> = {}) {
  return {
    storage: { path: './data/test.db' },
    gateway: {
      listen: { host: '127.0.0.1', port: 0 },
      upstream: { target: upstream.url, timeoutMs: 5000 },
      routes: [{ prefix: '/api/chat/', upstream: { target: upstream.url }, stripPrefix: '/api' }],
      auth: {
        apiKeys: [
          { id: 'a', hash: hashApiKey(KEY_A), scopes: ['chat'] },
          { id: 'b', hash: hashApiKey(KEY_B) },
        ],
        bearer: { jwt: { secret: JWT_SECRET, clockToleranceSeconds: 0 } },
        failures: { max: 100, windowSeconds: 60, lockoutSeconds: 60 },
        ...auth,
      },
      ...gateway,
    },
  };
}

describe('WebSockets through /api/', () => {
  let upstream: Upstream;
  let gatehouse: TestGatehouse;
  const reload = (gateway: Record<string, unknown> = {}, auth: Record<string, unknown> = {}) =>
    gatehouse.reload(parseConfig(gatewayConfig(upstream, gateway, auth)));

  before(async () => {
    upstream = await startWsUpstream();
    gatehouse = await startTestGatehouse(gatewayConfig(upstream));
  });
  after(async () => {
    await gatehouse?.close(100);
    await upstream?.close();
  });

  it('refusals come before the 101 as ordinary JSON answers, and the upstream sees no handshake', async () => {
    await reload(
      { rateLimits: [{ by: 'key', requests: 1, per: '1h', paths: ['/api/limited/**'] }] },
      {
        rules: [{ paths: ['/api/admin/**'], scopes: ['admin'] }],
        allowedIPs: ['127.0.0.0/8'],
      },
    );
    const seen = upstream.handshakes.length;
    const cases: [string, string, number, string][] = [
      ['no credential', handshake('/api/chat/room'), 401, 'missing_credentials'],
      [
        'a wrong key',
        handshake('/api/chat/room', 'X-API-Key: ws-key-x-0123456789abcdefghijklmnopqrstuv\r\n'),
        401,
        'invalid_api_key',
      ],
      ['a rule', handshake('/api/admin/live', `X-API-Key: ${KEY_A}\r\n`), 403, 'insufficient_scope'],
      ['an ambiguous path', handshake('/api/chat/%2e%2e/x', `X-API-Key: ${KEY_A}\r\n`), 400, 'invalid_path'],
      ['a rate limit (second)', handshake('/api/limited/x', `X-API-Key: ${KEY_A}\r\n`), 0, ''],
    ];
    for (const [what, bytes, status, code] of cases) {
      const exchange = await rawExchange(gatehouse.url, bytes, { idleMs: 500 });
      if (status === 0) continue; // the first limited handshake passes (and reaches the upstream)
      assert.equal(exchange.responses[0]?.status, status, `${what}: ${exchange.raw}`);
      assert.equal(JSON.parse(exchange.responses[0]!.body).error.code, code, what);
      assert.ok(exchange.closedByServer, `${what}: the connection stays open`);
    }
    assert.equal(upstream.handshakes.length, seen + 1);
    const limited = await rawExchange(gatehouse.url, handshake('/api/limited/x', `X-API-Key: ${KEY_A}\r\n`), {
      idleMs: 500,
    });
    assert.equal(limited.responses[0]?.status, 429);
    assert.match(limited.raw, /\r\nratelimit: "key";r=0;t=\d+\r\n/i);
    assert.equal(upstream.handshakes.length, seen + 1, 'a refused handshake reached the upstream');

    await reload({ websocket: { enabled: false } });
    const off = await rawExchange(gatehouse.url, handshake('/api/chat/room', `X-API-Key: ${KEY_A}\r\n`), {
      idleMs: 500,
    });
    assert.equal(off.responses[0]?.status, 501);
    assert.equal(JSON.parse(off.responses[0]!.body).error.code, 'upgrade_not_supported');
    assert.equal(upstream.handshakes.length, seen + 1);
    await reload();
  });

  it("an accepted handshake reaches the route's upstream with identity headers and without credentials; frames flow both ways", async () => {
    const ws = await connect(wsUrl(gatehouse.url, '/api/chat/room?x=1'), {
      headers: { 'x-api-key': KEY_A, 'x-gatehouse-subject': 'forged', 'x-forwarded-for': '6.6.6.6' },
    });
    try {
      const seen = upstream.handshakes.at(-1)!;
      assert.equal(seen.url, '/chat/room?x=1'); // stripPrefix "/api"
      assert.equal(seen.headers['x-gatehouse-subject'], 'a');
      assert.equal(seen.headers['x-gatehouse-key-id'], 'a');
      assert.equal(seen.headers['x-gatehouse-scopes'], 'chat');
      assert.equal(seen.headers['x-forwarded-for'], '127.0.0.1');
      assert.equal(seen.headers['x-forwarded-prefix'], '/api');
      assert.equal(seen.headers['x-api-key'], undefined);
      assert.equal(seen.headers.upgrade, 'websocket');
      assert.match(String(seen.headers['x-request-id']), /^[0-9a-f-]{36}$/);
      assert.equal(await echo(ws, 'hello'), 'echo:hello');
      const big = 'x'.repeat(200_000);
      assert.equal(await echo(ws, big), `echo:${big}`);
    } finally {
      ws.close();
      await closed(ws);
    }
    // The request line is logged when the connection ends, as 101.
    await waitFor(
      () => gatehouse.logs.some((l) => l.msg === 'request' && l.status === 101 && l.path === '/api/chat/room'),
      { what: 'the 101 request line' },
    );
  });

  it('an upstream answering without 101 is relayed as an ordinary response, and the connection closes', async () => {
    const exchange = await rawExchange(gatehouse.url, handshake('/api/refuse', `X-API-Key: ${KEY_A}\r\n`), {
      idleMs: 1000,
    });
    assert.equal(exchange.responses[0]?.status, 403, exchange.raw);
    assert.equal(exchange.responses[0]?.body, '{"why":"upstream"}');
    assert.equal(exchange.responses[0]?.headers['x-upstream'], 'yes');
    assert.ok(exchange.closedByServer);
  });

  it('an upgrade pipelined behind another request waits its turn (it crashed the process with ERR_HTTP_SOCKET_ASSIGNED)', async () => {
    const first = 'GET /healthz HTTP/1.1\r\nHost: gatehouse.test\r\n\r\n';
    const refused = await rawExchange(gatehouse.url, first + handshake('/api/chat/x'), { idleMs: 1000 });
    assert.deepEqual(
      refused.responses.map((r) => r.status),
      [200, 401],
      refused.raw,
    );
    const seen = upstream.handshakes.length;
    const accepted = await rawExchange(
      gatehouse.url,
      first + first + handshake('/api/chat/x', `X-API-Key: ${KEY_A}\r\n`),
      { idleMs: 1000 },
    );
    assert.deepEqual(
      accepted.responses.slice(0, 2).map((r) => r.status),
      [200, 200],
      accepted.raw,
    );
    assert.match(accepted.raw, /\r\n\r\nHTTP\/1\.1 101 Switching Protocols\r\n/);
    assert.equal(upstream.handshakes.length, seen + 1);
    assert.equal((await request(gatehouse.url, '/healthz')).status, 200, 'the process is still serving');
  });

  it('behind an answer that closes the connection nothing pipelined is handled, and past 16 waiting an upgrade too leaves the first answered', async () => {
    await reload({ cors: { origins: ['https://app.example.com'] } });
    const seen = upstream.handshakes.length;
    const preflight =
      'OPTIONS /api/x HTTP/1.1\r\nHost: gatehouse.test\r\nOrigin: https://app.example.com\r\nAccess-Control-Request-Method: PUT\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n';
    const hidden = `POST /api/chat/hidden HTTP/1.1\r\nHost: gatehouse.test\r\nX-API-Key: ${KEY_A}\r\nContent-Length: 4\r\n\r\nDATA`;
    for (const behind of [hidden, handshake('/api/chat/hidden-ws', `X-API-Key: ${KEY_A}\r\n`)]) {
      const exchange = await rawExchange(gatehouse.url, preflight + behind, { idleMs: 1500 });
      assert.equal(exchange.responses[0]?.status, 204, exchange.raw);
      assert.equal(exchange.responses.length, 1, exchange.raw);
    }
    assert.equal(upstream.handshakes.length, seen, 'a handshake behind the closing answer reached the upstream');
    assert.ok(
      !upstream.plain.some((r) => r.url.includes('hidden')),
      'a request behind the closing answer reached the upstream',
    );
    await reload();

    const gets = Array.from(
      { length: 17 },
      (_, i) => `GET /healthz?n=${i} HTTP/1.1\r\nHost: gatehouse.test\r\n\r\n`,
    ).join('');
    const flood = await rawExchange(gatehouse.url, gets + handshake('/api/chat/late', `X-API-Key: ${KEY_A}\r\n`), {
      idleMs: 1500,
    });
    assert.equal(flood.responses[0]?.status, 200, flood.raw);
    assert.ok(flood.closedByServer);
    assert.doesNotMatch(flood.raw, /101 Switching Protocols/);
  });

  it('another upgrade with a body is 400 (the parser stopped at its headers), and a 101 that is no WebSocket answer is 502', async () => {
    const body = 'GET /api/secret HTTP/1.1\r\nHost: x\r\n\r\n';
    const posted = await rawExchange(
      gatehouse.url,
      `POST /api/x HTTP/1.1\r\nHost: gatehouse.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nX-API-Key: ${KEY_A}\r\nContent-Length: ${body.length}\r\n\r\n${body}`,
      { idleMs: 1000 },
    );
    assert.equal(posted.responses[0]?.status, 400, posted.raw);
    assert.equal(JSON.parse(posted.responses[0]!.body).error.code, 'invalid_request');
    assert.equal(posted.responses.length, 1);
    assert.ok(!upstream.handshakes.some((h) => h.url.includes('secret')));
    const bad = await startBadUpgradeUpstream();
    try {
      await reload({ routes: [{ prefix: '/api/bad/', upstream: { target: bad.url } }] });
      const answer = await rawExchange(gatehouse.url, handshake('/api/bad/x', `X-API-Key: ${KEY_A}\r\n`), {
        idleMs: 1000,
      });
      assert.equal(answer.responses[0]?.status, 502, answer.raw);
      // A status line, not any "101": the random X-Request-Id can hold one (it did: 7f20e1e8-387e-4101-…).
      assert.doesNotMatch(answer.raw, /^HTTP\/1\.[01] 101/m);
    } finally {
      await reload();
      await bad.close();
    }
  });

  it('a browser\'s credential in Sec-WebSocket-Protocol: read, removed with the marker, and "gatehouse" answered when the upstream chooses none', async () => {
    await reload({}, { browser: { websocketProtocol: true } });
    const token = await sign({ sub: 'ana', scope: 'chat' });
    const ws = await connect(wsUrl(gatehouse.url, '/api/chat/room'), {
      protocols: ['gatehouse', `gatehouse.bearer.${token}`],
    });
    try {
      assert.equal(ws.protocol, 'gatehouse');
      const seen = upstream.handshakes.at(-1)!;
      assert.equal(seen.headers['sec-websocket-protocol'], undefined);
      assert.equal(seen.headers.authorization, undefined);
      assert.equal(seen.headers['x-gatehouse-subject'], 'ana');
      assert.equal(seen.headers['x-gatehouse-auth'], 'bearer');
      assert.equal(await echo(ws, 'hi'), 'echo:hi');
    } finally {
      ws.close();
    }
    const keyed = await connect(wsUrl(gatehouse.url, '/api/chat/room'), {
      protocols: ['gatehouse', `gatehouse.api-key.${KEY_B}`, 'chat.v2'],
    });
    keyed.close();
    assert.equal(upstream.handshakes.at(-1)!.headers['sec-websocket-protocol'], 'chat.v2');
    assert.equal(upstream.handshakes.at(-1)!.headers['x-gatehouse-key-id'], 'b');
    // A wrong credential there is refused like a wrong header, before the upstream.
    const seen = upstream.handshakes.length;
    await assert.rejects(
      connect(wsUrl(gatehouse.url, '/api/chat/room'), {
        protocols: ['gatehouse', 'gatehouse.api-key.ws-key-x-0123456789abcdefghijklmnopqrstuv'],
      }),
      { status: 401 },
    );
    assert.equal(upstream.handshakes.length, seen);
    await reload();
    // Off: the same offer is no credential at all.
    await assert.rejects(
      connect(wsUrl(gatehouse.url, '/api/chat/room'), { protocols: ['gatehouse', `gatehouse.api-key.${KEY_B}`] }),
      { status: 401 },
    );
  });

  it('queryParameter: a credential on GET (WebSocket and plain), removed from the URL and never logged; not read on POST', async () => {
    await reload({}, { browser: { queryParameter: 'access_token' } });
    const ws = await connect(wsUrl(gatehouse.url, `/api/chat/feed?a=1&access_token=${KEY_B}&b=2`));
    ws.close();
    assert.equal(upstream.handshakes.at(-1)!.url, '/chat/feed?a=1&b=2');
    assert.equal(upstream.handshakes.at(-1)!.headers['x-gatehouse-key-id'], 'b');
    const token = await sign({ sub: 'sse-reader' });
    const plain = await request(gatehouse.url, `/api/events?access_token=${token}`);
    assert.equal(plain.status, 200);
    assert.equal(
      (await request(gatehouse.url, `/api/events?access_token=${KEY_B}`, { method: 'POST', body: '' })).status,
      401,
    );
    assert.equal((await request(gatehouse.url, `/api/events?access_token=${KEY_B}&access_token=${KEY_B}`)).status, 400);
    await waitFor(() => gatehouse.logs.filter((l) => l.msg === 'request' && l.path === '/api/events').length >= 3, {
      what: 'three request lines',
    });
    assert.equal(gatehouse.logText().includes(KEY_B), false, 'the query credential reached the log');
    assert.equal(gatehouse.logText().includes(token), false, 'the query token reached the log');
    await reload();
  });

  it('a reload that removes a key, or a rule that now refuses, closes its connections within a second; others stay', async () => {
    const a = await connect(wsUrl(gatehouse.url, '/api/chat/a'), { headers: { 'x-api-key': KEY_A } });
    const b = await connect(wsUrl(gatehouse.url, '/api/chat/b'), { headers: { 'x-api-key': KEY_B } });
    const started = Date.now();
    await reload({}, { apiKeys: [{ id: 'b', hash: hashApiKey(KEY_B) }] });
    await closed(a);
    assert.ok(Date.now() - started < 1_000, `closed after ${Date.now() - started} ms`);
    assert.equal(await echo(b, 'still'), 'echo:still');
    await reload(
      {},
      { apiKeys: [{ id: 'b', hash: hashApiKey(KEY_B) }], rules: [{ paths: ['/api/chat/**'], scopes: ['chat'] }] },
    );
    await closed(b);
    await reload();
  });

  it('a connection opened with a JWT is closed when the token expires', async () => {
    const token = await sign({ sub: 'short' }, Math.floor(Date.now() / 1000) + 2);
    const ws = await connect(wsUrl(gatehouse.url, '/api/chat/x'), { headers: { authorization: `Bearer ${token}` } });
    const opened = Date.now();
    await closed(ws);
    const lasted = Date.now() - opened;
    assert.ok(lasted > 500 && lasted < 3_200, `lasted ${lasted} ms`);
  });

  it("a connection opened with an API key is closed when the key's expiresAt passes", async () => {
    const expiresAt = new Date(Date.now() + 1_500).toISOString();
    await reload(
      {},
      {
        apiKeys: [
          { id: 'a', hash: hashApiKey(KEY_A), expiresAt },
          { id: 'b', hash: hashApiKey(KEY_B) },
        ],
      },
    );
    const ws = await connect(wsUrl(gatehouse.url, '/api/chat/k'), { headers: { 'x-api-key': KEY_A } });
    await closed(ws);
    assert.ok(
      Date.now() >= Date.parse(expiresAt) - 50 && Date.now() < Date.parse(expiresAt) + 1_000,
      `closed at ${new Date().toISOString()}, key expired ${expiresAt}`,
    );
    await reload();
  });

  it('limits: maxConnections (503), maxConnectionsPerSubject (429), idleTimeout and maxLifetime close', async () => {
    await reload({ websocket: { maxConnections: 2, maxConnectionsPerSubject: 1 } });
    const first = await connect(wsUrl(gatehouse.url, '/api/chat/1'), { headers: { 'x-api-key': KEY_A } });
    await assert.rejects(connect(wsUrl(gatehouse.url, '/api/chat/2'), { headers: { 'x-api-key': KEY_A } }), {
      status: 429,
    });
    const second = await connect(wsUrl(gatehouse.url, '/api/chat/3'), { headers: { 'x-api-key': KEY_B } });
    const seen = upstream.handshakes.length;
    await assert.rejects(
      connect(wsUrl(gatehouse.url, '/api/chat/4'), {
        headers: { authorization: `Bearer ${await sign({ sub: 'third' })}` },
      }),
      { status: 503 },
    );
    assert.equal(upstream.handshakes.length, seen);
    first.close();
    second.close();
    await Promise.all([closed(first), closed(second)]);

    await reload({ websocket: { idleTimeout: '600ms', maxLifetime: '2s' } });
    const idle = await connect(wsUrl(gatehouse.url, '/api/chat/idle'), { headers: { 'x-api-key': KEY_A } });
    const busy = await connect(wsUrl(gatehouse.url, '/api/chat/busy'), { headers: { 'x-api-key': KEY_B } });
    const opened = Date.now();
    const chatter = setInterval(() => busy.readyState === WebSocket.OPEN && busy.send('tick'), 200);
    try {
      await closed(idle);
      const idleFor = Date.now() - opened;
      assert.ok(idleFor >= 400 && idleFor < 1_500, `idle connection closed after ${idleFor} ms`);
      await closed(busy);
      const busyFor = Date.now() - opened;
      assert.ok(busyFor >= 1_800 && busyFor < 3_000, `busy connection closed after ${busyFor} ms (lifetime 2 s)`);
    } finally {
      clearInterval(chatter);
    }
    await reload();
  });

  it('metrics: open connections by route, and outcomes (accepted, refused, revoked)', async () => {
    const other = await startTestGatehouse({
      ...gatewayConfig(upstream),
      admin: { listen: { host: '127.0.0.1', port: 0 } },
    });
    try {
      const scrape = async () => (await request(other.admin!.url, '/metrics')).body;
      const ws = await connect(wsUrl(other.url, '/api/chat/m'), { headers: { 'x-api-key': KEY_A } });
      await assert.rejects(connect(wsUrl(other.url, '/api/chat/m')), { status: 401 });
      let text = await scrape();
      assert.match(text, /^gatehouse_websocket_connections\{route="\/api\/chat\/"\} 1$/m);
      assert.match(text, /^gatehouse_websocket_connections_total\{outcome="accepted"\} 1$/m);
      assert.match(text, /^gatehouse_websocket_connections_total\{outcome="refused_missing_credentials"\} 1$/m);
      await other.reload(
        parseConfig({
          ...gatewayConfig(upstream, {}, { apiKeys: [{ id: 'b', hash: hashApiKey(KEY_B) }] }),
          admin: { listen: { host: '127.0.0.1', port: 0 } },
        }),
      );
      await closed(ws);
      text = await waitFor(
        async () => {
          const now = await scrape();
          return /^gatehouse_websocket_connections\{route="\/api\/chat\/"\} 0$/m.test(now) && now;
        },
        { what: 'the gauge back at 0' },
      );
      assert.match(text, /^gatehouse_websocket_connections_total\{outcome="revoked"\} 1$/m);
    } finally {
      await other.close(100);
    }
  });

  it('a drain closes open connections at the end of its window, not later', async () => {
    const other = await startTestGatehouse(gatewayConfig(upstream));
    const ws = await connect(wsUrl(other.url, '/api/chat/drain'), { headers: { 'x-api-key': KEY_A } });
    const started = Date.now();
    await other.close(700);
    await closed(ws);
    const took = Date.now() - started;
    assert.ok(took >= 600 && took < 2_000, `drain took ${took} ms`);
  });
});

describe('WebSockets with gateway.workers and TLS', () => {
  it('two workers behind TLS relay frames, and a reload revokes a key in every worker', async () => {
    const upstream = await startWsUpstream();
    const fixtures = fileURLToPath(new URL('../fixtures/tls/', import.meta.url));
    const ca = readFileSync(`${fixtures}cert.pem`);
    const { mkdtempSync, writeFileSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const path = await import('node:path');
    const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-ws-workers-'));
    const file = path.join(dir, 'gatehouse.json5');
    const write = (keys: unknown[]) =>
      writeFileSync(
        file,
        JSON.stringify({
          storage: { path: path.join(dir, 'g.db') },
          gateway: {
            listen: { host: '127.0.0.1', port: 0 },
            workers: 2,
            upstream: { target: upstream.url },
            tls: { cert: `${fixtures}cert.pem`, key: `${fixtures}key.pem` },
            auth: { apiKeys: keys },
          },
        }),
      );
    write([
      { id: 'a', hash: hashApiKey(KEY_A) },
      { id: 'b', hash: hashApiKey(KEY_B) },
    ]);
    const server = startServerProcess(file);
    try {
      const { url } = await server.waitFor((l) => l.msg === 'gateway workers listening');
      const base = url.replace('127.0.0.1', 'localhost').replace(/^https/, 'wss');
      const open = async (key: string) => connect(`${base}/api/chat/room`, { headers: { 'x-api-key': key }, ca });
      const as = await Promise.all([open(KEY_A), open(KEY_A), open(KEY_A), open(KEY_A)]);
      const b = await open(KEY_B);
      for (const ws of as) assert.equal(await echo(ws, 'tls'), 'echo:tls');
      write([{ id: 'b', hash: hashApiKey(KEY_B) }]);
      server.child.kill('SIGHUP');
      await Promise.all(as.map(closed));
      assert.equal(await echo(b, 'kept'), 'echo:kept');
      b.close();
    } finally {
      await server.stop();
      await upstream.close();
    }
  });
});
