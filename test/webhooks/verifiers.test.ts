import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { createHmac } from 'node:crypto';
import { createVerifier } from '../../src/webhooks/verifiers/index.js';
import { discordVerifier } from '../../src/webhooks/verifiers/discord.js';
import { metaVerifier } from '../../src/webhooks/verifiers/meta.js';

describe('verifiers: delivery ids and answers that depend on the body', () => {
  it('meta: WhatsApp status updates of one message (sent, delivered, read) are distinct deliveries', () => {
    const meta = metaVerifier({ appSecret: 'x'.repeat(16), verifyToken: 'token-1234' });
    const status = (s: string) => ({
      entry: [{ id: '1', changes: [{ value: { statuses: [{ id: 'wamid.A', status: s }] } }] }],
    });
    const ids = ['sent', 'delivered', 'read'].map((s) => meta.deliveryId({}, status(s)));
    assert.deepEqual(ids, ['wamid.A:sent', 'wamid.A:delivered', 'wamid.A:read']);
    assert.equal(
      meta.deliveryId({}, { entry: [{ changes: [{ value: { messages: [{ id: 'wamid.M' }] } }] }] }),
      'wamid.M',
    );
  });

  it('meta: an id part that is an object (own "toString": String() would throw) gives no delivery id, and no throw', () => {
    const meta = metaVerifier({ appSecret: 'x'.repeat(16), verifyToken: 'token-1234' });
    const hostile = JSON.parse('{"toString":1,"valueOf":1}');
    assert.equal(
      meta.deliveryId({}, { entry: [{ changes: [{ value: { statuses: [{ id: hostile, status: 'read' }] } }] }] }),
      undefined,
    );
    assert.equal(
      meta.deliveryId({}, { entry: [{ changes: [{ value: { statuses: [{ id: 'wamid.A', status: hostile }] } }] }] }),
      undefined,
    );
    assert.equal(meta.deliveryId({}, { entry: [{ id: hostile, time: 1 }] }), undefined);
    assert.equal(meta.deliveryId({}, { entry: [{ id: '42', time: 1700000000 }] }), '42:1700000000');
  });

  it('github and meta: the replay key is a digest of the signature bytes, the same for either hex case', () => {
    const body = Buffer.from('{"zen":"Keep it logically awesome."}');
    const secret = 'replay-key-secret-0123456789';
    const hex = createHmac('sha256', secret).update(body).digest('hex');
    for (const verifier of [
      createVerifier({ type: 'github', secrets: [secret] }),
      createVerifier({ type: 'meta', appSecret: secret, verifyToken: 'token-1234' }),
    ]) {
      const lower = { 'x-hub-signature-256': `sha256=${hex}` };
      const upper = { 'x-hub-signature-256': `sha256=${hex.toUpperCase()}` };
      assert.deepEqual(
        verifier.verifyBody!(upper, body, 0),
        { ok: true },
        'upper-case hex verifies (so it must not be a new key)',
      );
      const key = verifier.replayKey!(lower);
      assert.equal(verifier.replayKey!(upper), key);
      assert.match(key, /^sha256:[0-9a-f]{64}$/);
      assert.ok(!key.includes(hex), 'not the signature itself');
      assert.notEqual(
        verifier.replayKey!({
          'x-hub-signature-256': `sha256=${createHmac('sha256', secret).update('{}').digest('hex')}`,
        }),
        key,
      );
    }
  });

  it('only senders that sign no timestamp have a replay key', () => {
    const withTimestamps = [
      createVerifier({ type: 'stripe', secrets: ['whsec_0123456789abcdef'], toleranceSeconds: 300 }),
      createVerifier({ type: 'slack', signingSecret: '0123456789abcdef', toleranceSeconds: 300 }),
      createVerifier({ type: 'secret', secret: '0123456789abcdef' }),
    ];
    for (const verifier of withTimestamps) assert.equal(verifier.replayKey, undefined);
  });

  it('discord: each interaction type gets the deferred response Discord accepts for it', () => {
    const discord = discordVerifier({ publicKey: '00'.repeat(32), toleranceSeconds: 300 });
    const answer = (type: number) => JSON.parse(discord.acceptedAnswer!({ type }).body);
    assert.deepEqual(answer(2), { type: 5 }); // application command: "thinking…"
    assert.deepEqual(answer(3), { type: 6 }); // message component: deferred update
    assert.deepEqual(answer(5), { type: 6 }); // modal submit
    assert.deepEqual(answer(4), { type: 8, data: { choices: [] } }); // autocomplete cannot be deferred
  });
});
