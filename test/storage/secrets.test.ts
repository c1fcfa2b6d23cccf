import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import { UsageError } from '../../src/errors.js';
import { openSealed, openSecret, sealSecret, secretKeysFromEnv } from '../../src/storage/secrets.js';

describe('sealed secrets (AES-256-GCM under GATEHOUSE_SECRET_KEY)', () => {
  const key = { current: randomBytes(32), previous: [] };
  const another = () => ({ current: randomBytes(32), previous: [] });

  it('round-trips, and never contains the plaintext', () => {
    const sealed = sealSecret('1//0refresh-token-value', key, 'gmail:ana@example.com');
    assert.match(sealed, /^v1:[\w-]+:[\w-]+:[\w-]+$/);
    assert.ok(!sealed.includes('refresh-token'));
    assert.equal(openSecret(sealed, key, 'gmail:ana@example.com'), '1//0refresh-token-value');
  });

  it('each sealing uses a fresh IV', () => {
    assert.notEqual(sealSecret('same', key, 'c'), sealSecret('same', key, 'c'));
  });

  it('does not open with another key, under another context, or once altered', () => {
    const sealed = sealSecret('token', key, 'channel:tg');
    assert.throws(() => openSecret(sealed, another(), 'channel:tg'), UsageError);
    assert.throws(
      () => openSecret(sealed, key, 'channel:other'),
      UsageError,
      'a sealed value moved to another row does not open',
    );
    const [v, iv, tag, data] = sealed.split(':');
    const flipped = Buffer.from(data!, 'base64url');
    flipped[0]! ^= 1;
    assert.throws(
      () => openSecret([v, iv, tag, flipped.toString('base64url')].join(':'), key, 'channel:tg'),
      UsageError,
    );
    assert.throws(() => openSecret('plain-token', key, 'channel:tg'), UsageError);
    // A truncated GCM tag (Node would accept 4 bytes) is refused.
    assert.throws(
      () =>
        openSecret(
          [v, iv, Buffer.from(tag!, 'base64url').subarray(0, 4).toString('base64url'), data].join(':'),
          key,
          'channel:tg',
        ),
      UsageError,
    );
  });

  it('the key must be 32 bytes of base64; the error says how to make one', () => {
    assert.deepEqual(secretKeysFromEnv({ GATEHOUSE_SECRET_KEY: key.current.toString('base64') }), key);
    for (const env of [
      {},
      { GATEHOUSE_SECRET_KEY: '' },
      { GATEHOUSE_SECRET_KEY: randomBytes(16).toString('base64') },
      { GATEHOUSE_SECRET_KEY: 'not base64 at all!' },
    ]) {
      assert.throws(
        () => secretKeysFromEnv(env),
        (err: Error) => err instanceof UsageError && /openssl rand -base64 32/.test(err.message),
      );
    }
  });

  it('after a rotation: previous keys open (and say so), only the current key seals', () => {
    const [oldKey, olderKey, newKey] = [randomBytes(32), randomBytes(32), randomBytes(32)];
    const keys = secretKeysFromEnv({
      GATEHOUSE_SECRET_KEY: newKey.toString('base64'),
      GATEHOUSE_SECRET_KEY_PREVIOUS: ` ${oldKey.toString('base64')}, ${olderKey.toString('base64')} `,
    });
    assert.deepEqual(keys, { current: newKey, previous: [oldKey, olderKey] });
    const sealedBefore = sealSecret('refresh-token', { current: olderKey, previous: [] }, 'gmail:ana@example.com');
    assert.deepEqual(openSealed(sealedBefore, keys, 'gmail:ana@example.com'), {
      plaintext: 'refresh-token',
      underCurrentKey: false,
    });
    const sealedNow = sealSecret('refresh-token', keys, 'gmail:ana@example.com');
    assert.deepEqual(openSealed(sealedNow, { current: newKey, previous: [] }, 'gmail:ana@example.com'), {
      plaintext: 'refresh-token',
      underCurrentKey: true,
    });
    assert.throws(
      () => openSecret(sealedNow, { current: oldKey, previous: [olderKey] }, 'gmail:ana@example.com'),
      /cannot decrypt the stored secret for gmail:ana@example.com: neither GATEHOUSE_SECRET_KEY nor a key in GATEHOUSE_SECRET_KEY_PREVIOUS is the key it was stored with/,
    );
    // A malformed previous key is named, with its position.
    assert.throws(
      () =>
        secretKeysFromEnv({
          GATEHOUSE_SECRET_KEY: newKey.toString('base64'),
          GATEHOUSE_SECRET_KEY_PREVIOUS: `${oldKey.toString('base64')},short`,
        }),
      (err: Error) =>
        /^GATEHOUSE_SECRET_KEY_PREVIOUS \(key 2 of 2\) is not 32 bytes of base64 \(got 3 bytes\)\. It holds the keys GATEHOUSE_SECRET_KEY had before a rotation/.test(
          err.message,
        ) && !/openssl rand/.test(err.message),
    );
  });
});
