import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startTestGatehouse, testConfig, TEST_PLAIN_KEY, type TestGatehouse } from '../helpers/gatehouse.js';
import { runCli } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// gateway.cors against a running gatehouse, on raw sockets so every header line that comes back
// is seen (a repeated Access-Control-Allow-Origin included): preflights answered at the edge
// before the lockout and credentials, CORS headers on gatehouse's own refusals, the upstream's
// Access-Control-* replaced, route overrides, and requests without Origin left exactly as they were.

const APP = 'https://app.example.com';
const MAX_FAILURES = 3;

interface Answer {
  status: number;
  /** Every header line, in order, names lower-cased. */
  lines: [string, string][];
  body: string;
  /** The one value of a header; fails the test when it is repeated. */
  get(name: string): string | undefined;
  /** The names of the Access-Control-* headers, sorted. */
  cors(): string[];
}

/** One request written as given (CRLF added), with `Connection: close`; the answer as it came. */
function exchange(baseUrl: string, head: string[], options: { localAddress?: string } = {}): Promise<Answer> {
  const url = new URL(baseUrl);
  return new Promise((resolve, reject) => {
    const socket = net.connect({ host: url.hostname, port: Number(url.port), localAddress: options.localAddress });
    const chunks: Buffer[] = [];
    socket.on('data', (d: Buffer) => chunks.push(d));
    socket.on('error', reject);
    socket.on('close', () => {
      const raw = Buffer.concat(chunks).toString('latin1');
      const end = raw.indexOf('\r\n\r\n');
      const [statusLine, ...headerLines] = raw.slice(0, end).split('\r\n');
      const lines = headerLines.map((line): [string, string] => [
        line.slice(0, line.indexOf(':')).toLowerCase(),
        line.slice(line.indexOf(':') + 1).trim(),
      ]);
      resolve({
        status: Number(/^HTTP\/1\.1 (\d{3})/.exec(statusLine ?? '')?.[1] ?? 0),
        lines,
        body: raw.slice(end + 4),
        get(name) {
          const values = lines.filter(([n]) => n === name).map(([, v]) => v);
          assert.ok(values.length <= 1, `${name} repeated: ${values.join(' | ')}`);
          return values[0];
        },
        cors: () =>
          lines
            .map(([n]) => n)
            .filter((n) => n.startsWith('access-control-'))
            .sort(),
      });
    });
    socket.write([...head, `Host: ${url.host}`, 'Connection: close', '', ''].join('\r\n'));
  });
}

const preflight = (target: string, origin: string, method = 'PUT', requestHeaders?: string, extra: string[] = []) => [
  `OPTIONS ${target} HTTP/1.1`,
  `Origin: ${origin}`,
  `Access-Control-Request-Method: ${method}`,
  ...(requestHeaders === undefined ? [] : [`Access-Control-Request-Headers: ${requestHeaders}`]),
  ...extra,
];

