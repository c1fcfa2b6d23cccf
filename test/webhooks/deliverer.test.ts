import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import { Webhook } from 'standardwebhooks';
import {
  afterFailure,
  attemptsInBudget,
  isRetryable,
  parseRetryAfter,
  retryDelayMs,
} from '../../src/webhooks/delivery/retry-policy.js';
import { signStandardWebhook } from '../../src/webhooks/delivery/sign.js';

const settings = { initialBackoffMs: 1_000, maxBackoffMs: 60_000 };
/** The largest value Math.random can return. */
const ALMOST_ONE = 1 - Number.EPSILON / 2;
const never = (): number => {
  throw new Error('random must not be consulted');
};

describe('retryDelayMs (capped exponential backoff, full jitter)', () => {
  it('is 0 when the jitter draws 0, whatever the attempt', () => {
    for (const attempt of [1, 2, 5, 30, 1_000])
      assert.equal(
        retryDelayMs(attempt, settings, undefined, () => 0),
        0,
        `attempt ${attempt}`,
      );
  });

  it('stays strictly below initial·2^(n-1) at the top of the jitter, and doubles per attempt', () => {
    const top = (attempt: number) => retryDelayMs(attempt, settings, undefined, () => ALMOST_ONE);
    assert.equal(top(1), 999);
    assert.equal(top(2), 1_999);
    assert.equal(top(3), 3_999);
    assert.equal(top(4), 7_999);
    assert.equal(top(6), 31_999);
  });

  it('is an integer scaled linearly by the random draw', () => {
    assert.equal(
      retryDelayMs(3, settings, undefined, () => 0.5),
      2_000,
    );
    assert.equal(
      retryDelayMs(3, settings, undefined, () => 0.25),
      1_000,
    );
    assert.ok(Number.isInteger(retryDelayMs(3, settings, undefined, () => 0.123456789)));
  });

  it('caps the window at maxBackoffMs', () => {
    assert.equal(
      retryDelayMs(7, settings, undefined, () => ALMOST_ONE),
      59_999,
      '64 s window capped to 60 s',
    );
    assert.equal(
      retryDelayMs(7, settings, undefined, () => 0.5),
      30_000,
    );
    assert.equal(
      retryDelayMs(20, settings, undefined, () => 0.5),
      30_000,
    );
  });

  it('does not overflow to NaN or Infinity for huge attempt numbers', () => {
    for (const attempt of [53, 1_025, 10_000, 1e9, Number.MAX_SAFE_INTEGER, Number.MAX_VALUE, Infinity]) {
      const top = retryDelayMs(attempt, settings, undefined, () => ALMOST_ONE);
      const mid = retryDelayMs(attempt, settings, undefined, () => 0.5);
      assert.equal(top, 59_999, `attempt ${attempt}`);
      assert.equal(mid, 30_000, `attempt ${attempt}`);
    }
    // Even with a huge initial backoff the cap holds.
    assert.equal(
      retryDelayMs(2_000, { initialBackoffMs: Number.MAX_SAFE_INTEGER, maxBackoffMs: 3_600_000 }, undefined, () => 0.5),
      1_800_000,
    );
  });

  it('with Math.random, every delay of many lies in [0, window)', () => {
    for (let i = 0; i < 2_000; i++) {
      const attempt = 1 + (i % 10);
      const window = Math.min(1_000 * 2 ** (attempt - 1), 60_000);
      const delay = retryDelayMs(attempt, settings);
      assert.ok(Number.isInteger(delay) && delay >= 0 && delay < window, `attempt ${attempt}: ${delay}`);
    }
  });

  it('a Retry-After past the backoff window is waited as asked, without jitter', () => {
    assert.equal(retryDelayMs(1, settings, 30_000, never), 30_000, 'longer than the attempt-1 window');
  });

  it('a Retry-After is the least wait, never a shorter one (found by outside attacks: Retry-After: 0 was a hot loop, a short one kept every retry that short)', () => {
    assert.equal(
      retryDelayMs(10, settings, 2_000, () => 0.5),
      30_000,
      'the attempt-10 draw is longer: it stands',
    );
    assert.equal(
      retryDelayMs(10, settings, 2_000, () => 0),
      2_000,
      'a draw shorter than the Retry-After waits for it',
    );
    assert.equal(
      retryDelayMs(5, settings, 0, () => 0.5),
      8_000,
      'Retry-After: 0 (or a past date) leaves the backoff as it is',
    );
    for (let attempt = 1; attempt <= 20; attempt++)
      assert.ok(retryDelayMs(attempt, settings, 0, () => 0.5) >= retryDelayMs(attempt, settings, undefined, () => 0.5));
  });

  it('a Retry-After is capped at maxBackoffMs', () => {
    assert.equal(retryDelayMs(1, settings, 86_400_000, never), 60_000);
    assert.equal(retryDelayMs(1, settings, Infinity, never), 60_000);
  });
});

