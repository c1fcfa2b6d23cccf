import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, it } from 'node:test';
import {
  exportJWK,
  exportSPKI,
  generateKeyPair,
  SignJWT,
  UnsecuredJWT,
  type CryptoKey,
  type JWK,
  type JWTPayload,
} from 'jose';
import { startTestGatehouse, testConfig, TEST_PLAIN_KEY, type TestGatehouse } from '../helpers/gatehouse.js';
import { request, type Reply } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

const SECRET = 'jwt-test-secret-0123456789abcdefghijklmnopqrstuvwxyz';
const ISSUER = 'https://issuer.test';
const AUDIENCE = 'gatehouse-tests';
const INVALID_TOKEN_CHALLENGE = 'Bearer realm="gatehouse", error="invalid_token"';

/**
 * A bearer-only gateway config: testConfig() always sets the plain apiKey and its deep merge keeps a
 * value overridden with `undefined`, so the key is deleted here unless `keepApiKey`.
 * The lockout is raised so that the many deliberate failures below never turn into 429s.
 */
function bearerConfig(
  upstreamUrl: string,
  jwt: Record<string, unknown>,
  auth: Record<string, unknown> = {},
  keepApiKey = false,
): Record<string, any> {
  const config = testConfig(upstreamUrl, { gateway: { auth: { bearer: { jwt }, failures: { max: 1000 }, ...auth } } });
  if (!keepApiKey) delete config.gateway.auth.apiKey;
  return config;
}

const now = () => Math.floor(Date.now() / 1000);

/** HS256 via jose; a 5-minute `exp` unless the claims carry one. */
function hs256(claims: JWTPayload, secret = SECRET): Promise<string> {
  const jwt = new SignJWT(claims).setProtectedHeader({ alg: 'HS256' });
  if (claims.exp === undefined) jwt.setExpirationTime('5m');
  return jwt.sign(new TextEncoder().encode(secret));
}