describe('cors: a browser app on another origin, at the edge', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  /** The same config without any cors: what a request without Origin must get byte for byte. */
  let plain: TestGatehouse;

  before(async () => {
    // An upstream that does CORS its own way: gatehouse's answer must replace it where it handles CORS.
    upstream = await startRecordingUpstream((_req, res) => {
      res.writeHead(200, {
        'content-type': 'application/json',
        'access-control-allow-origin': '*',
        'access-control-allow-credentials': 'true',
        'access-control-expose-headers': 'X-Internal',
        vary: 'Accept-Encoding',
        etag: '"v1"',
        'x-upstream': 'yes',
      });
      res.end('{"ok":true}');
    });
    const gateway = (cors: Record<string, unknown> | undefined) =>
      testConfig(upstream.url, {
        gateway: {
          auth: {
            failures: { max: MAX_FAILURES, windowSeconds: 60, lockoutSeconds: 60 },
            rules: [{ paths: ['/api/admin/**'], scopes: ['admin'] }],
          },
          rateLimits: [{ by: 'ip', requests: 1, per: '1h', paths: ['/api/limited/**'] }],
          routes: [
            { prefix: '/api/public/', upstream: { target: upstream.url }, ...(cors && { cors: { origins: ['*'] } }) },
            { prefix: '/api/own/', upstream: { target: upstream.url }, ...(cors && { cors: false }) },
          ],
          cors,
        },
      });
    gatehouse = await startTestGatehouse(
      gateway({
        origins: [APP, 'https://*.example.com', 'http://localhost:5173'],
        credentials: true,
        maxAge: '5m',
        exposeHeaders: ['ETag'],
      }),
    );
    plain = await startTestGatehouse(gateway(undefined));
  });
  after(async () => {
    await gatehouse?.close();
    await plain?.close();
    await upstream?.close();
  });

  it('a preflight from an allowed origin: 204 with exactly the CORS headers, reaching neither the upstream nor the credentials', async () => {
    const seen = upstream.received.length;
    const answer = await exchange(
      gatehouse.url,
      preflight('/api/orders/7', APP, 'PUT', 'content-type,x-api-key,x-trace'),
    );
    assert.equal(answer.status, 204);
    assert.deepEqual(answer.cors(), [
      'access-control-allow-credentials',
      'access-control-allow-headers',
      'access-control-allow-methods',
      'access-control-allow-origin',
      'access-control-max-age',
    ]);
    assert.equal(answer.get('access-control-allow-origin'), APP);
    assert.equal(answer.get('access-control-allow-methods'), 'GET, HEAD, POST, PUT, PATCH, DELETE');
    assert.equal(answer.get('access-control-allow-headers'), 'Authorization, X-API-Key, content-type, x-trace');
    assert.equal(answer.get('access-control-max-age'), '300');
    assert.equal(answer.get('access-control-allow-credentials'), 'true');
    assert.equal(answer.get('vary'), 'Origin');
    assert.ok(answer.get('x-request-id'));
    assert.equal(answer.get('www-authenticate'), undefined);
    assert.equal(answer.body, '');
    assert.equal(upstream.received.length, seen, 'the upstream saw the preflight');
    const line = gatehouse.logs.findLast((l) => l.msg === 'request' && l.method === 'OPTIONS')!;
    assert.equal(line.status, 204);
  });

  it('a direct subdomain of a wildcard is allowed; look-alikes get 403 cors_origin_not_allowed without any Access-Control-* header', async () => {
    const sub = await exchange(gatehouse.url, preflight('/api/x', 'https://eu.example.com'));
    assert.equal(sub.status, 204);
    assert.equal(sub.get('access-control-allow-origin'), 'https://eu.example.com');
    const seen = upstream.received.length;
    for (const origin of [
      'https://evil-example.com',
      'https://app.example.com.evil.com',
      'https://a.b.example.com',
      'http://app.example.com',
      'https://app.example.com:8443',
      'null',
      'http://localhost:5174',
    ]) {
      const answer = await exchange(gatehouse.url, preflight('/api/x', origin));
      assert.equal(answer.status, 403, origin);
      assert.equal(JSON.parse(answer.body).error.code, 'cors_origin_not_allowed');
      assert.deepEqual(answer.cors(), [], origin);
      assert.equal(answer.get('vary'), 'Origin', origin);
    }
    assert.equal(upstream.received.length, seen);
  });

  it('preflights with bad, missing or any credentials never count toward the lockout', async () => {
    const from = '127.0.0.3';
    for (let i = 0; i < MAX_FAILURES * 3; i++) {
      const extra =
        i % 3 === 0
          ? ['X-API-Key: wrong-key-wrong-key-wrong-key-0000']
          : i % 3 === 1
            ? ['Authorization: Bearer not.a.jwt']
            : [];
      const answer = await exchange(gatehouse.url, preflight('/api/x', APP, 'DELETE', 'x-api-key', extra), {
        localAddress: from,
      });
      assert.equal(answer.status, 204, `preflight ${i}`);
      const refused = await exchange(
        gatehouse.url,
        preflight('/api/x', 'https://evil.test', 'DELETE', 'x-api-key', extra),
        { localAddress: from },
      );
      assert.equal(refused.status, 403, `refused preflight ${i}`);
    }
    const real = await exchange(
      gatehouse.url,
      ['GET /api/after-preflights HTTP/1.1', `Origin: ${APP}`, `X-API-Key: ${TEST_PLAIN_KEY}`],
      { localAddress: from },
    );
    assert.equal(real.status, 200, 'the client was locked out by preflights');
  });

  it('a preflight for a method outside `methods` is answered 204 without it (the browser refuses the request)', async () => {
    const answer = await exchange(gatehouse.url, preflight('/api/x', APP, 'PROPFIND'));
    assert.equal(answer.status, 204);
    assert.doesNotMatch(answer.get('access-control-allow-methods')!, /PROPFIND/);
  });

  it("an allowed origin's request reaches the upstream; the upstream's Access-Control-* are replaced by gatehouse's, Vary keeps Origin", async () => {
    const answer = await exchange(gatehouse.url, [
      'GET /api/orders HTTP/1.1',
      `Origin: ${APP}`,
      `X-API-Key: ${TEST_PLAIN_KEY}`,
    ]);
    assert.equal(answer.status, 200);
    assert.deepEqual(answer.cors(), [
      'access-control-allow-credentials',
      'access-control-allow-origin',
      'access-control-expose-headers',
    ]);
    assert.equal(answer.get('access-control-allow-origin'), APP);
    assert.equal(answer.get('access-control-allow-credentials'), 'true');
    assert.equal(
      answer.get('access-control-expose-headers'),
      'RateLimit, RateLimit-Policy, Retry-After, X-Request-Id, ETag',
    );
    assert.equal(answer.get('vary'), 'Accept-Encoding, Origin');
    assert.equal(answer.get('x-upstream'), 'yes');
    assert.equal(upstream.received.at(-1)!.headers.origin, APP, 'the upstream sees the Origin');
  });

  it("gatehouse's own 400, 401, 403 and 429 to an allowed origin carry the CORS headers, so the page can read why", async () => {
    const expectCors = (answer: Answer, status: number, code: string) => {
      assert.equal(answer.status, status, code);
      assert.equal(JSON.parse(answer.body).error.code, code);
      assert.equal(answer.get('access-control-allow-origin'), APP, code);
      assert.equal(
        answer.get('access-control-expose-headers'),
        'RateLimit, RateLimit-Policy, Retry-After, X-Request-Id, ETag',
        code,
      );
      assert.equal(answer.get('access-control-allow-credentials'), 'true', code);
      assert.equal(answer.get('vary'), 'Origin', code);
    };
    const seen = upstream.received.length;
    expectCors(
      await exchange(gatehouse.url, ['GET /api/orders HTTP/1.1', `Origin: ${APP}`]),
      401,
      'missing_credentials',
    );
    expectCors(
      await exchange(gatehouse.url, [
        'GET /api/admin/users HTTP/1.1',
        `Origin: ${APP}`,
        `X-API-Key: ${TEST_PLAIN_KEY}`,
      ]),
      403,
      'insufficient_scope',
    );
    expectCors(await exchange(gatehouse.url, ['GET /api/a/../b HTTP/1.1', `Origin: ${APP}`]), 400, 'invalid_path');
    // A preflight for a path the gate refuses is that refusal, not a 204 (a browser reads a failed preflight as a network error).
    const badPreflight = await exchange(gatehouse.url, preflight('/api/a/../b', APP));
    assert.equal(badPreflight.status, 400);
    assert.equal(JSON.parse(badPreflight.body).error.code, 'invalid_path');

    const from = '127.0.0.4';
    const first = await exchange(
      gatehouse.url,
      ['GET /api/limited/1 HTTP/1.1', `Origin: ${APP}`, `X-API-Key: ${TEST_PLAIN_KEY}`],
      { localAddress: from },
    );
    assert.equal(first.status, 200);
    const limited = await exchange(
      gatehouse.url,
      ['GET /api/limited/1 HTTP/1.1', `Origin: ${APP}`, `X-API-Key: ${TEST_PLAIN_KEY}`],
      { localAddress: from },
    );
    expectCors(limited, 429, 'rate_limited');
    assert.ok(limited.get('ratelimit') && limited.get('ratelimit-policy') && limited.get('retry-after'));

    const locked = '127.0.0.5';
    for (let i = 0; i < MAX_FAILURES; i++) {
      const wrong = await exchange(
        gatehouse.url,
        ['GET /api/orders HTTP/1.1', `Origin: ${APP}`, 'X-API-Key: wrong-key-wrong-key-wrong-key-0000'],
        { localAddress: locked },
      );
      expectCors(wrong, 401, 'invalid_api_key');
    }
    const lockedOut = await exchange(
      gatehouse.url,
      ['GET /api/orders HTTP/1.1', `Origin: ${APP}`, `X-API-Key: ${TEST_PLAIN_KEY}`],
      { localAddress: locked },
    );
    expectCors(lockedOut, 429, 'too_many_failures');
    assert.ok(lockedOut.get('retry-after'));
    // A locked-out client's preflight is still answered: its real request then gets the readable 429.
    assert.equal((await exchange(gatehouse.url, preflight('/api/orders', APP), { localAddress: locked })).status, 204);
    assert.equal(upstream.received.length, seen + 1, 'only the first limited request reached the upstream');
  });

  it('a request from an origin not allowed goes through the pipeline as usual, without any Access-Control-* header', async () => {
    const answer = await exchange(gatehouse.url, [
      'GET /api/orders HTTP/1.1',
      'Origin: https://evil.test',
      `X-API-Key: ${TEST_PLAIN_KEY}`,
    ]);
    assert.equal(answer.status, 200);
    assert.deepEqual(answer.cors(), [], 'the upstream\'s "*" would let the page read it');
    assert.equal(answer.get('vary'), 'Accept-Encoding, Origin');
    const refused = await exchange(gatehouse.url, ['GET /api/orders HTTP/1.1', 'Origin: https://evil.test']);
    assert.equal(refused.status, 401);
    assert.deepEqual(refused.cors(), []);
  });

  it('an OPTIONS without Access-Control-Request-Method is an ordinary request: credentials, then the upstream', async () => {
    const refused = await exchange(gatehouse.url, ['OPTIONS /api/orders HTTP/1.1', `Origin: ${APP}`]);
    assert.equal(refused.status, 401);
    assert.equal(refused.get('access-control-allow-origin'), APP);
    const seen = upstream.received.length;
    const passed = await exchange(gatehouse.url, [
      'OPTIONS /api/orders HTTP/1.1',
      `Origin: ${APP}`,
      `X-API-Key: ${TEST_PLAIN_KEY}`,
    ]);
    assert.equal(passed.status, 200);
    assert.equal(upstream.received.length, seen + 1);
    assert.equal(upstream.received.at(-1)!.method, 'OPTIONS');
    assert.equal(passed.get('access-control-allow-origin'), APP);
  });

  it('a route\'s cors replaces gateway.cors: "*" answers any page with "*", false leaves CORS to the upstream', async () => {
    const open = await exchange(
      gatehouse.url,
      preflight('/api/public/feed', 'https://anyone.test', 'GET', 'x-api-key'),
    );
    assert.equal(open.status, 204);
    assert.equal(open.get('access-control-allow-origin'), '*');
    assert.equal(
      open.get('access-control-allow-credentials'),
      undefined,
      "gateway.cors's credentials do not carry over",
    );
    assert.equal(open.get('access-control-max-age'), '600');

    const seen = upstream.received.length;
    const own = await exchange(gatehouse.url, preflight('/api/own/x', APP));
    assert.equal(own.status, 401, 'with cors: false a preflight is an ordinary OPTIONS');
    assert.deepEqual(own.cors(), []);
    const ownPassed = await exchange(gatehouse.url, [
      'GET /api/own/x HTTP/1.1',
      `Origin: ${APP}`,
      `X-API-Key: ${TEST_PLAIN_KEY}`,
    ]);
    assert.equal(ownPassed.get('access-control-allow-origin'), '*', "the upstream's own header passes");
    assert.equal(ownPassed.get('vary'), 'Accept-Encoding');
    assert.equal(upstream.received.length, seen + 1);
  });

  it('a preflight outside /api/ is 404 as before, with no CORS headers', async () => {
    const answer = await exchange(gatehouse.url, preflight('/other', APP));
    assert.equal(answer.status, 404);
    assert.deepEqual(answer.cors(), []);
  });

  it('without Origin, every answer is byte for byte what a gatehouse without cors sends', async () => {
    const strip = (answer: Answer) => answer.lines.filter(([name]) => name !== 'date');
    for (const head of [
      ['GET /api/orders HTTP/1.1', `X-API-Key: ${TEST_PLAIN_KEY}`, 'X-Request-Id: same-1'],
      ['GET /api/orders HTTP/1.1', 'X-Request-Id: same-2'],
      ['OPTIONS /api/orders HTTP/1.1', 'Access-Control-Request-Method: PUT', 'X-Request-Id: same-3'],
      ['GET /api/public/x HTTP/1.1', `X-API-Key: ${TEST_PLAIN_KEY}`, 'X-Request-Id: same-4'],
      ['GET /api/a/../b HTTP/1.1', 'X-Request-Id: same-5'],
    ]) {
      const [withCors, without] = await Promise.all([exchange(gatehouse.url, head), exchange(plain.url, head)]);
      assert.deepEqual(strip(withCors), strip(without), head[0]);
      assert.equal(withCors.status, without.status);
      assert.equal(withCors.body, without.body);
    }
  });
});

