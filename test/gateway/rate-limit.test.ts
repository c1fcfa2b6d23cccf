import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseConfig } from '../../src/config/load.js';
import type { Identity } from '../../src/gateway/credentials/authenticate.js';
import { compileRateLimiter, RateLimitState, TokenBuckets } from '../../src/gateway/rate-limit.js';

/** A clock the test moves by hand: no sleeps. */
function manualClock(start = 1_000_000) {
  let now = start;
  return { now: () => now, advance: (ms: number) => (now += ms) };
}

const keyIdentity = (keyId: string, keyRateLimit?: { requests: number; per: number }): Identity => ({
  methods: ['api-key'],
  subject: keyId,
  keyId,
  scopes: [],
  claims: undefined,
  keyRateLimit,
});

function limitsOf(rateLimits: unknown[], apiKeys: unknown[] = []) {
  const config = parseConfig({
    gateway: { upstream: { target: 'http://127.0.0.1:1' }, rateLimits, auth: { apiKeys } },
  });
  return {
    rateLimits: config.gateway.rateLimits,
    keyQuotas: config.gateway.auth.apiKeys.map((k) => k.rateLimit),
    apiKeys: config.gateway.auth.apiKeys,
  };
}

describe('token bucket', () => {
  it('a full bucket gives `capacity` tokens, then refills at requests/per', () => {
    const buckets = new TokenBuckets({ capacity: 3, refillPerMs: 3 / 60_000 });
    let at = 0;
    for (let i = 0; i < 3; i++) buckets.take('a', at, buckets.available('a', at));
    assert.equal(buckets.available('a', at), 0);
    at += 20_000; // one token per 20 s
    assert.equal(buckets.available('a', at), 1);
    at += 600_000;
    assert.equal(buckets.available('a', at), 3, 'never above capacity');
  });

  it('is bounded: past maxBuckets the oldest bucket goes', () => {
    const buckets = new TokenBuckets({ capacity: 1, refillPerMs: 1 }, 2);
    for (const key of ['a', 'b', 'c']) buckets.take(key, 0, 1);
    assert.equal(buckets.size, 2);
    assert.equal(buckets.available('a', 0), 1, 'a was dropped: full again');
    assert.equal(buckets.available('c', 0), 0);
  });
});

