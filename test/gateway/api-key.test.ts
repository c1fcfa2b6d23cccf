import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseExpiry } from '../../src/cli/gateway.js';
import { parseConfig } from '../../src/config/load.js';
import { ConfigError, UsageError } from '../../src/errors.js';
import {
  ApiKeyVerifier,
  generateApiKey,
  hasValidKeyChecksum,
  hashApiKey,
} from '../../src/gateway/credentials/api-key.js';

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
const KEY_FORMAT = /^gth_[0-9A-Za-z]{38}$/;

describe('api key format: generateApiKey', () => {
  it('is gth_ followed by 38 base62 characters', () => {
    for (let i = 0; i < 100; i++) assert.match(generateApiKey(), KEY_FORMAT);
  });

  it('never repeats over 1000 draws', () => {
    const keys = new Set(Array.from({ length: 1000 }, () => generateApiKey()));
    assert.equal(keys.size, 1000);
  });

  it('uses the whole base62 alphabet in the random part', () => {
    const seen = new Set<string>();
    for (let i = 0; i < 200; i++) for (const c of generateApiKey().slice(4, 36)) seen.add(c);
    assert.equal(seen.size, 62);
  });
});

describe('api key format: hasValidKeyChecksum', () => {
  it('is true for generated keys', () => {
    for (let i = 0; i < 100; i++) assert.equal(hasValidKeyChecksum(generateApiKey()), true);
  });

  it('is false when any single character changes, at every position', () => {
    const key = generateApiKey();
    for (let i = 0; i < key.length; i++) {
      for (const replacement of BASE62 + '_') {
        if (replacement === key[i]) continue;
        const changed = key.slice(0, i) + replacement + key.slice(i + 1);
        assert.equal(hasValidKeyChecksum(changed), false, `position ${i} → ${replacement}`);
      }
    }
  });

  it('is false for wrong lengths, prefixes and characters', () => {
    const key = generateApiKey();
    for (const bad of [
      '',
      'gth_',
      key.slice(0, -1),
      key + 'a',
      key.replace('gth_', 'ghp_'),
      key.replace('gth_', 'GTH_'),
      key.slice(0, 10) + '-' + key.slice(11),
      ` ${key}`,
      `${key}\n`,
    ]) {
      assert.equal(hasValidKeyChecksum(bad), false, JSON.stringify(bad));
    }
  });
});

