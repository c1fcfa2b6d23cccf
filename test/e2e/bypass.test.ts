import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { startTestGatehouse, testConfig, TEST_PLAIN_KEY, type TestGatehouse } from '../helpers/gatehouse.js';
import { rawRequest, request } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

/*
 * The bypass battery: every trick here must leave the upstream untouched.
 * Each case asserts both the status and that the upstream received nothing.
 */

const key = { 'x-api-key': TEST_PLAIN_KEY };

describe('bypass: ambiguous paths never reach the upstream, even with a valid key', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  before(async () => {
    upstream = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(testConfig(upstream.url));
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  const cases: [string, number][] = [
    ['/x/../api/s', 404],
    ['/x/%2e%2e/api/s', 404],
    ['//api/s', 404],
    ['/%61pi/s', 404],
    ['/API/s', 404],
    ['/api%2fs', 404],
    ['/api;/s', 404],
    ['/api', 404],
    ['/api/%2e%2e/admin', 400],
    ['/api/%2E%2E/admin', 400],
    ['/api/../admin', 400],
    ['/api/./admin', 400],
    ['/api/a%2fb', 400],
    ['/api/a%5cb', 400],
    ['/api/a\\b', 400],
    ['/api/a%00b', 400],
    ['/api/a;jsessionid=1', 400],
    ['/api/a//b', 400],
    ['/api/%252e%252e/admin', 400],
    ['http://evil.example/api/s', 404],
    // Overlong UTF-8 dots and slashes: some decoders still read them as `.` and `/`.
    ['/api/%c0%ae%c0%ae/admin', 400],
    ['/api/%C0%AF/admin', 400],
    ['/api/%e0%80%ae/admin', 400],
    ['/api/%f0%80%80%ae/admin', 400],
    // A fragment is never sent; a `#` in the query is read differently by different servers.
    ['/api/s?a=1#/../admin', 400],
  ];
  for (const [path, status] of cases) {
    it(`${path} → ${status}`, async () => {
      const reply = await rawRequest(
        gatehouse.url,
        `GET ${path} HTTP/1.1\r\nHost: gatehouse\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\n\r\n`,
      );
      assert.equal(reply.status, status, reply.raw);
      assert.equal(JSON.parse(reply.body).error.code, status === 404 ? 'not_found' : 'invalid_path');
      assert.equal(upstream.received.length, 0);
    });
  }
});

describe('bypass: credentials', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  before(async () => {
    upstream = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(testConfig(upstream.url, { gateway: { auth: { failures: { max: 1000 } } } }));
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  const attempts: [string, string, Record<string, string> | [string, string][]][] = [
    ['key in the query string', `/api/s?api_key=${TEST_PLAIN_KEY}&apikey=${TEST_PLAIN_KEY}&key=${TEST_PLAIN_KEY}`, {}],
    ['key as an underscore header', '/api/s', { x_api_key: TEST_PLAIN_KEY }],
    [
      'the key twice',
      '/api/s',
      [
        ['X-API-Key', TEST_PLAIN_KEY],
        ['X-API-Key', TEST_PLAIN_KEY],
      ],
    ],
    ['an empty key', '/api/s', { 'x-api-key': '' }],
    ['a blank key', '/api/s', { 'x-api-key': '   ' }],
    ['the key with a suffix', '/api/s', { 'x-api-key': `${TEST_PLAIN_KEY}x` }],
    ['a gth_ key with a bad checksum', '/api/s', { 'x-api-key': 'gth_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA' }],
    ['a bearer token that is not a JWT', '/api/s', { authorization: `Bearer ${TEST_PLAIN_KEY}` }],
    ['forged identity headers alone', '/api/s', { 'x-gatehouse-auth': 'api-key', 'x-gatehouse-subject': 'admin' }],
  ];
  for (const [name, path, headers] of attempts) {
    it(`${name}: 401, upstream untouched`, async () => {
      const reply = await request(gatehouse.url, path, { headers });
      assert.equal(reply.status, 401);
      assert.ok(['missing_credentials', 'invalid_api_key', 'invalid_token'].includes(reply.json().error.code));
      assert.match(reply.headers['www-authenticate'] as string, /^Bearer realm="gatehouse"/);
      assert.equal(upstream.received.length, 0);
    });
  }

  it('missing and wrong keys answer with the same body shape', async () => {
    const missing = await request(gatehouse.url, '/api/s');
    const wrong = await request(gatehouse.url, '/api/s', { headers: { 'x-api-key': 'x'.repeat(40) } });
    assert.deepEqual(Object.keys(missing.json().error), ['code', 'message']);
    assert.deepEqual(Object.keys(wrong.json().error), ['code', 'message']);
    assert.equal(missing.headers['content-type'], wrong.headers['content-type']);
  });

  it('client-sent identity headers (any case, _ variants) are replaced, never forwarded', async () => {
    const reply = await request(gatehouse.url, '/api/s', {
      headers: [
        ['X-API-Key', TEST_PLAIN_KEY],
        ['X-Gatehouse-Subject', 'admin'],
        ['x-gatehouse-auth', 'bearer'],
        ['X_GATEHOUSE_SUBJECT', 'admin'],
        ['x-gatehouse-key-id', 'root'],
        ['X-Gatehouse-Role', 'admin'],
        ['X-Real-IP', '10.1.1.1'],
        ['Forwarded', 'for=10.1.1.1'],
        ['X-Forwarded-For', '10.1.1.1'],
        ['X-Forwarded-Host', 'admin.internal'],
        ['X-Forwarded-Proto', 'https'],
      ],
    });
    assert.equal(reply.status, 200);
    const got = upstream.received.at(-1)!;
    assert.equal(got.headers['x-gatehouse-subject'], 'default');
    assert.equal(got.headers['x-gatehouse-auth'], 'api-key');
    assert.equal(got.headers['x-gatehouse-key-id'], 'default');
    assert.equal(got.headers['x-gatehouse-role'], undefined);
    assert.equal(got.headers['x_gatehouse_subject'], undefined);
    assert.equal(got.headers['x-real-ip'], undefined);
    assert.equal(got.headers.forwarded, undefined);
    assert.equal(got.headers['x-forwarded-for'], '127.0.0.1');
    assert.equal(got.headers['x-forwarded-proto'], 'http');
    assert.notEqual(got.headers['x-forwarded-host'], 'admin.internal');
    // Exactly one of each identity header went up.
    const names = got.rawHeaders.filter((_, i) => i % 2 === 0).map((n) => n.toLowerCase().replace(/_/g, '-'));
    assert.equal(names.filter((n) => n === 'x-gatehouse-subject').length, 1);
    upstream.received.length = 0;
  });
});

describe('bypass: client IP and allowedIPs', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  before(async () => {
    upstream = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(
      testConfig(upstream.url, { gateway: { auth: { allowedIPs: ['127.0.0.1', '10.0.0.0/8', '::1'] } } }),
    );
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  it('a client outside allowedIPs gets 403 even with a valid key', async () => {
    const reply = await request(gatehouse.url, '/api/s', { headers: key, localAddress: '127.0.0.2' });
    assert.equal(reply.status, 403);
    assert.equal(reply.json().error.code, 'ip_not_allowed');
    assert.equal(upstream.received.length, 0);
  });

  for (const header of [
    'x-forwarded-for',
    'x-real-ip',
    'forwarded',
    'x-client-ip',
    'true-client-ip',
    'cf-connecting-ip',
  ]) {
    it(`${header} from an untrusted peer is not believed`, async () => {
      const value = header === 'forwarded' ? 'for=127.0.0.1' : '127.0.0.1';
      const reply = await request(gatehouse.url, '/api/s', {
        headers: { ...key, [header]: value },
        localAddress: '127.0.0.2',
      });
      assert.equal(reply.status, 403);
      assert.equal(upstream.received.length, 0);
    });
  }

  it('allowed client with a spoofed X-Forwarded-For: upstream sees the real address only', async () => {
    const reply = await request(gatehouse.url, '/api/s', { headers: { ...key, 'x-forwarded-for': '10.9.9.9' } });
    assert.equal(reply.status, 200);
    assert.equal(upstream.received.at(-1)!.headers['x-forwarded-for'], '127.0.0.1');
    upstream.received.length = 0;
  });
});

describe('bypass: IPv4-mapped IPv6 and a dual-stack listener', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  before(async () => {
    upstream = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(
      testConfig(upstream.url, {
        gateway: { listen: { host: '::' }, auth: { allowedIPs: ['::ffff:127.0.0.1'] } },
      }),
    );
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  it('::ffff:127.0.0.1 (an IPv4 client on an IPv6 socket) is 127.0.0.1, matched by a mapped allow entry', async () => {
    const port = new URL(gatehouse.url).port;
    const reply = await request(`http://127.0.0.1:${port}`, '/api/s', { headers: key });
    assert.equal(reply.status, 200);
    assert.equal(upstream.received.at(-1)!.headers['x-forwarded-for'], '127.0.0.1');
    assert.equal(gatehouse.logs.filter((l) => l.msg === 'request').at(-1)!.ip, '127.0.0.1');
  });

  it('::ffff:127.0.0.2 is refused', async () => {
    const port = new URL(gatehouse.url).port;
    const before = upstream.received.length;
    const reply = await request(`http://127.0.0.1:${port}`, '/api/s', { headers: key, localAddress: '127.0.0.2' });
    assert.equal(reply.status, 403);
    assert.equal(upstream.received.length, before);
  });
});

describe('bypass: trusted proxies', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  before(async () => {
    upstream = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(
      testConfig(upstream.url, {
        gateway: { trustProxy: ['127.0.0.1'], auth: { allowedIPs: ['203.0.113.0/24'] } },
      }),
    );
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  it('X-Forwarded-For from a trusted proxy is believed (rightmost untrusted hop is the client)', async () => {
    const reply = await request(gatehouse.url, '/api/s', {
      headers: { ...key, 'x-forwarded-for': '198.51.100.7, 203.0.113.5', 'x-forwarded-proto': 'https' },
    });
    assert.equal(reply.status, 200);
    const got = upstream.received.at(-1)!;
    assert.equal(got.headers['x-forwarded-for'], '203.0.113.5, 127.0.0.1');
    assert.equal(got.headers['x-forwarded-proto'], 'https');
    upstream.received.length = 0;
  });

  it('a client cannot prepend an allowed address through the proxy', async () => {
    const reply = await request(gatehouse.url, '/api/s', {
      headers: { ...key, 'x-forwarded-for': '203.0.113.5, 198.51.100.7' },
    });
    assert.equal(reply.status, 403);
    assert.equal(upstream.received.length, 0);
  });

  it('a peer that is not a trusted proxy cannot use X-Forwarded-For', async () => {
    const reply = await request(gatehouse.url, '/api/s', {
      headers: { ...key, 'x-forwarded-for': '203.0.113.5' },
      localAddress: '127.0.0.2',
    });
    assert.equal(reply.status, 403);
    assert.equal(upstream.received.length, 0);
  });

  it('garbage in X-Forwarded-For from the trusted proxy: 400, nothing forwarded', async () => {
    const reply = await request(gatehouse.url, '/api/s', { headers: { ...key, 'x-forwarded-for': 'not-an-ip' } });
    assert.equal(reply.status, 400);
    assert.equal(reply.json().error.code, 'invalid_client_ip');
    assert.equal(upstream.received.length, 0);
  });
});

describe('bypass: allowedIPs also applies with auth disabled', () => {
  it('403 outside the list, 200 inside, no credential needed', async () => {
    const upstream = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(
      testConfig(upstream.url, { gateway: { auth: { enabled: false, allowedIPs: ['127.0.0.1'] } } }),
    );
    try {
      const refused = await request(gatehouse.url, '/api/s', { localAddress: '127.0.0.2' });
      assert.equal(refused.status, 403);
      assert.equal(upstream.received.length, 0);
      const ok = await request(gatehouse.url, '/api/s', { headers: { 'x-gatehouse-subject': 'admin' } });
      assert.equal(ok.status, 200);
      assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-auth'], 'none');
      assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-subject'], undefined);
    } finally {
      await gatehouse.close();
      await upstream.close();
    }
  });
});

describe('failure lockout', () => {
  it('locks an IP after failures.max bad keys: 429 + Retry-After even with a valid key; other IPs unaffected', async () => {
    const upstream = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(
      testConfig(upstream.url, { gateway: { auth: { failures: { max: 3, windowSeconds: 60, lockoutSeconds: 120 } } } }),
    );
    try {
      for (let i = 0; i < 3; i++) {
        const bad = await request(gatehouse.url, '/api/s', {
          headers: { 'x-api-key': `wrong-key-${i}-${'x'.repeat(32)}` },
        });
        assert.equal(bad.status, 401);
      }
      const locked = await request(gatehouse.url, '/api/s', { headers: key });
      assert.equal(locked.status, 429);
      assert.equal(locked.json().error.code, 'too_many_failures');
      const retryAfter = Number(locked.headers['retry-after']);
      assert.ok(retryAfter > 100 && retryAfter <= 120, `Retry-After ${retryAfter}`);
      assert.equal(upstream.received.length, 0);

      const other = await request(gatehouse.url, '/api/s', { headers: key, localAddress: '127.0.0.2' });
      assert.equal(other.status, 200);
      // Missing credentials are not failures: a client without a key is not guessing.
      for (let i = 0; i < 5; i++)
        assert.equal((await request(gatehouse.url, '/api/s', { localAddress: '127.0.0.3' })).status, 401);
      assert.equal((await request(gatehouse.url, '/api/s', { headers: key, localAddress: '127.0.0.3' })).status, 200);
    } finally {
      await gatehouse.close();
      await upstream.close();
    }
  });
});

describe('bypass: request smuggling through the proxy', () => {
  /** A raw upstream: counts the request lines it reads on each connection, answers each with 200. */
  async function startRawUpstream() {
    const requestLines: string[] = [];
    const bodies: string[] = [];
    const server = (await import('node:net')).createServer((socket) => {
      let buffer = '';
      socket.on('data', (d) => {
        buffer += d.toString('latin1');
        for (const m of buffer.matchAll(
          /(?:^|\r\n)((?:GET|POST|DELETE|OPTIONS|PUT|PATCH|HEAD) \S+ HTTP\/1\.[01])\r\n/g,
        ))
          requestLines.push(m[1]!);
        bodies.push(buffer);
        buffer = '';
        socket.write('HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok');
      });
      socket.on('error', () => {});
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const { port } = server.address() as import('node:net').AddressInfo;
    return {
      url: `http://127.0.0.1:${port}`,
      requestLines,
      bodies,
      close: () => new Promise<void>((r) => server.close(() => r())),
    };
  }
  const smuggled = 'GET /admin HTTP/1.1\r\nHost: upstream\r\nX-Gatehouse-Subject: root\r\n\r\n';

  it('a chunked DELETE keeps its framing: the upstream sees one request, never the body as another', async () => {
    // A real HTTP parser upstream: a smuggled request would show up as a second request.
    const upstream = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(testConfig(upstream.url));
    try {
      const reply = await rawRequest(
        gatehouse.url,
        `DELETE /api/items/1 HTTP/1.1\r\nHost: g\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\nTransfer-Encoding: chunked\r\n\r\n` +
          `${smuggled.length.toString(16)}\r\n${smuggled}\r\n0\r\n\r\n`,
      );
      assert.equal(reply.status, 200);
      await new Promise((r) => setTimeout(r, 100));
      assert.deepEqual(
        upstream.received.map((r) => `${r.method} ${r.url}`),
        ['DELETE /api/items/1'],
      );
      assert.equal(upstream.received[0]!.body, smuggled);
    } finally {
      await gatehouse.close(100);
      await upstream.close();
    }
  });

  it('Connection naming Content-Length (to strip the framing) is refused: 400, upstream untouched', async () => {
    const upstream = await startRawUpstream();
    const gatehouse = await startTestGatehouse(testConfig(upstream.url));
    try {
      for (const named of ['content-length', 'Transfer-Encoding', 'host']) {
        const reply = await rawRequest(
          gatehouse.url,
          `POST /api/items HTTP/1.1\r\nHost: g\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\nConnection: close, ${named}\r\nContent-Length: ${smuggled.length}\r\n\r\n${smuggled}`,
        );
        assert.equal(reply.status, 400, named);
        assert.equal(JSON.parse(reply.body).error.code, 'invalid_request');
      }
      await new Promise((r) => setTimeout(r, 100));
      assert.deepEqual(upstream.requestLines, []);
    } finally {
      await gatehouse.close(100);
      await upstream.close();
    }
  });

  it('proxy-identity headers that frameworks believe (X-Forwarded-Prefix, X-Original-URL, True-Client-IP…) are stripped', async () => {
    const upstream = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(testConfig(upstream.url));
    try {
      const names = [
        'x-forwarded-prefix',
        'x-forwarded-scheme',
        'x-forwarded-ssl',
        'x-original-url',
        'x-rewrite-url',
        'true-client-ip',
        'x-client-ip',
        'cf-connecting-ip',
      ];
      const reply = await request(gatehouse.url, '/api/s', {
        headers: { 'x-api-key': TEST_PLAIN_KEY, ...Object.fromEntries(names.map((n) => [n, '/admin'])) },
      });
      assert.equal(reply.status, 200);
      for (const name of names) assert.equal(upstream.received.at(-1)!.headers[name], undefined, name);
    } finally {
      await gatehouse.close();
      await upstream.close();
    }
  });
});

describe('bypass: framing and upstream answers found by attacking the edge', () => {
  /** A raw upstream that answers every request with `answer` (bytes as given). */
  async function rawUpstream(answer: string) {
    const net = await import('node:net');
    let requests = 0;
    const server = net.createServer((socket) => {
      socket.on('data', () => {
        requests++;
        socket.write(answer);
      });
      socket.on('error', () => {});
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    return {
      url: `http://127.0.0.1:${(server.address() as import('node:net').AddressInfo).port}`,
      requests: () => requests,
      close: () => new Promise<void>((r) => server.close(() => r())),
    };
  }

  it('GET with a body is refused (400): its bytes would be the next request on a server that never reads them', async () => {
    const upstream = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(testConfig(upstream.url));
    try {
      const smuggled = 'GET /admin HTTP/1.1\r\nHost: u\r\n\r\n';
      const reply = await rawRequest(
        gatehouse.url,
        `GET /api/ping HTTP/1.1\r\nHost: g\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\nContent-Length: ${smuggled.length}\r\n\r\n${smuggled}`,
      );
      assert.equal(reply.status, 400);
      assert.equal(JSON.parse(reply.body).error.code, 'invalid_request');
      assert.equal(upstream.received.length, 0);
    } finally {
      await gatehouse.close(100);
      await upstream.close();
    }
  });

  it('a path that http-proxy would rewrite (`http:/` → `http://`) is refused, never sent changed', async () => {
    const upstream = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(testConfig(upstream.url));
    try {
      const reply = await rawRequest(
        gatehouse.url,
        `GET /api/http:/evil.example/x HTTP/1.1\r\nHost: g\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\n\r\n`,
      );
      assert.equal(reply.status, 400);
      assert.equal(upstream.received.length, 0);
    } finally {
      await gatehouse.close(100);
      await upstream.close();
    }
  });

  for (const [name, answer] of [
    ['a status Node refuses (099)', 'HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n'],
    [
      'a 101 without an upgrade asked for',
      'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n',
    ],
  ] as const) {
    it(`an upstream answering ${name}: 502 for that request, and gatehouse keeps serving`, async () => {
      const upstream = await rawUpstream(answer);
      const gatehouse = await startTestGatehouse(
        testConfig(upstream.url, { gateway: { upstream: { timeoutMs: 3000 } } }),
      );
      try {
        const started = Date.now();
        const reply = await request(gatehouse.url, '/api/x', { headers: { 'x-api-key': TEST_PLAIN_KEY } });
        assert.equal(reply.status, 502);
        assert.ok(Date.now() - started < 2500, 'answered before the upstream timeout');
        assert.equal((await request(gatehouse.url, '/healthz')).status, 200);
      } finally {
        await gatehouse.close(100);
        await upstream.close();
      }
    });
  }
});