describe('parseRetryAfter', () => {
  const now = Date.UTC(2024, 0, 15, 12, 0, 0);

  it('reads delta-seconds as milliseconds', () => {
    assert.equal(parseRetryAfter('120', now), 120_000);
    assert.equal(parseRetryAfter('0', now), 0);
    assert.equal(parseRetryAfter(' 7 ', now), 7_000);
    assert.equal(parseRetryAfter('007', now), 7_000);
  });

  it('reads an HTTP date as the time left until it', () => {
    assert.equal(parseRetryAfter(new Date(now + 90_000).toUTCString(), now), 90_000);
    assert.equal(parseRetryAfter('Mon, 15 Jan 2024 12:01:00 GMT', now), 60_000);
  });

  it('a date in the past means now (0), never negative', () => {
    assert.equal(parseRetryAfter('Mon, 15 Jan 2024 11:59:00 GMT', now), 0);
    assert.equal(parseRetryAfter('Sun, 06 Nov 1994 08:49:37 GMT', now), 0);
  });

  it('is undefined when the header is absent or plainly unreadable', () => {
    for (const value of [undefined, '', '   ', 'soon', 'abc', '5s', '1e3', '0x10', 'Tuesday', '12abc']) {
      assert.equal(parseRetryAfter(value, now), undefined, JSON.stringify(value));
    }
  });

  // V8's Date.parse is lenient ('1.5' → 2001-01-05, '-1' → 2001-01-01): such values are not HTTP dates
  // (RFC 9110 §10.2.3) and must not collapse the backoff to "retry now".
  it('is undefined for values Date.parse would leniently misread as dates', () => {
    for (const value of ['1.5', '-1', '1 2', '2024-01-01', 'soon']) {
      assert.equal(parseRetryAfter(value, now), undefined, JSON.stringify(value));
    }
  });

  it('a huge delta is finite or Infinity, and retryDelayMs caps it', () => {
    const huge = parseRetryAfter('9'.repeat(400), now);
    assert.ok(huge !== undefined && !Number.isNaN(huge));
    assert.equal(retryDelayMs(1, settings, huge, never), 60_000);
  });
});

describe('isRetryable', () => {
  it('retries no answer, 408, 429 and 5xx', () => {
    for (const status of [null, 408, 429, 500, 502, 503, 504]) assert.equal(isRetryable(status), true, String(status));
  });

  it('does not retry other 4xx', () => {
    for (const status of [400, 401, 403, 404, 405, 409, 410, 413, 422])
      assert.equal(isRetryable(status), false, String(status));
  });
});

describe('signStandardWebhook', () => {
  const body = '{"id":"evt_1","action":"message","payload":{"text":"grüße ✓"}}';
  const id = 'evt_0000abcdef';

  function headers(secret: string, timestamp = Math.floor(Date.now() / 1000), messageId = id, signedBody = body) {
    return {
      'webhook-id': messageId,
      'webhook-timestamp': String(timestamp),
      'webhook-signature': signStandardWebhook(secret, messageId, timestamp, signedBody),
    };
  }

  it('matches the Standard Webhooks reference vector', () => {
    const secret = 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw';
    const expected = 'v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=';
    assert.equal(
      new Webhook(secret).sign('msg_p5jXN8AQM9LWM0D4loKWxJek', new Date(1614265330 * 1000), '{"test": 2432232314}'),
      expected,
    );
    assert.equal(
      signStandardWebhook(secret, 'msg_p5jXN8AQM9LWM0D4loKWxJek', 1614265330, '{"test": 2432232314}'),
      expected,
    );
  });

  it('has the v1,<base64 of 32 bytes> shape', () => {
    assert.match(
      signStandardWebhook('whsec_' + randomBytes(32).toString('base64'), id, 1, body),
      /^v1,[A-Za-z0-9+/]{43}=$/,
    );
  });

  it('a whsec_<base64> secret verifies with standardwebhooks (the key is the decoded bytes)', () => {
    const secret = 'whsec_' + randomBytes(24).toString('base64');
    const h = headers(secret);
    assert.deepEqual(new Webhook(secret).verify(body, h), JSON.parse(body));
    // Proof the secret was decoded, not used as text: the raw-format verifier rejects it.
    assert.throws(() => new Webhook(secret, { format: 'raw' }).verify(body, h), /No matching signature/);
  });

  it('a plain secret verifies with standardwebhooks format "raw" (the key is its bytes)', () => {
    const secret = 'a-plain-target-secret-of-32-chars';
    assert.deepEqual(new Webhook(secret, { format: 'raw' }).verify(body, headers(secret)), JSON.parse(body));
  });

  it('a modified body, timestamp or id fails verification', () => {
    for (const secret of ['whsec_' + randomBytes(24).toString('base64'), 'a-plain-target-secret-of-32-chars']) {
      const wh = secret.startsWith('whsec_') ? new Webhook(secret) : new Webhook(secret, { format: 'raw' });
      const h = headers(secret);
      assert.throws(() => wh.verify(body.replace('grüße', 'grusse'), h), /No matching signature/, 'body');
      assert.throws(() => wh.verify(body + ' ', h), /No matching signature/, 'trailing byte');
      assert.throws(
        () => wh.verify(body, { ...h, 'webhook-timestamp': String(Number(h['webhook-timestamp']) + 1) }),
        /No matching signature/,
        'timestamp',
      );
      assert.throws(() => wh.verify(body, { ...h, 'webhook-id': id + 'x' }), /No matching signature/, 'id');
      assert.throws(
        () =>
          new Webhook(
            secret.startsWith('whsec_') ? 'whsec_' + randomBytes(24).toString('base64') : secret + 'x',
            secret.startsWith('whsec_') ? undefined : { format: 'raw' },
          ).verify(body, h),
        /No matching signature/,
        'other secret',
      );
    }
  });

  it('a signature with an old timestamp is refused by the verifier (replay window)', () => {
    const secret = 'whsec_' + randomBytes(24).toString('base64');
    assert.throws(
      () => new Webhook(secret).verify(body, headers(secret, Math.floor(Date.now() / 1000) - 600)),
      /too old/,
    );
  });
});