describe('cors: config check', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-cors-'));
  const write = (name: string, cors: string) => {
    const file = path.join(dir, name);
    writeFileSync(
      file,
      `{ storage: { path: "./data.db" }, gateway: { upstream: { target: "http://127.0.0.1:3000" }, auth: { apiKey: "${TEST_PLAIN_KEY}" }, cors: ${cors} } }`,
    );
    return file;
  };

  it('refuses "*" with credentials (exit 1, the path named) and warns on a plain-http origin that is not loopback', async () => {
    const refused = await runCli([
      'config',
      'check',
      '--config',
      write('star.json5', '{ origins: ["*"], credentials: true }'),
    ]);
    assert.equal(refused.code, 1, refused.stderr);
    assert.match(refused.stderr, /gateway\.cors\.origins\[0\]: "\*" cannot be combined with credentials/);
    const warned = await runCli([
      'config',
      'check',
      '--config',
      write('http.json5', '{ origins: ["http://app.example.com", "http://localhost:5173"] }'),
    ]);
    assert.equal(warned.code, 0, warned.stderr);
    assert.match(warned.stderr, /^warning: gateway\.cors\.origins\[0\]: "http:\/\/app\.example\.com" is plain http/m);
    assert.doesNotMatch(warned.stderr, /origins\[1\]/);
  });
});
