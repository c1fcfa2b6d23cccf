import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { SignJWT } from 'jose';
import { parseConfig } from '../../src/config/load.js';
import { JwtVerifier } from '../../src/gateway/credentials/jwt.js';

const SECRET = 'jwt-cache-secret-0123456789abcdefghijkl';

async function verifierWith(jwt: Record<string, unknown>) {
  const config = parseConfig({
    gateway: {
      upstream: { target: 'http://127.0.0.1:1' },
      auth: { bearer: { jwt: { secret: SECRET, clockToleranceSeconds: 0, ...jwt } } },
    },
  });
  return JwtVerifier.create(config.gateway.auth.bearer!.jwt);
}

/** The verdict and subject (the claims ride along; the cache returns the same ones). */
const subjectOf = (check: Awaited<ReturnType<JwtVerifier['verify']>>) =>
  check.ok ? { ok: true, subject: check.subject } : check;

const sign = (expSeconds: number, sub = 'cached-user') =>
  new SignJWT({ sub })
    .setProtectedHeader({ alg: 'HS256' })
    .setExpirationTime(expSeconds)
    .sign(new TextEncoder().encode(SECRET));

describe('jwt: the verified-token cache', () => {
  it('a cached token stops passing once its exp is reached', async () => {
    const verifier = await verifierWith({ cacheSeconds: 60 });
    const exp = Math.floor(Date.now() / 1000) + 2;
    const token = await sign(exp);
    assert.deepEqual(subjectOf(await verifier.verify(token)), { ok: true, subject: 'cached-user' });
    assert.deepEqual(subjectOf(await verifier.verify(token)), { ok: true, subject: 'cached-user' });
    // Once exp is reached the cache entry is void and jose refuses the token.
    await new Promise((r) => setTimeout(r, exp * 1000 + 50 - Date.now()));
    const after = await verifier.verify(token);
    assert.equal(after.ok, false);
  });

  it('cacheSeconds: 0 verifies every time (and still works)', async () => {
    const verifier = await verifierWith({ cacheSeconds: 0 });
    const token = await sign(Math.floor(Date.now() / 1000) + 3600);
    assert.deepEqual(subjectOf(await verifier.verify(token)), { ok: true, subject: 'cached-user' });
    assert.deepEqual(subjectOf(await verifier.verify(token)), { ok: true, subject: 'cached-user' });
  });

  it('a tampered token never hits the cache entry of the real one', async () => {
    const verifier = await verifierWith({ cacheSeconds: 60 });
    const token = await sign(Math.floor(Date.now() / 1000) + 3600);
    assert.equal((await verifier.verify(token)).ok, true);
    const [h, , sig] = token.split('.');
    const forged = `${h}.${Buffer.from(JSON.stringify({ sub: 'admin', exp: 9999999999 })).toString('base64url')}.${sig}`;
    assert.equal((await verifier.verify(forged)).ok, false);
  });
});