describe('afterFailure (a time budget from acceptance, an optional attempt cap)', () => {
  const HOUR = 3_600_000;
  const policy = { retryFor: 72 * HOUR, initialBackoffMs: 1_000, maxBackoffMs: HOUR };
  const accepted = 1_000_000_000_000;
  const fresh = { receivedAt: accepted, attempts: 0, roundAttempts: 0 };

  it('queued within the budget, at the backoff or the Retry-After', () => {
    assert.deepEqual(
      afterFailure(fresh, { status: 503 }, accepted + 10, policy, () => 0.5),
      { status: 'queued', nextAttemptAt: accepted + 10 + 500 },
    );
    assert.deepEqual(afterFailure(fresh, { status: 429, retryAfterMs: 120_000 }, accepted, policy, never), {
      status: 'queued',
      nextAttemptAt: accepted + 120_000,
    });
  });

  it('a backoff past receivedAt + retryFor is cut to the deadline, which is always tried; dead only after it', () => {
    const late = { receivedAt: accepted, attempts: 40, roundAttempts: 40 };
    const deadline = accepted + policy.retryFor;
    // The window is capped at 1 h: a draw of 0.5 puts the next attempt 30 min out.
    assert.deepEqual(
      afterFailure(late, { status: 503 }, deadline - 31 * 60_000, policy, () => 0.5),
      { status: 'queued', nextAttemptAt: deadline - 60_000 },
    );
    assert.deepEqual(
      afterFailure(late, { status: 503 }, deadline - 29 * 60_000, policy, () => 0.5),
      { status: 'queued', nextAttemptAt: deadline },
    );
    assert.deepEqual(
      afterFailure(late, { status: null, retryAfterMs: 10 * 60_000 }, deadline - 5 * 60_000, policy, () => 0),
      { status: 'queued', nextAttemptAt: deadline },
      'a Retry-After past the budget too',
    );
    // The attempt at the deadline failed: the budget is spent.
    assert.equal(afterFailure(late, { status: 503 }, deadline, policy, () => 0.5).status, 'dead');
    assert.equal(afterFailure(late, { status: 503 }, deadline + 1, policy, () => 0.5).status, 'dead');
  });

  it('a 4xx is dead at once; maxAttempts, when set, caps the round', () => {
    assert.equal(afterFailure(fresh, { status: 404 }, accepted, policy).status, 'dead');
    const capped = { ...policy, maxAttempts: 3 };
    assert.equal(
      afterFailure({ ...fresh, attempts: 1, roundAttempts: 1 }, { status: 503 }, accepted, capped).status,
      'queued',
    );
    assert.equal(
      afterFailure({ ...fresh, attempts: 2, roundAttempts: 2 }, { status: 503 }, accepted, capped).status,
      'dead',
    );
  });

  it('the default schedule keeps an event for days, not half an hour (the old 12 attempts)', () => {
    // With every draw at the top of the window, attempts continue until ~72 h have passed.
    let now = accepted;
    let event = { ...fresh };
    for (;;) {
      const outcome = afterFailure(event, { status: 503 }, now, policy, () => ALMOST_ONE);
      if (outcome.status !== 'queued') break;
      now = outcome.nextAttemptAt;
      event = { ...event, attempts: event.attempts + 1, roundAttempts: event.roundAttempts + 1 };
    }
    assert.ok(
      now - accepted > 71 * HOUR && now - accepted <= 72 * HOUR,
      `last attempt ${(now - accepted) / HOUR} h after acceptance`,
    );
  });

  it('a round started by `deliveries retry` (old event) gets the attempts an average round fits in the budget', () => {
    const old = { receivedAt: accepted - 30 * 24 * HOUR, attempts: 80, roundAttempts: 0 };
    const fits = attemptsInBudget(policy);
    assert.ok(fits > 140 && fits < 160, `${fits} attempts`);
    assert.equal(afterFailure(old, { status: 503 }, accepted, policy, () => 0.5).status, 'queued');
    assert.equal(
      afterFailure(
        { ...old, attempts: 80 + fits - 1, roundAttempts: fits - 1 },
        { status: 503 },
        accepted,
        policy,
        () => 0.5,
      ).status,
      'dead',
    );
  });
});