describe('rate limiter', () => {
  it('N allowed, then 429 with Retry-After and the draft RateLimit headers; refills with the clock', () => {
    const clock = manualClock();
    const { rateLimits, keyQuotas } = limitsOf([{ by: 'key', requests: 5, per: '1m' }]);
    const limiter = compileRateLimiter(rateLimits, keyQuotas, new RateLimitState(), clock.now);
    for (let i = 1; i <= 5; i++) {
      const { headers, refused } = limiter.check('GET', '/api/x', keyIdentity('ci'), '127.0.0.1');
      assert.equal(refused, undefined);
      assert.equal(headers!['ratelimit-policy'], '"key";q=5;w=60');
      // 12 s per token: after i takes, i tokens are missing → 12·i s until full.
      assert.equal(headers!.ratelimit, `"key";r=${5 - i};t=${12 * i}`);
    }
    const { refused } = limiter.check('GET', '/api/x', keyIdentity('ci'), '127.0.0.1');
    assert.equal(refused?.code, 'rate_limited');
    assert.equal(refused.status, 429);
    assert.equal(refused.headers!['retry-after'], '12');
    assert.equal(refused.headers!.ratelimit, '"key";r=0;t=60');
    assert.equal(refused.headers!['ratelimit-policy'], '"key";q=5;w=60');

    clock.advance(7_000);
    assert.equal(
      limiter.check('GET', '/api/x', keyIdentity('ci'), '127.0.0.1').refused?.headers!['retry-after'],
      '5',
      '5 s to the next token',
    );
    clock.advance(5_000);
    assert.equal(
      limiter.check('GET', '/api/x', keyIdentity('ci'), '127.0.0.1').refused,
      undefined,
      'one token back after 12 s',
    );
    assert.equal(limiter.check('GET', '/api/x', keyIdentity('ci'), '127.0.0.1').refused?.code, 'rate_limited');
    assert.equal(
      limiter.check('GET', '/api/x', keyIdentity('other'), '127.0.0.1').refused,
      undefined,
      'another key has its own bucket',
    );
  });

  it('burst sets the bucket size; refusal charges no other limit', () => {
    const clock = manualClock();
    const { rateLimits, keyQuotas } = limitsOf([
      { by: 'ip', requests: 100, per: '1s' },
      { by: 'subject', requests: 1, per: '1h', burst: 2 },
    ]);
    const limiter = compileRateLimiter(rateLimits, keyQuotas, new RateLimitState(), clock.now);
    const first = limiter.check('GET', '/api/x', keyIdentity('ci'), '10.0.0.1');
    assert.equal(first.headers!['ratelimit-policy'], '"ip";q=100;w=1, "subject";q=1;w=3600');
    assert.equal(first.headers!.ratelimit, '"ip";r=99;t=1, "subject";r=1;t=3600');
    assert.equal(limiter.check('GET', '/api/x', keyIdentity('ci'), '10.0.0.1').refused, undefined);
    const refused = limiter.check('GET', '/api/x', keyIdentity('ci'), '10.0.0.1').refused!;
    assert.equal(refused.headers!['retry-after'], '3600');
    assert.equal(
      refused.headers!.ratelimit,
      '"ip";r=98;t=1, "subject";r=0;t=7200',
      'the ip bucket was not charged for the refused request',
    );
  });

  it('paths and methods narrow a limit; IPv6 counts per /64', () => {
    const clock = manualClock();
    const { rateLimits, keyQuotas } = limitsOf([
      { by: 'ip', requests: 1, per: '1m', paths: ['/api/search/**'], methods: ['POST'] },
    ]);
    const limiter = compileRateLimiter(rateLimits, keyQuotas, new RateLimitState(), clock.now);
    assert.equal(
      limiter.check('GET', '/api/search/x', keyIdentity('k'), '2001:db8::1').headers,
      undefined,
      'GET is not limited',
    );
    assert.equal(
      limiter.check('POST', '/api/other', keyIdentity('k'), '2001:db8::1').headers,
      undefined,
      'another path is not limited',
    );
    assert.equal(limiter.check('POST', '/api/search', keyIdentity('k'), '2001:db8::1').refused, undefined);
    assert.equal(
      limiter.check('POST', '/api/search/q', keyIdentity('k'), '2001:db8::ffff').refused?.code,
      'rate_limited',
      'same /64',
    );
    assert.equal(
      limiter.check('POST', '/api/search/q', keyIdentity('k'), '2001:db8:0:1::1').refused,
      undefined,
      'another /64',
    );
  });

  it("a key's own rateLimit replaces the by-key limits for that key only", () => {
    const clock = manualClock();
    const { rateLimits, keyQuotas, apiKeys } = limitsOf(
      [{ by: 'key', requests: 1, per: '1m' }],
      [{ id: 'bulk', hash: 'sha256:' + 'a'.repeat(64), rateLimit: { requests: 3, per: '1m' } }],
    );
    const limiter = compileRateLimiter(rateLimits, keyQuotas, new RateLimitState(), clock.now);
    const bulk = keyIdentity('bulk', apiKeys[0]!.rateLimit);
    for (let i = 0; i < 3; i++) assert.equal(limiter.check('GET', '/api/x', bulk, '1.2.3.4').refused, undefined);
    assert.equal(limiter.check('GET', '/api/x', bulk, '1.2.3.4').refused?.code, 'rate_limited');
    assert.equal(limiter.check('GET', '/api/x', keyIdentity('plain'), '1.2.3.4').refused, undefined);
    assert.equal(limiter.check('GET', '/api/x', keyIdentity('plain'), '1.2.3.4').refused?.code, 'rate_limited');
  });

  it('a new limiter over the same state keeps the buckets of unchanged limits, and only those', () => {
    const clock = manualClock();
    const state = new RateLimitState();
    const before = limitsOf([
      { by: 'key', requests: 2, per: '1m' },
      { by: 'ip', requests: 2, per: '1m' },
    ]);
    const first = compileRateLimiter(before.rateLimits, before.keyQuotas, state, clock.now);
    first.check('GET', '/api/x', keyIdentity('k'), '1.1.1.1');
    first.check('GET', '/api/x', keyIdentity('k'), '1.1.1.1');
    const after = limitsOf([
      { by: 'key', requests: 2, per: '1m' },
      { by: 'ip', requests: 3, per: '1m' },
    ]);
    const second = compileRateLimiter(after.rateLimits, after.keyQuotas, state, clock.now);
    state.retain(second.signatures);
    const refused = second.check('GET', '/api/x', keyIdentity('k'), '1.1.1.1').refused!;
    assert.equal(refused.code, 'rate_limited');
    assert.equal(
      refused.headers!.ratelimit,
      '"key";r=0;t=60, "ip";r=3;t=0',
      'key bucket kept (empty), ip bucket new (full)',
    );
  });

  it('a 1/N share scales every bucket (gateway.workers)', () => {
    const clock = manualClock();
    const { rateLimits, keyQuotas } = limitsOf([{ by: 'key', requests: 4, per: '1m' }]);
    const limiter = compileRateLimiter(rateLimits, keyQuotas, new RateLimitState(1 / 2), clock.now);
    assert.equal(limiter.check('GET', '/api/x', keyIdentity('k'), '1.1.1.1').refused, undefined);
    assert.equal(limiter.check('GET', '/api/x', keyIdentity('k'), '1.1.1.1').refused, undefined);
    assert.equal(limiter.check('GET', '/api/x', keyIdentity('k'), '1.1.1.1').refused?.code, 'rate_limited');
  });

  it('a share never makes a bucket smaller than one request', () => {
    const clock = manualClock();
    const { rateLimits, keyQuotas } = limitsOf([{ by: 'key', requests: 1, per: '1m' }]);
    const limiter = compileRateLimiter(rateLimits, keyQuotas, new RateLimitState(1 / 4), clock.now);
    assert.equal(limiter.check('GET', '/api/x', keyIdentity('k'), '1.1.1.1').refused, undefined);
    const refused = limiter.check('GET', '/api/x', keyIdentity('k'), '1.1.1.1').refused!;
    assert.equal(refused.headers!['retry-after'], '240', 'a quarter of the refill rate: 1 per 4 min in this worker');
  });
});
