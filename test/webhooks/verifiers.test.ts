import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { discordVerifier } from '../../src/webhooks/verifiers/discord.js';
import { metaVerifier } from '../../src/webhooks/verifiers/meta.js';

describe('verifiers: delivery ids and answers that depend on the body', () => {
  it('meta: WhatsApp status updates of one message (sent, delivered, read) are distinct deliveries', () => {
    const meta = metaVerifier({ appSecret: 'x'.repeat(16), verifyToken: 'token-1234' });
    const status = (s: string) => ({ entry: [{ id: '1', changes: [{ value: { statuses: [{ id: 'wamid.A', status: s }] } }] }] });
    const ids = ['sent', 'delivered', 'read'].map((s) => meta.deliveryId({}, status(s)));
    assert.deepEqual(ids, ['wamid.A:sent', 'wamid.A:delivered', 'wamid.A:read']);
    assert.equal(meta.deliveryId({}, { entry: [{ changes: [{ value: { messages: [{ id: 'wamid.M' }] } }] }] }), 'wamid.M');
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