/** A JWT assembled by hand, so claims can take shapes jose's SignJWT would refuse (e.g. `exp` as a string). */
function handmadeHs256(payload: Record<string, unknown>, secret: string | Buffer = SECRET): string {
  const b64 = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url');
  const input = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64(payload)}`;
  return `${input}.${createHmac('sha256', secret).update(input).digest('base64url')}`;
}

const bearer = (token: string) => ({ authorization: `Bearer ${token}` });

/** 401 invalid_token with the RFC 6750 challenge, and nothing reached the upstream since `before`. */
function assertInvalidToken(reply: Reply, upstream: RecordingServer, before: number): void {
  assert.equal(reply.status, 401);
  assert.equal(reply.json().error.code, 'invalid_token');
  assert.equal(reply.headers['www-authenticate'], INVALID_TOKEN_CHALLENGE);
  assert.equal(upstream.received.length, before, 'the upstream must receive nothing');
}

async function expectRejected(
  gatehouse: TestGatehouse,
  upstream: RecordingServer,
  headers: Record<string, string>,
): Promise<void> {
  const before = upstream.received.length;
  assertInvalidToken(await request(gatehouse.url, '/api/jwt', { headers }), upstream, before);
}

describe('jwt: HS256 with a shared secret, issuer and audience pinned', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  const valid = (claims: JWTPayload = {}) => hs256({ iss: ISSUER, aud: AUDIENCE, sub: 'user-42', ...claims });

  before(async () => {
    upstream = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(
      bearerConfig(upstream.url, { secret: SECRET, issuer: ISSUER, audience: AUDIENCE }),
    );
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  it('a valid token passes: identity headers set, the bearer Authorization not forwarded', async () => {
    const reply = await request(gatehouse.url, '/api/me', {
      headers: { ...bearer(await valid()), 'x-gatehouse-subject': 'forged' },
    });
    assert.equal(reply.status, 200);
    const got = upstream.received.at(-1)!;
    assert.equal(got.url, '/api/me');
    assert.equal(got.headers['x-gatehouse-auth'], 'bearer');
    assert.equal(got.headers['x-gatehouse-subject'], 'user-42');
    assert.equal(got.headers['x-gatehouse-key-id'], undefined);
    assert.equal(got.headers.authorization, undefined);
  });

  it('a token without `sub` is refused (requireSubject), and a client-sent X-Gatehouse-Subject never reaches the upstream', async () => {
    const before = upstream.received.length;
    const refused = await request(gatehouse.url, '/api/nosub', {
      headers: { ...bearer(await hs256({ iss: ISSUER, aud: AUDIENCE })), 'x-gatehouse-subject': 'admin' },
    });
    assertInvalidToken(refused, upstream, before);
    const reply = await request(gatehouse.url, '/api/sub', {
      headers: { ...bearer(await hs256({ iss: ISSUER, aud: AUDIENCE, sub: 'ana' })), 'x-gatehouse-subject': 'admin' },
    });
    assert.equal(reply.status, 200);
    assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-subject'], 'ana');
  });

  it('the Bearer scheme is case-insensitive', async () => {
    const token = await valid();
    for (const scheme of ['bearer', 'BEARER', 'bEaReR']) {
      const reply = await request(gatehouse.url, '/api/case', { headers: { authorization: `${scheme} ${token}` } });
      assert.equal(reply.status, 200, scheme);
    }
  });

  it('"Bearer" without a token, or with a non-b64token value: invalid_token', async () => {
    await expectRejected(gatehouse, upstream, { authorization: 'Bearer' });
    await expectRejected(gatehouse, upstream, { authorization: 'Bearer   ' });
    await expectRejected(gatehouse, upstream, { authorization: `Bearer ${await valid()} extra` });
    await expectRejected(gatehouse, upstream, { authorization: 'Bearer not-a-jwt' });
  });

  it('expiry: past exp (beyond the tolerance) is refused, inside the 30 s tolerance passes, no exp is refused', async () => {
    await expectRejected(gatehouse, upstream, bearer(await valid({ exp: now() - 3600 })));
    await expectRejected(gatehouse, upstream, bearer(await valid({ exp: now() - 31 - 5 })));
    const lenient = await request(gatehouse.url, '/api/jwt', { headers: bearer(await valid({ exp: now() - 5 })) });
    assert.equal(lenient.status, 200);
    await expectRejected(gatehouse, upstream, bearer(handmadeHs256({ iss: ISSUER, aud: AUDIENCE, sub: 'no-exp' })));
  });

  it('a non-numeric exp is refused, even far in the future', async () => {
    const farFuture = String(now() + 3600);
    await expectRejected(
      gatehouse,
      upstream,
      bearer(handmadeHs256({ iss: ISSUER, aud: AUDIENCE, sub: 'x', exp: farFuture })),
    );
    await expectRejected(
      gatehouse,
      upstream,
      bearer(handmadeHs256({ iss: ISSUER, aud: AUDIENCE, sub: 'x', exp: null })),
    );
    // Control: the same hand-made token with a numeric exp passes, so the refusals above are about `exp`.
    const control = await request(gatehouse.url, '/api/jwt', {
      headers: bearer(handmadeHs256({ iss: ISSUER, aud: AUDIENCE, sub: 'x', exp: now() + 3600 })),
    });
    assert.equal(control.status, 200);
  });

  it('wrong or missing iss / aud are refused', async () => {
    await expectRejected(gatehouse, upstream, bearer(await valid({ iss: 'https://evil.test' })));
    await expectRejected(gatehouse, upstream, bearer(await valid({ aud: 'someone-else' })));
    await expectRejected(gatehouse, upstream, bearer(await hs256({ aud: AUDIENCE, sub: 'x' })));
    await expectRejected(gatehouse, upstream, bearer(await hs256({ iss: ISSUER, sub: 'x' })));
  });

  it('a token signed with another secret, or tampered with, is refused', async () => {
    await expectRejected(
      gatehouse,
      upstream,
      bearer(await hs256({ iss: ISSUER, aud: AUDIENCE, sub: 'x' }, 'another-secret-0123456789abcdefghijklmnop')),
    );
    const [h, , s] = (await valid()).split('.');
    const forgedPayload = Buffer.from(
      JSON.stringify({ iss: ISSUER, aud: AUDIENCE, sub: 'admin', exp: now() + 600 }),
    ).toString('base64url');
    await expectRejected(gatehouse, upstream, bearer(`${h}.${forgedPayload}.${s}`));
  });

  it('a `sub` with non-ASCII, CR/LF or % is percent-encoded in X-Gatehouse-Subject (no header injection)', async () => {
    const cases: [string, string][] = [
      ['josé/ü', 'jos%C3%A9/%C3%BC'],
      ['evil\r\nX-Injected: yes', 'evil%0D%0AX-Injected: yes'],
      ['100%', '100%25'],
      ['tab\there', 'tab%09here'],
    ];
    for (const [sub, expected] of cases) {
      const reply = await request(gatehouse.url, '/api/subject', { headers: bearer(await valid({ sub })) });
      assert.equal(reply.status, 200, JSON.stringify(sub));
      const got = upstream.received.at(-1)!;
      assert.equal(got.headers['x-gatehouse-subject'], expected);
      assert.equal(got.headers['x-injected'], undefined);
    }
  });

  // A lone UTF-16 surrogate is valid JSON ("\ud800") and made encodeURIComponent throw (a 500) once.
  it("a `sub` holding a lone surrogate is refused (it would reach the upstream as U+FFFD, another subject's name), not a 500", async () => {
    const before = upstream.received.length;
    const reply = await request(gatehouse.url, '/api/surrogate', { headers: bearer(await valid({ sub: 'a\ud800b' })) });
    assertInvalidToken(reply, upstream, before);
    const accented = await request(gatehouse.url, '/api/accented', {
      headers: bearer(await valid({ sub: 'ana\u00e9 \ud83d\ude00' })),
    });
    assert.equal(accented.status, 200);
    assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-subject'], 'ana%C3%A9 %F0%9F%98%80');
  });
});

describe('jwt: RS256 with a PEM public key', () => {
  let upstream: RecordingServer;
  let gatehouse: TestGatehouse;
  let privateKey: CryptoKey;
  let pem: string;

  before(async () => {
    const pair = await generateKeyPair('RS256');
    privateKey = pair.privateKey;
    pem = await exportSPKI(pair.publicKey);
    upstream = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(bearerConfig(upstream.url, { publicKey: pem }));
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
  });

  it('a valid RS256 token passes', async () => {
    const token = await new SignJWT({ sub: 'rsa-user' })
      .setProtectedHeader({ alg: 'RS256' })
      .setExpirationTime('5m')
      .sign(privateKey);
    const reply = await request(gatehouse.url, '/api/rsa', { headers: bearer(token) });
    assert.equal(reply.status, 200);
    assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-subject'], 'rsa-user');
    assert.equal(upstream.received.at(-1)!.headers.authorization, undefined);
  });

  it('alg confusion: HS256 signed with the public key PEM as the HMAC secret is refused', async () => {
    const claims = { sub: 'admin', exp: now() + 600 };
    await expectRejected(gatehouse, upstream, bearer(await hs256(claims, pem)));
    await expectRejected(gatehouse, upstream, bearer(handmadeHs256(claims, pem.trim())));
  });

  it('alg none (unsecured JWT) is refused', async () => {
    const token = new UnsecuredJWT({ sub: 'admin' }).setExpirationTime('5m').encode();
    await expectRejected(gatehouse, upstream, bearer(token));
    const [, payload] = token.split('.');
    const noneCased = `${Buffer.from('{"alg":"NONE"}').toString('base64url')}.${payload}.`;
    await expectRejected(gatehouse, upstream, bearer(noneCased));
  });
});

interface JwksServer {
  url: string;
  fetches: number;
  publish(keys: JWK[]): void;
  close(): Promise<void>;
}

async function startJwksServer(keys: JWK[]): Promise<JwksServer> {
  let current = keys;
  const state = { fetches: 0 };
  const server = http.createServer((req, res) => {
    if (req.url !== '/.well-known/jwks.json') {
      res.writeHead(404).end();
      return;
    }
    state.fetches++;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ keys: current }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/.well-known/jwks.json`,
    get fetches() {
      return state.fetches;
    },
    publish(next) {
      current = next;
    },
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

