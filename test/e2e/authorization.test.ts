import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { SignJWT, type JWTPayload } from 'jose';
import { parseConfig } from '../../src/config/load.js';
import { generateApiKey, hashApiKey } from '../../src/gateway/credentials/api-key.js';
import { startTestGatehouse, testConfig, type TestGatehouse } from '../helpers/gatehouse.js';
import { request } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// Issue 16: routes to several upstreams, scopes and rules, rate limits — over real sockets, asserting
// what each upstream received and that a refused request reached none.

const SECRET = 'authz-test-secret-0123456789abcdefghijklmnopqrstuvwxyz';
const CI_KEY = generateApiKey();
const BILLING_KEY = generateApiKey();
const PLAIN_KEY = generateApiKey();

function hs256(claims: JWTPayload): Promise<string> {
  return new SignJWT(claims)
    .setProtectedHeader({ alg: 'HS256' })
    .setExpirationTime('5m')
    .sign(new TextEncoder().encode(SECRET));
}

describe('routes × credentials × methods', () => {
  let main: RecordingServer;
  let billing: RecordingServer;
  let orders: RecordingServer;
  let gatehouse: TestGatehouse;
  const credentials: Record<string, Record<string, string>> = {};

  before(async () => {
    [main, billing, orders] = await Promise.all([
      startRecordingUpstream(),
      startRecordingUpstream(),
      startRecordingUpstream(),
    ]);
    credentials.ci = { 'x-api-key': CI_KEY };
    credentials.billing = { 'x-api-key': BILLING_KEY };
    credentials.plain = { 'x-api-key': PLAIN_KEY };
    credentials.admin = {
      authorization: `Bearer ${await hs256({ sub: 'ada', scope: 'orders:read orders:write', groups: ['ops', 'admins'] })}`,
    };
    credentials.user = {
      authorization: `Bearer ${await hs256({ sub: 'bob', scp: ['orders:read'], groups: 'dev', tenant: 'acme' })}`,
    };
    const config = testConfig(main.url, {
      gateway: {
        routes: [
          { prefix: '/api/billing/', upstream: { target: billing.url }, stripPrefix: '/api' },
          { prefix: '/api/orders/', upstream: { target: orders.url } },
          // Longer than /api/orders/: wins for its paths.
          { prefix: '/api/orders/reports/', upstream: { target: main.url, timeoutMs: 2000 } },
        ],
        auth: {
          apiKey: undefined,
          apiKeys: [
            { id: 'ci', hash: hashApiKey(CI_KEY), scopes: ['orders:read'] },
            { id: 'billing-svc', hash: hashApiKey(BILLING_KEY), scopes: ['billing'] },
            { id: 'plain', hash: hashApiKey(PLAIN_KEY) },
          ],
          bearer: { jwt: { secret: SECRET } },
          // Low, so that the 403s of the matrix below would lock the client out if they counted.
          failures: { max: 3 },
          rules: [
            { paths: ['/api/orders/**'], methods: ['GET', 'HEAD'], scopes: ['orders:read'] },
            { paths: ['/api/orders/**'], methods: ['POST', 'PUT', 'PATCH', 'DELETE'], scopes: ['orders:write'] },
            { paths: ['/api/billing/**'], scopes: ['billing'] },
            { paths: ['/api/admin/**'], claims: { groups: 'admins' } },
            { paths: ['/api/tenant/**'], claims: { tenant: 'acme' } },
          ],
        },
      },
    });
    gatehouse = await startTestGatehouse(config);
  });
  after(async () => {
    await gatehouse.close();
    await Promise.all([main.close(), billing.close(), orders.close()]);
  });

  const paths = [
    '/api/orders/7',
    '/api/orders/reports/q1',
    '/api/billing/invoices?id=1',
    '/api/admin/users',
    '/api/tenant/data',
    '/api/other',
  ];
  // What each credential may do, written out by hand: path → methods allowed.
  const allowed: Record<string, Record<string, string[]>> = {
    ci: { '/api/orders/7': ['GET'], '/api/orders/reports/q1': ['GET'], '/api/other': ['GET', 'POST'] },
    billing: { '/api/billing/invoices?id=1': ['GET', 'POST'], '/api/other': ['GET', 'POST'] },
    plain: { '/api/other': ['GET', 'POST'] },
    admin: {
      '/api/orders/7': ['GET', 'POST'],
      '/api/orders/reports/q1': ['GET', 'POST'],
      '/api/admin/users': ['GET', 'POST'],
      '/api/other': ['GET', 'POST'],
    },
    user: {
      '/api/orders/7': ['GET'],
      '/api/orders/reports/q1': ['GET'],
      '/api/tenant/data': ['GET', 'POST'],
      '/api/other': ['GET', 'POST'],
    },
  };
  const scopesSent: Record<string, string | undefined> = {
    ci: 'orders:read',
    billing: 'billing',
    plain: undefined,
    admin: 'orders:read orders:write',
    user: 'orders:read',
  };
  // Where an allowed request lands, and with which target.
  const landing = (p: string): [() => RecordingServer, string] =>
    p.startsWith('/api/billing/')
      ? [() => billing, p.slice('/api'.length)]
      : p.startsWith('/api/orders/reports/')
        ? [() => main, p]
        : p.startsWith('/api/orders/')
          ? [() => orders, p]
          : [() => main, p];

  it("each allowed request reaches exactly its route's upstream; each refused one (403 insufficient_scope) reaches none", async () => {
    const total = () => main.received.length + billing.received.length + orders.received.length;
    let checked = 0;
    for (const [name, headers] of Object.entries(credentials)) {
      for (const p of paths) {
        for (const method of ['GET', 'POST']) {
          const before = total();
          const [upstreamOf, target] = landing(p);
          const upstreamBefore = upstreamOf().received.length;
          const reply = await request(gatehouse.url, p, {
            method,
            headers: { ...headers, 'x-gatehouse-scopes': 'forged:everything' },
          });
          const what = `${name} ${method} ${p}`;
          if (allowed[name]![p]?.includes(method)) {
            assert.equal(reply.status, 200, what);
            assert.equal(total(), before + 1, `${what}: one upstream request`);
            assert.equal(upstreamOf().received.length, upstreamBefore + 1, `${what}: the route's upstream`);
            const got = upstreamOf().received.at(-1)!;
            assert.equal(got.method, method, what);
            assert.equal(got.url, target, what);
            assert.equal(
              got.headers['x-gatehouse-scopes'],
              scopesSent[name],
              `${what}: granted scopes, never the client's`,
            );
            assert.equal(got.headers['x-forwarded-prefix'], p.startsWith('/api/billing/') ? '/api' : undefined, what);
          } else {
            assert.equal(reply.status, 403, what);
            assert.equal(reply.json().error.code, 'insufficient_scope', what);
            assert.match(
              reply.headers['www-authenticate'] as string,
              /^Bearer realm="gatehouse", error="insufficient_scope"/,
              what,
            );
            assert.equal(total(), before, `${what}: no upstream touched`);
          }
          checked++;
        }
      }
    }
    assert.equal(checked, 5 * paths.length * 2);
    // More than failures.max 403s from this address, and still not locked out: they do not count.
    assert.equal((await request(gatehouse.url, '/api/other', { headers: credentials.plain })).status, 200);
  });

  it('the 403 names the missing scopes (RFC 6750) and the log names the rule', async () => {
    const reply = await request(gatehouse.url, '/api/orders/7', { method: 'DELETE', headers: credentials.ci });
    assert.equal(reply.status, 403);
    assert.equal(
      reply.headers['www-authenticate'],
      'Bearer realm="gatehouse", error="insufficient_scope", scope="orders:write"',
    );
    const line = gatehouse.logs.findLast((l) => l.msg === 'request' && l.error === 'insufficient_scope');
    assert.match(line!.detail, /rules\[1\]: scope "orders:write" not granted/);
    assert.equal(line!.path, '/api/orders/7');
  });

  it('stripPrefix is byte-exact: encoded characters and the query go up untouched; the log keeps the path as received', async () => {
    const before = billing.received.length;
    const reply = await request(gatehouse.url, '/api/billing/a%20b/%C3%A9t%C3%A9/c?q=%41&x=%2F&&y', {
      headers: credentials.billing,
    });
    assert.equal(reply.status, 200);
    assert.equal(billing.received.length, before + 1);
    assert.equal(billing.received.at(-1)!.url, '/billing/a%20b/%C3%A9t%C3%A9/c?q=%41&x=%2F&&y');
    const line = gatehouse.logs.findLast((l) => l.msg === 'request' && l.status === 200);
    assert.equal(line!.path, '/api/billing/a%20b/%C3%A9t%C3%A9/c');
  });

  it('percent-encoded letters do not dodge a rule, nor reach another upstream', async () => {
    const billingBefore = billing.received.length;
    const before = orders.received.length + main.received.length + billing.received.length;
    const reply = await request(gatehouse.url, '/api/admin/%75sers', { headers: credentials.ci });
    assert.equal(reply.status, 403);
    // A route's prefix reached only once decoded: judged as billing's path, so not sent to another upstream.
    const encodedPrefix = await request(gatehouse.url, '/api/%62illing/invoices', { headers: credentials.billing });
    assert.equal(encodedPrefix.status, 400);
    assert.equal(encodedPrefix.json().error.code, 'invalid_path');
    assert.equal(
      orders.received.length + main.received.length + billing.received.length,
      before,
      'no upstream reached',
    );
    assert.equal(billing.received.length, billingBefore);
  });

  it('spellings an upstream reads as the same path do not dodge a rule: case, a trailing slash, an encoded line break (found by an outside attack)', async () => {
    const total = () => main.received.length + billing.received.length + orders.received.length;
    const before = total();
    for (const [method, p] of [
      ['GET', '/api/ADMIN/users'],
      ['POST', '/api/Admin/users/'],
      ['GET', '/api/TENANT/data'],
      ['POST', '/api/orders/7/'],
      ['POST', '/api/Orders/7'],
      ['DELETE', '/api/orders/7%e2%80%a8'],
    ] as const) {
      const reply = await request(gatehouse.url, p, { method, headers: credentials.ci });
      assert.equal(reply.status, 403, `${method} ${p}`);
      assert.equal(reply.json().error.code, 'insufficient_scope', `${method} ${p}`);
    }
    for (const p of ['/api/admin/users%0a', '/api/admin/users%0D', '/api/orders/7%0a']) {
      const reply = await request(gatehouse.url, p, { method: 'POST', headers: credentials.ci });
      assert.equal(reply.status, 400, p);
      assert.equal(reply.json().error.code, 'invalid_path', p);
    }
    // A route's prefix in another case: judged by billing's rule, so never sent to another upstream (found by review).
    for (const p of ['/api/Billing/invoices', '/api/BILLING/x']) {
      const reply = await request(gatehouse.url, p, { headers: credentials.billing });
      assert.equal(reply.status, 400, p);
      assert.equal(reply.json().error.code, 'invalid_path', p);
    }
    assert.equal(total(), before, 'no upstream reached');
  });
});

