/**
 * qr channels end to end: `gatehouse channels login <name>` prints a QR code of the pairing URL,
 * a device POSTs its name to it on the running server and gets its token once; the device then
 * posts messages with that token and polls its outbox; revoking it stops its token at once.
 * Pairing codes: at most 3 pending, unknown 404, used or expired 410, each counted by the lockout.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { request } from '../helpers/http.js';
import type { CliResult } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import {
  API_KEY,
  assertNotInStorage,
  channelsCli,
  decodeTerminalQr,
  envelopes,
  nthEnvelope,
  settledEnvelopeCount,
  sqliteQueued,
  startGatehouse,
  storageBytes,
  startLogin,
  withDatabase,
  removeWorkspace,
  workspace,
  writeConfig,
  type RunningGatehouse,
  type RunningLogin,
  type Workspace,
} from './helpers.js';

const ALPHABET = /^[23456789ABCDEFGHJKMNPQRSTVWXYZ]{8}$/;
const json = { 'content-type': 'application/json' };

describe('qr channel: pairing, device messages, outbox, revoke', () => {
  let ws: Workspace;
  let target: RecordingServer;
  let upstream: RecordingServer;
  let gatehouse: RunningGatehouse;
  const logins: RunningLogin[] = [];

  before(async () => {
    [target, upstream, ws] = await Promise.all([startRecordingUpstream(), startRecordingUpstream(), workspace('qr')]);
    // A small lockout, so its counting shows; each failing request comes from its own loopback address.
    writeConfig(ws, {
      channels: { phone: { kind: 'qr', action: 'message' }, kiosk: { kind: 'qr' }, desk: { kind: 'qr' } },
      targetUrl: target.url,
      upstreamUrl: upstream.url,
      failuresMax: 3,
    });
    gatehouse = await startGatehouse(ws);
  });
  after(async () => {
    await Promise.all(logins.map((l) => l.kill()));
    await gatehouse?.stop();
    await Promise.all([target?.close(), upstream?.close()]);
    removeWorkspace(ws);
  });

  /** Starts `channels login <name>` and waits until it shows its pairing URL and code. */
  async function pairingLogin(name: string): Promise<{ login: RunningLogin; url: string; code: string }> {
    const login = startLogin(ws, name);
    logins.push(login);
    const [, url, code] = await login.waitForOutput(/\n {2}(http:\/\/\S+\/pair\/(\S+))\npairing code: (?:\S+)/);
    return { login, url: url!, code: code! };
  }

  const pair = (url: string, deviceName: string, localAddress?: string) =>
    request(url, new URL(url).pathname, {
      method: 'POST',
      headers: json,
      body: JSON.stringify({ deviceName }),
      localAddress,
    });

  /** A device paired through the whole ceremony. */
  async function pairedDevice(deviceName: string, channel = 'phone'): Promise<{ id: string; token: string }> {
    const { login, url } = await pairingLogin(channel);
    const reply = await pair(url, deviceName);
    assert.equal(reply.status, 201, reply.body);
    assert.equal((await login.exited).code, 0);
    return { id: reply.json().deviceId, token: reply.json().token };
  }

  const postMessage = (token: string, body: Record<string, unknown>, localAddress?: string) =>
    request(gatehouse.webhookUrl, '/webhook/channels/phone', {
      method: 'POST',
      headers: { ...json, authorization: `Bearer ${token}` },
      body: JSON.stringify(body),
      localAddress,
    });
  const outbox = (token: string, localAddress?: string) =>
    request(gatehouse.webhookUrl, '/webhook/channels/phone/outbox', {
      headers: { authorization: `Bearer ${token}` },
      localAddress,
    });
  const send = (body: Record<string, unknown>, headers: Record<string, string> = { 'x-api-key': API_KEY }) =>
    request(gatehouse.gatewayUrl, '/_gatehouse/channels/phone/messages', {
      method: 'POST',
      headers: { ...json, ...headers },
      body: JSON.stringify(body),
    });

  it('login prints a QR code of the pairing URL and an 8-character code; the device gets a token once; the CLI says "paired" and exits 0', async () => {
    const { login, url, code } = await pairingLogin('phone');
    assert.match(code, ALPHABET);
    assert.equal(url, `${ws.webhookUrl}/webhook/channels/phone/pair/${code}`);
    assert.match(login.output(), new RegExp(`pairing code: ${code} \\(valid 10 minutes\\)`));
    assert.equal(decodeTerminalQr(login.output()), url, 'the terminal QR code does not decode to the pairing URL');
    assert.ok(login.running(), 'login must wait for the device');

    const reply = await pair(url, 'Ana phone');
    assert.equal(reply.status, 201, reply.body);
    const { token, deviceId, messagesUrl, outboxUrl } = reply.json();
    assert.match(token, /^ghd_[A-Za-z0-9_-]{43}$/);
    assert.match(deviceId, /^dev_[0-9a-f]{16}$/);
    assert.equal(messagesUrl, '/webhook/channels/phone');
    assert.equal(outboxUrl, '/webhook/channels/phone/outbox');
    assert.equal(reply.headers['cache-control'], 'no-store');

    const done = await login.exited;
    assert.equal(done.code, 0, done.stderr);
    assert.match(done.stdout, /✓ pair\s+paired: Ana phone \(dev_/);
    assert.match(done.stdout, /channel phone connected/);

    // Once: the same code again gives no second token.
    const again = await pair(url, 'Mallory laptop', '127.0.0.2');
    assert.equal(again.status, 410);
    assert.equal(again.json().error.code, 'pairing_gone');
    assert.equal(again.body.includes('ghd_'), false);
    const names = withDatabase(ws, (db) =>
      db
        .prepare("SELECT name FROM channel_devices WHERE channel = 'phone'")
        .all()
        .map((r: any) => r.name),
    );
    assert.ok(!names.includes('Mallory laptop'));
    // Stored hashed: neither the token nor the code is in the SQLite files.
    assertNotInStorage(ws, token, 'the device token');
    assert.equal(storageBytes(ws).includes(Buffer.from(code)), false, 'the pairing code is stored in clear');
    // Nor in the logs: the request line shows the pairing path with the code redacted.
    const pairingLine = await gatehouse.process.waitFor(
      (l) => l.msg === 'request' && typeof l.path === 'string' && l.path.includes('/pair/'),
    );
    assert.equal(pairingLine.path, '/webhook/channels/phone/pair/[redacted]');
    assert.ok(!JSON.stringify(gatehouse.process.lines).includes(code), 'the pairing code is in the log');
  });

  describe('with a paired device', () => {
    let device: { id: string; token: string };
    before(async () => {
      device = await pairedDevice('Bo phone');
    });

    it('a message with the device token reaches the target: channel, from (the paired device, not the body), text, raw payload; deduped by the device id', async () => {
      const seen = envelopes(target).length;
      const body = { id: 'm-1', text: 'hello from the phone', from: 'someone-else', extra: { n: 1 } };
      const reply = await postMessage(device.token, body);
      assert.equal(reply.status, 202, reply.body);
      const envelope = await nthEnvelope(target, seen + 1);
      assert.equal(envelope.action, 'message');
      assert.equal(envelope.endpoint, '/webhook/channels/phone');
      assert.deepEqual(envelope.channel, { name: 'phone', kind: 'qr', platform: 'device' });
      assert.deepEqual(envelope.from, { deviceId: device.id, deviceName: 'Bo phone' });
      assert.equal(envelope.text, 'hello from the phone');
      assert.deepEqual(envelope.payload, body);

      const resent = await postMessage(device.token, body);
      assert.equal(resent.status, 200);
      assert.equal(resent.json().status, 'duplicate');
      assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen + 1);
    });

    it('a forged, missing or other-channel token gets 401 and nothing reaches the target', async () => {
      const seen = envelopes(target).length;
      const forged = await postMessage(`ghd_${'A'.repeat(43)}`, { text: 'forged' }, '127.0.0.3');
      assert.equal(forged.status, 401);
      assert.equal(forged.json().error.code, 'invalid_token');
      const none = await request(gatehouse.webhookUrl, '/webhook/channels/phone', {
        method: 'POST',
        headers: json,
        body: '{"text":"anonymous"}',
        localAddress: '127.0.0.3',
      });
      assert.equal(none.status, 401);
      // A phone token is not a kiosk token.
      const elsewhere = await request(gatehouse.webhookUrl, '/webhook/channels/kiosk', {
        method: 'POST',
        headers: { ...json, authorization: `Bearer ${device.token}` },
        body: '{"text":"wrong channel"}',
        localAddress: '127.0.0.4',
      });
      assert.equal(elsewhere.status, 401);
      assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen);
    });

    it('outbound: the message waits in the device outbox and is handed over once; without the API key nothing is queued', async () => {
      const noKey = await send({ to: 'Bo phone', text: 'sneaked in' }, {});
      assert.equal(noKey.status, 401);
      const badKey = await send({ to: 'Bo phone', text: 'sneaked in' }, { 'x-api-key': `${API_KEY}x` });
      assert.equal(badKey.status, 401);

      const sent = await send({ to: 'Bo phone', text: 'your parcel is here' });
      assert.equal(sent.status, 200, sent.body);
      assert.equal(sent.json().channel, 'phone');
      assert.equal(sent.json().to, device.id);
      assert.match(sent.json().id, /^\d+$/);
      const byId = await send({ to: device.id, text: 'second' });
      assert.equal(byId.status, 200, byId.body);

      const first = await outbox(device.token);
      assert.equal(first.status, 200, first.body);
      assert.deepEqual(
        first.json().messages.map((m: any) => m.text),
        ['your parcel is here', 'second'],
      );
      assert.equal(String(first.json().messages[0].id), sent.json().id);
      const second = await outbox(device.token);
      assert.deepEqual(second.json().messages, []);

      const unknown = await send({ to: 'nobody', text: 'x' });
      assert.equal(unknown.status, 400);
      assert.equal(unknown.json().error.code, 'invalid_message');
      const forged = await outbox(`ghd_${'B'.repeat(43)}`, '127.0.0.5');
      assert.equal(forged.status, 401);
      assert.equal(upstream.received.length, 0, 'the channel API must not reach the /api/ upstream');
    });
  });

  it('revoke: the device token fails at once (messages and outbox); other devices keep working', async () => {
    const [keeper, doomed] = await Promise.all([pairedDevice('Cy phone'), pairedDevice('Old tablet')]);
    assert.equal((await postMessage(doomed.token, { text: 'still here' })).status, 202);
    const seen = await settledEnvelopeCount(target, sqliteQueued(ws));

    const revoke = await channelsCli(ws, ['revoke', 'phone', 'Old tablet']);
    assert.equal(revoke.code, 0, revoke.stderr);
    assert.match(revoke.stdout, /revoked 1 device\n/);

    const refused = await postMessage(doomed.token, { text: 'after revoke' }, '127.0.0.6');
    assert.equal(refused.status, 401);
    assert.equal((await outbox(doomed.token, '127.0.0.6')).status, 401);
    assert.equal((await postMessage(keeper.token, { text: 'keeper' })).status, 202);
    assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen + 1);
    assert.ok(!envelopes(target).some((e) => e.text === 'after revoke'));

    const [devices, twice] = await Promise.all([
      channelsCli(ws, ['devices', 'phone', '--json']),
      channelsCli(ws, ['revoke', 'phone', 'Old tablet']),
    ]);
    assert.equal(devices.code, 0, devices.stderr);
    const byName = new Map(JSON.parse(devices.stdout).map((d: any) => [d.name, d]));
    assert.match((byName.get('Old tablet') as any)?.revokedAt, /^\d{4}-\d\d-\d\dT/, 'revokedAt is an ISO 8601 date');
    assert.equal((byName.get('Cy phone') as any)?.revokedAt, null);
    assert.equal(twice.code, 1);
    assert.match(twice.stderr, /no active device "Old tablet" on channel phone/);
  });

  describe('pairing codes', () => {
    const pending: { login: RunningLogin; url: string; code: string }[] = [];
    const refused: CliResult[] = [];
    before(async () => {
      // Four logins at once (as four terminals would): three get a code, one refuses cleanly.
      const outcomes = await Promise.all(
        Array.from({ length: 4 }, async () => {
          const login = startLogin(ws, 'kiosk');
          logins.push(login);
          const [, url, code] = await login
            .waitForOutput(/\n {2}(http:\/\/\S+\/pair\/(\S+))\npairing code: /, 40_000) // four processes at once on a loaded 2-core machine
            .catch(() => []);
          return url ? { pending: { login, url, code: code! } } : { refused: await login.exited };
        }),
      );
      for (const o of outcomes) {
        if (o.pending) pending.push(o.pending);
        else refused.push(o.refused!);
      }
    });

    it('at most 3 pending, even for logins started at once: the 4th refuses and makes no code', () => {
      assert.equal(
        pending.length,
        3,
        `pending: ${pending.length}; refused: ${refused.map((r) => r.stderr).join('; ')}`,
      );
      assert.equal(new Set(pending.map((p) => p.code)).size, 3);
      assert.equal(refused.length, 1);
      assert.equal(refused[0]!.code, 1);
      assert.match(
        refused[0]!.stderr,
        /^gatehouse: channel kiosk: 3 pairing codes are already pending; use one, or wait until they expire \(10 minutes\)\n$/,
      );
      const rows = withDatabase(
        ws,
        (db) => (db.prepare("SELECT count(*) AS n FROM channel_pairings WHERE channel = 'kiosk'").get() as any).n,
      );
      assert.equal(rows, 3);
    });

    it('unknown 404, reused 410, expired 410, each counted by the lockout: the next request (even a valid code) is 429', async () => {
      const [expiring, used, valid] = pending as [(typeof pending)[0], (typeof pending)[0], (typeof pending)[0]];
      // The code's 10 minutes are over (as the clock would make them).
      withDatabase(ws, (db) =>
        db
          .prepare('UPDATE channel_pairings SET expires_at = ? WHERE code_hash = ?')
          .run(Date.now() - 1, createHash('sha256').update(expiring.code).digest('hex')),
      );
      assert.equal((await pair(used.url, 'Kiosk 1')).status, 201);
      assert.equal((await used.login.exited).code, 0);

      const attacker = '127.0.0.7';
      const unknown = await pair(`${gatehouse.webhookUrl}/webhook/channels/kiosk/pair/ZZZZZZZZ`, 'Mallory', attacker);
      assert.equal(unknown.status, 404);
      assert.equal(unknown.json().error.code, 'pairing_not_found');
      const reused = await pair(used.url, 'Mallory', attacker);
      assert.equal(reused.status, 410);
      const expired = await pair(expiring.url, 'Mallory', attacker);
      assert.equal(expired.status, 410);
      assert.equal(expired.json().error.code, 'pairing_gone');

      const locked = await pair(valid.url, 'Mallory', attacker);
      assert.equal(locked.status, 429);
      assert.ok(Number(locked.headers['retry-after']) > 0);
      assert.ok(valid.login.running(), 'the locked-out request must not have used the code');
      const names = withDatabase(ws, (db) =>
        db
          .prepare("SELECT name FROM channel_devices WHERE channel = 'kiosk'")
          .all()
          .map((r: any) => r.name),
      );
      assert.deepEqual(names, ['Kiosk 1']);

      // Another client is not locked out: the code still works.
      assert.equal((await pair(valid.url, 'Kiosk 2')).status, 201);
      assert.equal((await valid.login.exited).code, 0);
    });
  });

  it('logout revokes every device of the channel at once; status and devices say so', async () => {
    const device = await pairedDevice('Front desk', 'desk');
    const post = (localAddress?: string) =>
      request(gatehouse.webhookUrl, '/webhook/channels/desk', {
        method: 'POST',
        headers: { ...json, authorization: `Bearer ${device.token}` },
        body: '{"text":"ring"}',
        localAddress,
      });
    assert.equal((await post()).status, 202);
    const [before] = (await channelsCli(ws, ['status', 'desk', '--json']).then((r) => JSON.parse(r.stdout))) as Record<
      string,
      any
    >[];
    assert.equal(before!.connected, true);
    assert.deepEqual(before!.details.devices, ['Front desk']);

    const logout = await channelsCli(ws, ['logout', 'desk']);
    assert.equal(logout.code, 0, logout.stderr);
    const seen = envelopes(target).length;
    assert.equal((await post('127.0.0.8')).status, 401);
    assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen);
    const [after, devices] = await Promise.all([
      channelsCli(ws, ['status', 'desk']),
      channelsCli(ws, ['devices', 'desk']),
    ]);
    assert.match(after.stdout, /^✗ desk \(qr, device\): not connected: run `gatehouse channels login desk`$/m);
    assert.match(devices.stdout, new RegExp(`^${device.id} {2}Front desk {15}revoked \\d{4}-`, 'm'));
  });
});