async function rsaKey(kid: string): Promise<{ kid: string; privateKey: CryptoKey; jwk: JWK }> {
  const { privateKey, publicKey } = await generateKeyPair('RS256');
  return { kid, privateKey, jwk: { ...(await exportJWK(publicKey)), kid, alg: 'RS256', use: 'sig' } };
}

describe('jwt: RS256 via a JWKS URL', () => {
  let upstream: RecordingServer;
  let jwks: JwksServer;
  let gatehouse: TestGatehouse;
  let first: Awaited<ReturnType<typeof rsaKey>>;
  let second: Awaited<ReturnType<typeof rsaKey>>;
  let neverPublished: Awaited<ReturnType<typeof rsaKey>>;
  const sign = (key: { privateKey: CryptoKey }, kid: string, sub = 'jwks-user') =>
    new SignJWT({ sub }).setProtectedHeader({ alg: 'RS256', kid }).setExpirationTime('5m').sign(key.privateKey);

  before(async () => {
    [first, second, neverPublished] = await Promise.all([rsaKey('k1'), rsaKey('k2'), rsaKey('k3')]);
    upstream = await startRecordingUpstream();
    jwks = await startJwksServer([first.jwk]);
    gatehouse = await startTestGatehouse(bearerConfig(upstream.url, { jwksUri: jwks.url, jwksCooldownSeconds: 0 }));
  });
  after(async () => {
    await gatehouse.close();
    await jwks.close();
    await upstream.close();
  });

  it('the JWKS is fetched at start, before any request', async () => {
    await waitFor(() => jwks.fetches >= 1, { timeoutMs: 2_000, what: 'a JWKS fetch' });
    assert.equal(jwks.fetches, 1);
  });

  it('a JWKS without audience is warned about at start (tokens for any client of the provider would pass)', () => {
    const warnings = gatehouse.logs.filter((l) => l.level === 'warn').map((l) => l.msg as string);
    assert.ok(
      warnings.some((m) => m.startsWith('gateway.auth.bearer.jwt.audience: not set')),
      warnings.join('\n'),
    );
  });

  it('a valid token with a published kid passes, and requests never refetch a cached key set', async () => {
    for (let i = 0; i < 3; i++) {
      const reply = await request(gatehouse.url, '/api/jwks', { headers: bearer(await sign(first, 'k1')) });
      assert.equal(reply.status, 200);
    }
    assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-subject'], 'jwks-user');
    assert.equal(jwks.fetches, 1);
  });

  it('a kid pointing at a published key but signed by another key is refused', async () => {
    await expectRejected(gatehouse, upstream, bearer(await sign(neverPublished, 'k1')));
  });

  it('key rotation: an unknown kid triggers a refetch, the new key passes, a never-published key does not', async () => {
    jwks.publish([second.jwk]);
    const before = jwks.fetches;
    const reply = await request(gatehouse.url, '/api/rotated', {
      headers: bearer(await sign(second, 'k2', 'rotated-user')),
    });
    assert.equal(reply.status, 200);
    assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-subject'], 'rotated-user');
    assert.equal(jwks.fetches, before + 1);

    await expectRejected(gatehouse, upstream, bearer(await sign(neverPublished, 'k3')));
    // The retired key is gone from the set too.
    await expectRejected(gatehouse, upstream, bearer(await sign(first, 'k1')));
  });
});