describe('rate limits (one process)', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  const KEY = generateApiKey();
  const BULK = generateApiKey();
  const OTHER = generateApiKey();
  let raw: Record<string, any>;

  before(async () => {
    upstream = await startRecordingUpstream();
    raw = testConfig(upstream.url, {
      gateway: {
        rateLimits: [
          { by: 'key', requests: 3, per: '1m' },
          { by: 'ip', requests: 2, per: '1h', paths: ['/api/expensive/**'], methods: ['POST'] },
        ],
        auth: {
          apiKey: undefined,
          apiKeys: [
            { id: 'app', hash: hashApiKey(KEY) },
            { id: 'bulk', hash: hashApiKey(BULK), rateLimit: { requests: 5, per: '1h' } },
            { id: 'other', hash: hashApiKey(OTHER) },
          ],
        },
      },
    });
    gatehouse = await startTestGatehouse(raw);
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  it('N allowed with RateLimit on each answer, then 429 rate_limited with Retry-After, and the upstream saw N', async () => {
    const before = upstream.received.length;
    for (let i = 1; i <= 3; i++) {
      const reply = await request(gatehouse.url, '/api/x', { headers: { 'x-api-key': KEY } });
      assert.equal(reply.status, 200);
      assert.equal(reply.headers['ratelimit-policy'], '"key";q=3;w=60');
      assert.equal(reply.headers.ratelimit, `"key";r=${3 - i};t=${20 * i}`);
    }
    const refused = await request(gatehouse.url, '/api/x', { headers: { 'x-api-key': KEY } });
    assert.equal(refused.status, 429);
    assert.equal(refused.json().error.code, 'rate_limited');
    assert.equal(refused.headers['retry-after'], '20');
    assert.equal(refused.headers['ratelimit-policy'], '"key";q=3;w=60');
    assert.equal(refused.headers.ratelimit, '"key";r=0;t=60');
    assert.equal(upstream.received.length, before + 3, 'the refused request reached no upstream');
  });

  it("a key's own rateLimit; by ip on one path and method only", async () => {
    for (let i = 0; i < 5; i++)
      assert.equal((await request(gatehouse.url, '/api/x', { headers: { 'x-api-key': BULK } })).status, 200);
    const refused = await request(gatehouse.url, '/api/x', { headers: { 'x-api-key': BULK } });
    assert.equal(refused.status, 429);
    assert.equal(refused.headers['retry-after'], '720');
    const other = { 'x-api-key': OTHER };
    for (let i = 0; i < 2; i++)
      assert.equal(
        (await request(gatehouse.url, '/api/expensive/run', { method: 'POST', headers: other })).status,
        200,
      );
    const before = upstream.received.length;
    const byIp = await request(gatehouse.url, '/api/expensive/run', { method: 'POST', headers: other });
    assert.equal(byIp.status, 429);
    assert.equal(byIp.headers['retry-after'], '1800');
    assert.equal(byIp.headers['ratelimit-policy'], '"key";q=3;w=60, "ip";q=2;w=3600');
    assert.equal(byIp.headers.ratelimit, '"key";r=1;t=40, "ip";r=0;t=3600');
    assert.equal(upstream.received.length, before);
    const get = await request(gatehouse.url, '/api/expensive/run', { headers: other });
    assert.equal(get.status, 200, 'GET is not under the ip limit, and the refused POST took no key token');
    assert.equal(get.headers.ratelimit, '"key";r=0;t=60');
  });

  it('unauthenticated requests are not counted (the lockout deals with them); 429s are not lockout failures', async () => {
    const ip = await startTestGatehouse(
      testConfig(upstream.url, {
        gateway: { rateLimits: [{ by: 'ip', requests: 1, per: '1h' }], auth: { failures: { max: 2 } } },
      }),
    );
    try {
      assert.equal((await request(ip.url, '/api/x')).status, 401, 'no credentials');
      assert.equal(
        (await request(ip.url, '/api/x', { headers: { 'x-api-key': 'test-plain-key-0123456789abcdefghijklmnop' } }))
          .status,
        200,
        'the 401 took no token',
      );
      for (let i = 0; i < 3; i++)
        assert.equal(
          (await request(ip.url, '/api/x', { headers: { 'x-api-key': 'test-plain-key-0123456789abcdefghijklmnop' } }))
            .status,
          429,
        );
      assert.equal(
        (
          await request(ip.url, '/api/x', { headers: { 'x-api-key': 'test-plain-key-0123456789abcdefghijklmnop' } })
        ).json().error.code,
        'rate_limited',
        'not too_many_failures',
      );
    } finally {
      await ip.close();
    }
  });

  it('reload keeps the buckets of unchanged limits and starts changed ones afresh', async () => {
    assert.equal((await request(gatehouse.url, '/api/x', { headers: { 'x-api-key': KEY } })).status, 429);
    // Same limits, one rule more: the key stays limited.
    const withRule = {
      ...raw,
      gateway: {
        ...raw.gateway,
        auth: { ...raw.gateway.auth, rules: [{ paths: ['/api/admin/**'], scopes: ['admin'] }] },
      },
    };
    await gatehouse.reload(parseConfig(withRule));
    assert.equal(
      (await request(gatehouse.url, '/api/x', { headers: { 'x-api-key': KEY } })).status,
      429,
      'bucket kept',
    );
    assert.equal(
      (await request(gatehouse.url, '/api/admin/x', { headers: { 'x-api-key': KEY } })).status,
      403,
      'the new rule is in force',
    );
    // The by-key limit changed: new buckets.
    const changed = {
      ...withRule,
      gateway: { ...withRule.gateway, rateLimits: [{ by: 'key', requests: 4, per: '1m' }] },
    };
    await gatehouse.reload(parseConfig(changed));
    const reply = await request(gatehouse.url, '/api/x', { headers: { 'x-api-key': KEY } });
    assert.equal(reply.status, 200);
    assert.equal(reply.headers.ratelimit, '"key";r=3;t=15');
  });
});
