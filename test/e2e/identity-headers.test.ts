import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { SignJWT, type JWTPayload } from 'jose';
import { startTestGatehouse, testConfig, TEST_PLAIN_KEY, type TestGatehouse } from '../helpers/gatehouse.js';
import { rawExchange } from '../helpers/raw-socket.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

/*
 * Identity headers cannot be forged under look-alike names. CGI and PHP (and servers built on
 * them) read every character outside [A-Za-z0-9] in a header name as `_`: `X-Gatehouse.Subject`
 * becomes HTTP_X_GATEHOUSE_SUBJECT, the variable gatehouse's own header fills. So every owned
 * name is generated with every separator a header name may contain, and the upstream's raw
 * headers are searched for the forged value.
 */

/** Every name gatehouse sets or strips on the way up (src/gateway/forward-headers.ts). */
const OWNED = [
  'x-gatehouse-subject',
  'x-gatehouse-key-id',
  'x-gatehouse-auth',
  'x-gatehouse-anything',
  'x-forwarded-for',
  'x-forwarded-proto',
  'x-forwarded-host',
  'x-forwarded-port',
  'x-real-ip',
  'x-request-id',
  'x-forwarded-prefix',
  'x-forwarded-scheme',
  'x-forwarded-ssl',
  'x-forwarded-server',
  'x-forwarded-path',
  'x-original-forwarded-for',
  'x-original-url',
  'x-rewrite-url',
  'x-original-host',
  'true-client-ip',
  'x-client-ip',
  'cf-connecting-ip',
  'x-cluster-client-ip',
  'fastly-client-ip',
  'x-api-key',
  'keep-alive',
  'proxy-connection',
  'proxy-authorization',
  'trailer',
  'expect',
  // httpoxy (CGI's HTTP_PROXY), and the rest of Proxy-*
  'proxy',
  'proxy-anything',
  // what PHP client-IP helpers, auth proxies and frameworks read before REMOTE_ADDR
  'x-forwarded',
  'forwarded-for',
  'client-ip',
  'remote-addr',
  'x-originating-ip',
  'x-remote-ip',
  'x-remote-addr',
  'x-host',
  'x-forwarded-uri',
  'x-forwarded-user',
  'x-forwarded-email',
  'x-auth-request-user',
  'remote-user',
  'x-remote-user',
  'x-user',
  'x-http-method-override',
  'x-http-method',
  'x-method-override',
  // auth proxies' users, client certificates, the scheme and the original request as others pass them on
  'x-webauth-user',
  'x-auth-user',
  'x-remote-group',
  'x-client-cert',
  'ssl-client-cert',
  'x-ssl-client-verify',
  'x-ssl-client-s-dn',
  'front-end-https',
  'x-url-scheme',
  'x-scheme',
  'x-arr-ssl',
  'x-original-uri',
  'x-original-method',
  'x-envoy-original-path',
  // other edges' identity headers (found by an outside attack): Kong, AWS ALB, Azure App Service, Google IAP, Cloudflare Access
  'x-consumer-id',
  'x-consumer-username',
  'x-consumer-custom-id',
  'x-consumer-groups',
  'x-authenticated-userid',
  'x-authenticated-scope',
  'x-credential-identifier',
  'x-userinfo',
  'x-amzn-oidc-identity',
  'x-amzn-oidc-data',
  'x-ms-client-principal-name',
  'x-ms-client-principal',
  'x-ms-client-principal-idp',
  'x-ms-token-aad-access-token',
  'x-goog-authenticated-user-email',
  'x-goog-iap-jwt-assertion',
  'cf-access-authenticated-user-email',
  'cf-access-jwt-assertion',
  // framing look-alikes: only the real spellings frame a message
  'content-length',
  'transfer-encoding',
];
/** RFC 9110 tchar minus letters and digits: everything a header name may use as a separator. */
const SEPARATORS = ['-', '_', '.', '!', '#', '$', '%', '&', "'", '*', '+', '^', '`', '|', '~'];
const FORGED = 'forged-by-client';

/** Each name with all its dashes replaced by each separator, one dash at a time too, in mixed case. */
function lookAlikes(name: string): string[] {
  const out = new Set<string>();
  const dashes = [...name].flatMap((c, i) => (c === '-' ? [i] : []));
  for (const sep of SEPARATORS) {
    out.add(name.replaceAll('-', sep));
    for (const at of dashes) out.add(name.slice(0, at) + sep + name.slice(at + 1));
  }
  out.add(name.toUpperCase().replaceAll('-', '.'));
  out.add(name.replace(/(^|-)(\w)/g, (_m, dash: string, c: string) => dash + c.toUpperCase()).replaceAll('-', '_'));
  return [...out];
}