describe('jwt: require all / any with an API key and a bearer token', () => {
  let upstream: RecordingServer;
  let all: TestGatehouse;
  let any: TestGatehouse;
  const token = () => hs256({ sub: 'both-user' });

  before(async () => {
    upstream = await startRecordingUpstream();
    all = await startTestGatehouse(bearerConfig(upstream.url, { secret: SECRET }, { require: 'all' }, true));
    any = await startTestGatehouse(bearerConfig(upstream.url, { secret: SECRET }, { require: 'any' }, true));
  });
  after(async () => {
    await all.close();
    await any.close();
    await upstream.close();
  });

  it('require all: the key alone or the token alone is missing_credentials; nothing is forwarded', async () => {
    const before = upstream.received.length;
    for (const headers of [{ 'x-api-key': TEST_PLAIN_KEY }, bearer(await token())]) {
      const reply = await request(all.url, '/api/all', { headers });
      assert.equal(reply.status, 401);
      assert.equal(reply.json().error.code, 'missing_credentials');
      assert.equal(reply.headers['www-authenticate'], 'Bearer realm="gatehouse"');
    }
    assert.equal(upstream.received.length, before);
  });

  it('require all: key and token together pass, with both methods, the JWT subject and the key id', async () => {
    const reply = await request(all.url, '/api/all', {
      headers: { 'x-api-key': TEST_PLAIN_KEY, ...bearer(await token()) },
    });
    assert.equal(reply.status, 200);
    const got = upstream.received.at(-1)!;
    assert.equal(got.headers['x-gatehouse-auth'], 'api-key,bearer');
    assert.equal(got.headers['x-gatehouse-subject'], 'both-user');
    assert.equal(got.headers['x-gatehouse-key-id'], 'default');
    assert.equal(got.headers.authorization, undefined);
    assert.equal(got.headers['x-api-key'], undefined);
  });

  it('require all: a valid key with a bad token is invalid_token', async () => {
    const before = upstream.received.length;
    const reply = await request(all.url, '/api/all', {
      headers: { 'x-api-key': TEST_PLAIN_KEY, ...bearer(await hs256({ sub: 'x', exp: now() - 3600 })) },
    });
    assertInvalidToken(reply, upstream, before);
  });

  it('require any: each credential alone passes', async () => {
    assert.equal((await request(any.url, '/api/any', { headers: { 'x-api-key': TEST_PLAIN_KEY } })).status, 200);
    assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-auth'], 'api-key');
    assert.equal((await request(any.url, '/api/any', { headers: bearer(await token()) })).status, 200);
    assert.equal(upstream.received.at(-1)!.headers['x-gatehouse-auth'], 'bearer');
  });

  it('require any: a valid key never lets a bad token ride along', async () => {
    for (const bad of [
      await hs256({ sub: 'x' }, 'wrong-secret-0123456789abcdefghijklmnop'),
      await hs256({ sub: 'x', exp: now() - 3600 }),
    ]) {
      const before = upstream.received.length;
      const reply = await request(any.url, '/api/any', { headers: { 'x-api-key': TEST_PLAIN_KEY, ...bearer(bad) } });
      assertInvalidToken(reply, upstream, before);
    }
    const before = upstream.received.length;
    assertInvalidToken(
      await request(any.url, '/api/any', { headers: { 'x-api-key': TEST_PLAIN_KEY, authorization: 'Bearer' } }),
      upstream,
      before,
    );
  });

  it("several Authorization lines are refused whatever the first one's scheme (found by an outside attack: a Basic line hid the Bearer behind it)", async () => {
    const bad = await hs256({ sub: 'x' }, 'wrong-secret-0123456789abcdefghijklmnop');
    for (const lines of [
      ['Basic YTpi', `Bearer ${bad}`],
      ['Basic YTpi', 'Basic Yzpk'],
      [`Bearer ${await token()}`, 'Basic YTpi'],
    ]) {
      const before = upstream.received.length;
      const headers: [string, string][] = [
        ['x-api-key', TEST_PLAIN_KEY],
        ...lines.map((l): [string, string] => ['authorization', l]),
      ];
      assertInvalidToken(await request(any.url, '/api/any', { headers }), upstream, before);
    }
  });
});