describe('api key hashing: hashApiKey', () => {
  it('is "sha256:" + lowercase hex of SHA-256 over the UTF-8 key', () => {
    // FIPS 180-2 test vector for "abc".
    assert.equal(hashApiKey('abc'), 'sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
    assert.match(hashApiKey(generateApiKey()), /^sha256:[0-9a-f]{64}$/);
  });
});

describe('api key verification: ApiKeyVerifier', () => {
  const plainKey = 'plain-key-0123456789abcdefghijklmnopqrstuv';
  const current = generateApiKey();
  const expiring = generateApiKey();
  const now = Date.parse('2026-06-01T00:00:00Z');
  const verifier = new ApiKeyVerifier({
    apiKey: plainKey,
    apiKeys: [
      { id: 'ci', hash: hashApiKey(current) },
      { id: 'old', hash: hashApiKey(expiring), expiresAt: '2026-06-01T00:00:00Z' },
    ],
  });

  it('counts the plain key and every hashed key', () => {
    assert.equal(verifier.size, 3);
  });

  it('the plain gateway.auth.apiKey is reported as id "default"', () => {
    assert.deepEqual(verifier.verify(plainKey, now), {
      ok: true,
      id: 'default',
      grant: { id: 'default', scopes: [], rateLimit: undefined },
    });
  });

  it('a hashed key is reported under its id', () => {
    assert.deepEqual(verifier.verify(current, now), {
      ok: true,
      id: 'ci',
      grant: { id: 'ci', scopes: [], rateLimit: undefined },
    });
  });

  it('a key is valid until just before expiresAt and expired from then on', () => {
    assert.deepEqual(verifier.verify(expiring, now - 1), {
      ok: true,
      id: 'old',
      grant: { id: 'old', scopes: [], rateLimit: undefined },
    });
    assert.deepEqual(verifier.verify(expiring, now), { ok: false, reason: 'expired' });
    assert.deepEqual(verifier.verify(expiring, now + 86_400_000), { ok: false, reason: 'expired' });
  });

  it('a gth_ key with a bad checksum is malformed (rejected before lookup)', () => {
    const last = current.at(-1) === 'a' ? 'b' : 'a';
    assert.deepEqual(verifier.verify(current.slice(0, -1) + last, now), { ok: false, reason: 'malformed' });
    assert.deepEqual(verifier.verify('gth_short', now), { ok: false, reason: 'malformed' });
  });

  it('an oversized key is malformed', () => {
    assert.deepEqual(verifier.verify('x'.repeat(513), now), { ok: false, reason: 'malformed' });
  });

  it('a well-formed key that is not configured is unknown', () => {
    assert.deepEqual(verifier.verify(generateApiKey(), now), { ok: false, reason: 'unknown' });
    assert.deepEqual(verifier.verify('some-other-key-0123456789abcdefghijkl', now), { ok: false, reason: 'unknown' });
    assert.deepEqual(verifier.verify('', now), { ok: false, reason: 'unknown' });
    assert.deepEqual(verifier.verify(plainKey.toUpperCase(), now), { ok: false, reason: 'unknown' });
  });

  it('with no keys configured, everything is unknown', () => {
    const empty = new ApiKeyVerifier({ apiKeys: [] });
    assert.equal(empty.size, 0);
    assert.deepEqual(empty.verify(current, now), { ok: false, reason: 'unknown' });
  });

  it('a hand-made plain apiKey using the gth_ prefix is refused at config load (it could never match)', () => {
    const lookalike = 'gth_my-own-handmade-secret-0123456789abcdef';
    assert.deepEqual(new ApiKeyVerifier({ apiKey: lookalike, apiKeys: [] }).verify(lookalike, now), {
      ok: false,
      reason: 'malformed',
    });
    assert.throws(
      () => parseConfig({ gateway: { upstream: { target: 'http://127.0.0.1:1' }, auth: { apiKey: lookalike } } }),
      (err: unknown) => err instanceof ConfigError && err.problems.some((p) => p.startsWith('gateway.auth.apiKey:')),
    );
    const generated = generateApiKey();
    assert.doesNotThrow(() =>
      parseConfig({ gateway: { upstream: { target: 'http://127.0.0.1:1' }, auth: { apiKey: generated } } }),
    );
  });
});

describe('api key expiry: parseExpiry (gatehouse gateway api-key generate --expires)', () => {
  const now = Date.parse('2026-01-01T00:00:00Z');

  it('reads durations in m, h, d, w, y', () => {
    assert.equal(parseExpiry('90d', now).getTime(), now + 90 * 86_400_000);
    assert.equal(parseExpiry('12h', now).getTime(), now + 12 * 3_600_000);
    assert.equal(parseExpiry('30m', now).getTime(), now + 30 * 60_000);
    assert.equal(parseExpiry('2w', now).getTime(), now + 14 * 86_400_000);
    assert.equal(parseExpiry('1y', now).getTime(), now + 365 * 86_400_000);
  });

  it('reads an ISO date or date-time as an absolute expiry', () => {
    assert.equal(parseExpiry('2027-03-04', now).toISOString(), '2027-03-04T00:00:00.000Z');
    assert.equal(parseExpiry('2027-03-04T05:06:07Z', now).toISOString(), '2027-03-04T05:06:07.000Z');
    assert.equal(parseExpiry('2027-03-04T05:06:07+02:00', now).toISOString(), '2027-03-04T03:06:07.000Z');
  });

  it('throws UsageError on values that are neither', () => {
    for (const bad of [
      '',
      'soon',
      '90',
      'd',
      '90D',
      '-1d',
      '1.5d',
      '90 d',
      '3s',
      'tomorrow',
      '01/02/2030',
      '2030-13-01',
    ]) {
      assert.throws(() => parseExpiry(bad, now), UsageError, JSON.stringify(bad));
    }
  });

  it('throws UsageError on a date in the past or now', () => {
    assert.throws(() => parseExpiry('2025-12-31', now), UsageError);
    assert.throws(() => parseExpiry('2026-01-01T00:00:00Z', now), UsageError);
  });

  it('throws UsageError on a calendar date that does not exist', () => {
    // V8's Date.parse rolls "2030-02-30" over to 2030-03-02: a typo must not become another expiry.
    assert.throws(() => parseExpiry('2030-02-30', now), UsageError);
  });
});
