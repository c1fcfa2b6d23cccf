import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { hashApiKey, generateApiKey } from '../../src/gateway/credentials/api-key.js';
import { startTestGatehouse, testConfig, TEST_PLAIN_KEY, type TestGatehouse } from '../helpers/gatehouse.js';
import { request } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

describe('gateway: authenticated requests reach the upstream as intended', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  const rotatedKey = generateApiKey();
  const expiredKey = generateApiKey();

  before(async () => {
    upstream = await startRecordingUpstream((req, res) => {
      if (req.url.startsWith('/api/echo-body')) {
        res.writeHead(201, { 'content-type': 'text/plain', 'x-upstream': 'yes' });
        res.end(`got:${req.body}`);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"ok":true}');
    });
    gatehouse = await startTestGatehouse(
      testConfig(upstream.url, {
        gateway: {
          auth: {
            apiKeys: [
              { id: 'ci', hash: hashApiKey(rotatedKey), expiresAt: '2999-01-01T00:00:00Z' },
              { id: 'old', hash: hashApiKey(expiredKey), expiresAt: '2020-01-01T00:00:00Z' },
            ],
          },
        },
      }),
    );
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  it('GET /healthz answers 200 without credentials and is never proxied', async () => {
    const before = upstream.received.length;
    const reply = await request(gatehouse.url, '/healthz');
    assert.equal(reply.status, 200);
    assert.deepEqual(reply.json(), { status: 'ok' });
    assert.equal(upstream.received.length, before);
  });

  it('without a credential: 401 with a Bearer challenge, and the upstream gets nothing', async () => {
    const before = upstream.received.length;
    const reply = await request(gatehouse.url, '/api/things');
    assert.equal(reply.status, 401);
    assert.equal(reply.json().error.code, 'missing_credentials');
    assert.equal(reply.headers['www-authenticate'], 'Bearer realm="gatehouse"');
    assert.equal(upstream.received.length, before);
  });

  it('with the plain key: proxied with identity headers, credentials stripped, path and query exact', async () => {
    const reply = await request(gatehouse.url, '/api/things/42?b=2&a=1', {
      headers: { 'x-api-key': TEST_PLAIN_KEY, 'x-request-id': 'trace-abc.123' },
    });
    assert.equal(reply.status, 200);
    assert.equal(reply.headers['x-request-id'], 'trace-abc.123');
    const got = upstream.received.at(-1)!;
    assert.equal(got.url, '/api/things/42?b=2&a=1');
    assert.equal(got.headers['x-gatehouse-auth'], 'api-key');
    assert.equal(got.headers['x-gatehouse-subject'], 'default');
    assert.equal(got.headers['x-api-key'], undefined);
    assert.equal(got.headers['x-request-id'], 'trace-abc.123');
    assert.equal(got.headers['x-forwarded-for'], '127.0.0.1');
    assert.equal(got.headers['x-forwarded-proto'], 'http');
    assert.equal(got.headers['x-forwarded-host'], new URL(gatehouse.url).host);
  });

  it('an insane X-Request-Id is replaced by a generated one', async () => {
    const reply = await request(gatehouse.url, '/api/x', {
      headers: { 'x-api-key': TEST_PLAIN_KEY, 'x-request-id': 'has spaces and "quotes"' },
    });
    assert.equal(reply.status, 200);
    assert.match(reply.headers['x-request-id'] as string, /^[0-9a-f-]{36}$/);
    assert.equal(upstream.received.at(-1)!.headers['x-request-id'], reply.headers['x-request-id']);
  });

  it('hashed keys: a current one passes with its id, an expired one gets 401', async () => {
    const ok = await request(gatehouse.url, '/api/rotated', { headers: { 'x-api-key': rotatedKey } });
    assert.equal(ok.status, 200);
    assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-subject'], 'ci');
    const before = upstream.received.length;
    const expired = await request(gatehouse.url, '/api/expired', { headers: { 'x-api-key': expiredKey } });
    assert.equal(expired.status, 401);
    assert.equal(expired.json().error.code, 'invalid_api_key');
    assert.equal(upstream.received.length, before);
  });

  it('streams request and response bodies through, status and headers intact', async () => {
    const body = 'x'.repeat(200_000);
    const reply = await request(gatehouse.url, '/api/echo-body', {
      method: 'POST',
      body,
      headers: { 'x-api-key': TEST_PLAIN_KEY, 'content-type': 'text/plain' },
    });
    assert.equal(reply.status, 201);
    assert.equal(reply.headers['x-upstream'], 'yes');
    assert.equal(reply.body, `got:${body}`);
  });

  it('non-bearer Authorization (e.g. Basic) passes through to the upstream untouched', async () => {
    await request(gatehouse.url, '/api/basic', {
      headers: { 'x-api-key': TEST_PLAIN_KEY, authorization: 'Basic dXNlcjpwYXNz' },
    });
    assert.equal(upstream.received.at(-1)!.headers.authorization, 'Basic dXNlcjpwYXNz');
  });

  it('the request log has one line per request and never a key', async () => {
    await request(gatehouse.url, '/api/logged?api_key=secret-in-query', { headers: { 'x-api-key': TEST_PLAIN_KEY } });
    const line = gatehouse.logs.filter((l) => l.msg === 'request').at(-1)!;
    assert.equal(line.path, '/api/logged');
    assert.equal(line.status, 200);
    assert.equal(line.auth, 'api-key');
    assert.equal(line.subject, 'default');
    assert.equal(line.ip, '127.0.0.1');
    assert.equal(typeof line.ms, 'number');
    assert.ok(!gatehouse.logText().includes(TEST_PLAIN_KEY));
    assert.ok(!gatehouse.logText().includes(rotatedKey));
    assert.ok(!gatehouse.logText().includes('secret-in-query'));
  });
});

describe('gateway: upstream failures', () => {
  it('upstream refusing connections: 502 upstream_unreachable', async () => {
    const upstream = await startRecordingUpstream();
    const deadUrl = upstream.url;
    await upstream.close();
    const gatehouse = await startTestGatehouse(testConfig(deadUrl));
    try {
      const reply = await request(gatehouse.url, '/api/x', { headers: { 'x-api-key': TEST_PLAIN_KEY } });
      assert.equal(reply.status, 502);
      assert.equal(reply.json().error.code, 'upstream_unreachable');
    } finally {
      await gatehouse.close();
    }
  });

  it('upstream too slow: 504 upstream_timeout', async () => {
    const upstream = await startRecordingUpstream(() => {
      /* never answers */
    });
    const gatehouse = await startTestGatehouse(testConfig(upstream.url, { gateway: { upstream: { timeoutMs: 300 } } }));
    try {
      const reply = await request(gatehouse.url, '/api/slow', { headers: { 'x-api-key': TEST_PLAIN_KEY } });
      assert.equal(reply.status, 504);
      assert.equal(reply.json().error.code, 'upstream_timeout');
    } finally {
      await gatehouse.close(100);
      await upstream.close();
    }
  });

  it('keeps upstream connections alive between requests', async () => {
    const upstream = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(testConfig(upstream.url));
    try {
      // The test client closes its connection each time (Connection: close): that must not reach the upstream.
      for (let i = 0; i < 5; i++) await request(gatehouse.url, '/api/ka', { headers: { 'x-api-key': TEST_PLAIN_KEY } });
      assert.equal(new Set(upstream.received.map((r) => r.remotePort)).size, 1);
      assert.equal(upstream.received.at(-1)!.headers.connection, 'keep-alive');
    } finally {
      await gatehouse.close();
      await upstream.close();
    }
  });
});

describe('gateway: what the upstream answers reaches the client intact', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  before(async () => {
    upstream = await startRecordingUpstream((req, res) => {
      if (req.url.startsWith('/base/api/chunked')) {
        res.writeHead(207, 'Multi Things', {
          'set-cookie': ['a=1; HttpOnly', 'b=2'],
          'x-custom': 'v',
          'keep-alive': 'timeout=99',
          connection: 'keep-alive',
        });
        res.write('part1-');
        setTimeout(() => res.end('part2'), 20);
        return;
      }
      res.end(req.method === 'HEAD' ? undefined : 'plain');
    });
    // An upstream target with a base path: the request path is appended to it.
    gatehouse = await startTestGatehouse(testConfig(`${upstream.url}/base`));
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  it('status, reason, repeated Set-Cookie and a chunked body pass through; hop-by-hop headers do not', async () => {
    const reply = await request(gatehouse.url, '/api/chunked?x=1', { headers: { 'x-api-key': TEST_PLAIN_KEY } });
    assert.equal(upstream.received.at(-1)!.url, '/base/api/chunked?x=1');
    assert.equal(reply.status, 207);
    assert.deepEqual(reply.headers['set-cookie'], ['a=1; HttpOnly', 'b=2']);
    assert.equal(reply.headers['x-custom'], 'v');
    assert.equal(reply.body, 'part1-part2');
    assert.notEqual(reply.headers['keep-alive'], 'timeout=99');
  });

  it('HEAD gets the headers and no body', async () => {
    const reply = await request(gatehouse.url, '/api/head', {
      method: 'HEAD',
      headers: { 'x-api-key': TEST_PLAIN_KEY },
    });
    assert.equal(reply.status, 200);
    assert.equal(reply.body, '');
    assert.equal(upstream.received.at(-1)!.method, 'HEAD');
  });
});

describe('gateway: TLS', () => {
  it('serves HTTPS with gateway.tls and says so upstream (X-Forwarded-Proto: https)', async () => {
    const { default: https } = await import('node:https');
    const { readFileSync } = await import('node:fs');
    const { fileURLToPath } = await import('node:url');
    const fixtures = fileURLToPath(new URL('../fixtures/tls/', import.meta.url));
    const upstream = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(
      testConfig(upstream.url, { gateway: { tls: { cert: `${fixtures}cert.pem`, key: `${fixtures}key.pem` } } }),
    );
    try {
      assert.match(gatehouse.url, /^https:\/\//);
      const body = await new Promise<string>((resolve, reject) => {
        https
          .get(
            `${gatehouse.url}/api/secure`,
            { ca: readFileSync(`${fixtures}cert.pem`), headers: { 'x-api-key': TEST_PLAIN_KEY } },
            (res) => {
              let text = '';
              res.on('data', (d) => (text += d));
              res.on('end', () => resolve(`${res.statusCode} ${text}`));
            },
          )
          .on('error', reject);
      });
      assert.equal(body, '200 {"ok":true}');
      assert.equal(upstream.received.at(-1)!.headers['x-forwarded-proto'], 'https');
    } finally {
      await gatehouse.close();
      await upstream.close();
    }
  });
});