/** Authorization values that start like the Bearer scheme without being a compact JWS behind it. */
const BEARER_LOOK_ALIKES = [
  'Bearer,x.y.z',
  'BearerX x.y.z',
  'bearer\tx.y.z',
  `Bearer ${'a'.repeat(20)}`,
  'Bearer eyJhbGciOiJIUzI1NiJ9.e30.c2ln=',
];

describe('identity headers: no look-alike of an owned name reaches the upstream', () => {
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

  // X-API-Key itself is the credential, a sane X-Request-Id is kept for tracing, and Expect is
  // answered by the server (417 for anything but 100-continue): their exact spellings have their
  // own tests; every other spelling of them must go.
  const names = OWNED.flatMap(lookAlikes).filter(
    (n) => !['x-api-key', 'x-request-id', 'expect', 'content-length', 'transfer-encoding'].includes(n.toLowerCase()),
  );
  it(`${names.length} generated look-alike names, ${SEPARATORS.length} separators: the forged value never arrives`, async () => {
    const perRequest = 90; // under gateway.limits.maxHeaderCount with Host, X-API-Key and Connection
    let sent = 0;
    for (let i = 0; i < names.length; i += perRequest) {
      const batch = names.slice(i, i + perRequest);
      const exchange = await rawExchange(
        gatehouse.url,
        `GET /api/look-alikes HTTP/1.1\r\nHost: g\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\n${batch.map((n) => `${n}: ${FORGED}\r\n`).join('')}Connection: close\r\n\r\n`,
      );
      assert.equal(exchange.responses[0]?.status, 200, exchange.raw.slice(0, 300));
      sent++;
    }
    assert.equal(upstream.received.length, sent);
    for (const record of upstream.received) {
      const forged: string[] = [];
      for (let i = 0; i < record.rawHeaders.length; i += 2) {
        if (record.rawHeaders[i + 1]!.includes(FORGED)) forged.push(record.rawHeaders[i]!);
      }
      assert.deepEqual(forged, [], 'forged headers reached the upstream');
      assert.equal(record.headers['x-gatehouse-subject'], 'default');
      assert.equal(record.headers['x-gatehouse-key-id'], 'default');
      assert.equal(record.headers['x-forwarded-for'], '127.0.0.1');
    }
  });

  for (const value of BEARER_LOOK_ALIKES) {
    it(`Authorization ${JSON.stringify(value)} beside a valid key (no bearer configured): not forwarded`, async () => {
      const exchange = await rawExchange(
        gatehouse.url,
        `GET /api/bearer HTTP/1.1\r\nHost: g\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\nAuthorization: ${value}\r\nConnection: close\r\n\r\n`,
      );
      assert.equal(exchange.responses[0]?.status, 200, exchange.raw.slice(0, 200));
      assert.equal(
        upstream.received.at(-1)!.headers.authorization,
        undefined,
        'an unchecked bearer-like credential reached the upstream',
      );
    });
  }

  it("the admin console's session cookie never reaches the upstream; the client's other cookies do", async () => {
    for (const [cookie, expected] of [
      ['theme=dark; gatehouse_console=c0ns0le-sess10n; lang=en', 'theme=dark; lang=en'],
      ['gatehouse_console=c0ns0le-sess10n', undefined],
      [' gatehouse_console = c0ns0le-sess10n ;theme=dark', 'theme=dark'],
    ] as const) {
      const exchange = await rawExchange(
        gatehouse.url,
        `GET /api/page HTTP/1.1\r\nHost: g\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\nCookie: ${cookie}\r\nConnection: close\r\n\r\n`,
      );
      assert.equal(exchange.responses[0]?.status, 200, exchange.raw.slice(0, 200));
      const record = upstream.received.at(-1)!;
      assert.equal(record.headers.cookie, expected);
      assert.ok(!record.rawHeaders.join('\n').includes('c0ns0le-sess10n'), 'the session reached the upstream');
    }
  });

  it('plain names that only resemble an owned one are forwarded; names with characters outside [A-Za-z0-9-] never are', async () => {
    await rawExchange(
      gatehouse.url,
      `GET /api/ok HTTP/1.1\r\nHost: g\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\nX-Forward-To: kept\r\nX-Custom-Trace: kept\r\nX.Custom.Trace: dropped\r\nContent_Type: dropped\r\nConnection: close\r\n\r\n`,
    );
    const record = upstream.received.at(-1)!;
    assert.equal(record.headers['x-forward-to'], 'kept');
    assert.equal(record.headers['x-custom-trace'], 'kept');
    assert.equal(record.headers['x.custom.trace'], undefined);
    assert.equal(record.headers['content_type'], undefined);
  });
});

describe('identity headers: the JWT subject', () => {
  const SECRET = 'identity-test-secret-0123456789abcdefghijklmnop';
  let upstream: RecordingServer;
  let required: TestGatehouse;
  let optional: TestGatehouse;
  const sign = (claims: JWTPayload) =>
    new SignJWT(claims)
      .setProtectedHeader({ alg: 'HS256' })
      .setExpirationTime('5m')
      .sign(new TextEncoder().encode(SECRET));
  const bearerOnly = (requireSubject?: boolean) => {
    const config = testConfig(upstream.url, {
      gateway: {
        auth: {
          bearer: { jwt: { secret: SECRET, ...(requireSubject === undefined ? {} : { requireSubject }) } },
          failures: { max: 1000 },
        },
      },
    });
    delete config.gateway.auth.apiKey;
    return config;
  };
  before(async () => {
    upstream = await startRecordingUpstream();
    required = await startTestGatehouse(bearerOnly());
    optional = await startTestGatehouse(bearerOnly(false));
  });
  after(async () => {
    await required.close();
    await optional.close();
    await upstream.close();
  });

  /** The raw value of a header as the upstream's socket carried it (before any trimming). */
  const rawValue = (name: string) => {
    const raw = upstream.received.at(-1)!.rawHeaders;
    const at = raw.findIndex((n, i) => i % 2 === 0 && n.toLowerCase() === name);
    return at === -1 ? undefined : raw[at + 1];
  };

  it('spaces at either end of sub are percent-encoded, so the upstream cannot trim "  admin  " into "admin"', async () => {
    const token = await sign({ sub: '  admin  ' });
    const exchange = await rawExchange(
      required.url,
      `GET /api/me HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer ${token}\r\nConnection: close\r\n\r\n`,
    );
    assert.equal(exchange.responses[0]?.status, 200);
    assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-subject'], '%20%20admin%20%20');
    assert.equal(rawValue('x-gatehouse-subject'), '%20%20admin%20%20');
    await rawExchange(
      required.url,
      `GET /api/me HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer ${await sign({ sub: 'a b' })}\r\nConnection: close\r\n\r\n`,
    );
    assert.equal(rawValue('x-gatehouse-subject'), 'a b', 'inner spaces are kept as they are');
    await rawExchange(
      required.url,
      `GET /api/me HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer ${await sign({ sub: 'admin, root' })}\r\nConnection: close\r\n\r\n`,
    );
    assert.equal(rawValue('x-gatehouse-subject'), 'admin%2C root', 'a comma would read as a list');
  });

  for (const [label, claims] of [
    ['no sub', {}],
    ['an empty sub', { sub: '' }],
    ['a numeric sub', { sub: 42 }],
    ['a lone surrogate in sub (it would collide with U+FFFD)', { sub: 'ad\ud800min' }],
  ] as const) {
    it(`a token with ${label} is refused (401 invalid_token), the upstream untouched`, async () => {
      const before = upstream.received.length;
      const exchange = await rawExchange(
        required.url,
        `GET /api/me HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer ${await sign(claims as JWTPayload)}\r\nConnection: close\r\n\r\n`,
      );
      assert.equal(exchange.responses[0]?.status, 401);
      assert.equal(JSON.parse(exchange.responses[0]!.body).error.code, 'invalid_token');
      assert.equal(upstream.received.length, before);
    });
  }

  for (const value of BEARER_LOOK_ALIKES) {
    it(`Authorization ${JSON.stringify(value)}: 401 invalid_token, the upstream untouched`, async () => {
      const before = upstream.received.length;
      const exchange = await rawExchange(
        required.url,
        `GET /api/me HTTP/1.1\r\nHost: g\r\nAuthorization: ${value}\r\nConnection: close\r\n\r\n`,
      );
      assert.equal(exchange.responses[0]?.status, 401, exchange.raw.slice(0, 200));
      assert.equal(JSON.parse(exchange.responses[0]!.body).error.code, 'invalid_token');
      assert.equal(upstream.received.length, before);
    });
  }

  it('a valid token with padding added to its signature is refused: one token, one spelling', async () => {
    const token = await sign({ sub: 'ana' });
    const ok = await rawExchange(
      required.url,
      `GET /api/me HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer ${token}\r\nConnection: close\r\n\r\n`,
    );
    assert.equal(ok.responses[0]?.status, 200);
    const padded = await rawExchange(
      required.url,
      `GET /api/me HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer ${token}=\r\nConnection: close\r\n\r\n`,
    );
    assert.equal(padded.responses[0]?.status, 401);
  });

  it('requireSubject: false lets a token without sub through, with no subject header', async () => {
    const exchange = await rawExchange(
      optional.url,
      `GET /api/me HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer ${await sign({})}\r\nConnection: close\r\n\r\n`,
    );
    assert.equal(exchange.responses[0]?.status, 200);
    assert.equal(rawValue('x-gatehouse-subject'), undefined);
    assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-auth'], 'bearer');
  });
});
