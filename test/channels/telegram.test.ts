/**
 * bot-token (Telegram) channels end to end, against the local fake Bot API: login (getMe, then
 * setWebhook at publicUrl + /webhook/channels/<name> with a generated secret token, stored
 * sealed), inbound updates checked by X-Telegram-Bot-Api-Secret-Token and deduped by update_id,
 * outbound sendMessage with the configured bot token, status, logout.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { startFakeTelegram, type FakeTelegram } from '../helpers/fake-chat.js';
import { request } from '../helpers/http.js';
import type { CliResult } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import {
  API_KEY,
  assertCallsDocumented,
  assertNotInStorage,
  channelsCli,
  envelopes,
  nthEnvelope,
  settledEnvelopeCount,
  sqliteQueued,
  startGatehouse,
  startLogin,
  statusJson,
  storedGrant,
  removeWorkspace,
  withDatabase,
  workspace,
  writeConfig,
  type RunningGatehouse,
  type Workspace,
} from './helpers.js';

const json = { 'content-type': 'application/json' };
const UNKNOWN_BOT_TOKEN = '123456:AAunknown-bot-token-0123456789abcdefgh';

describe('bot-token channel (Telegram)', () => {
  let ws: Workspace;
  let fake: FakeTelegram;
  let target: RecordingServer;
  let upstream: RecordingServer;
  let gatehouse: RunningGatehouse;

  before(async () => {
    [fake, target, upstream, ws] = await Promise.all([
      startFakeTelegram(),
      startRecordingUpstream(),
      startRecordingUpstream(),
      workspace('telegram'),
    ]);
    const common = { kind: 'bot-token', platform: 'telegram', publicUrl: ws.webhookUrl, apiBaseUrl: fake.url };
    writeConfig(ws, {
      channels: { tg: { ...common, botToken: fake.token }, tgbad: { ...common, botToken: UNKNOWN_BOT_TOKEN } },
      targetUrl: target.url,
      upstreamUrl: upstream.url,
    });
    gatehouse = await startGatehouse(ws);
  });
  after(async () => {
    await gatehouse?.stop();
    await Promise.all([fake?.close(), target?.close(), upstream?.close()]);
    removeWorkspace(ws);
  });

  const calls = (method: string) => fake.calls.filter((c) => c.path.toLowerCase().endsWith(`/${method.toLowerCase()}`));
  const send = (body: Record<string, unknown>, headers: Record<string, string> = { 'x-api-key': API_KEY }) =>
    request(gatehouse.gatewayUrl, '/_gatehouse/channels/tg/messages', {
      method: 'POST',
      headers: { ...json, ...headers },
      body: JSON.stringify(body),
    });
  const postUpdate = (update: Record<string, unknown>, secret: string | undefined) =>
    request(gatehouse.webhookUrl, '/webhook/channels/tg', {
      method: 'POST',
      headers: { ...json, ...(secret === undefined ? {} : { 'x-telegram-bot-api-secret-token': secret }) },
      body: JSON.stringify(update),
    });
  const message = (text: string) => ({
    message: {
      message_id: 7,
      from: { id: 4242, is_bot: false, first_name: 'Ana', username: 'ana' },
      chat: { id: 4242, type: 'private' },
      date: 1_700_000_000,
      text,
    },
  });

  it('a bad bot token: login fails at step "token" with the platform\'s error and the fix; no webhook is set, nothing is stored', async () => {
    const run = await startLogin(ws, 'tgbad').exited;
    assert.equal(run.code, 1);
    assert.match(run.stdout, /✗ token\s+telegram: getMe: Unauthorized/);
    assert.match(
      run.stderr,
      /channel tgbad: step "token" failed: telegram: getMe: Unauthorized\. Check channels\.tgbad\.botToken: copy it again from @BotFather/,
    );
    assert.ok(calls('getMe').some((c) => c.path === `/bot${UNKNOWN_BOT_TOKEN}/getMe` && c.status === 401));
    assert.equal(calls('setWebhook').filter((c) => c.path.includes(UNKNOWN_BOT_TOKEN)).length, 0);
    assert.equal(storedGrant(ws, 'tgbad'), undefined);
  });

  describe('logged in', () => {
    let login: CliResult;
    let secretToken: string;
    before(async () => {
      login = await startLogin(ws, 'tg').exited;
      secretToken = fake.registeredWebhook()?.secretToken ?? '';
    });

    it('login: getMe, then setWebhook at publicUrl + /webhook/channels/tg with a generated secret token; the secret is stored sealed', async () => {
      assert.equal(login.code, 0, login.stderr);
      assert.match(login.stdout, /✓ token\s+bot @gatehouse_test_bot/);
      assert.match(login.stdout, /✓ webhook\s+updates go to/);
      assert.match(login.stdout, /channel tg connected/);
      const hook = fake.registeredWebhook();
      assert.equal(hook?.url, `${ws.webhookUrl}/webhook/channels/tg`);
      assert.match(secretToken, /^[A-Za-z0-9_-]{43}$/);
      assert.ok(hook?.allowedUpdates?.includes('message'));
      assert.equal(login.stdout.includes(secretToken), false, 'the secret token is printed');
      assertNotInStorage(ws, secretToken, 'the Telegram secret token');
      assertNotInStorage(ws, fake.token, 'the bot token');

      const [status] = await statusJson(ws, 'tg');
      assert.equal(status!.connected, true);
      assert.equal(status!.details.username, 'gatehouse_test_bot');
      assert.equal(status!.details.webhookUrl, hook?.url);
    });

    it('an update with the registered secret token reaches the target: channel, from, text, the raw update as payload', async () => {
      const seen = envelopes(target).length;
      assert.equal(await fake.deliverUpdate(fake.token, message('hello gatehouse')), 202);
      const delivered = fake.deliveries.at(-1)!.update;
      const envelope = await nthEnvelope(target, seen + 1);
      assert.equal(envelope.action, 'message');
      assert.deepEqual(envelope.channel, { name: 'tg', kind: 'bot-token', platform: 'telegram' });
      assert.deepEqual(envelope.from, { id: 4242, username: 'ana', chatId: 4242 });
      assert.equal(envelope.text, 'hello gatehouse');
      assert.deepEqual(envelope.payload, delivered);
      // The channel route stores the headers it got like any endpoint: Telegram's secret token redacted.
      const row = withDatabase(ws, (db) =>
        db.prepare<[string], { headers: string }>('SELECT headers FROM events WHERE id = ?').get(envelope.id),
      );
      const headers = JSON.parse(row!.headers);
      assert.equal(headers['x-telegram-bot-api-secret-token'], '[redacted]');
      assert.match(headers['content-type'], /^application\/json/);
      assertNotInStorage(ws, secretToken, 'the Telegram secret token');
    });

    it('a wrong or missing secret token gets 401 and nothing reaches the target', async () => {
      const seen = envelopes(target).length;
      const wrong = await postUpdate(
        { update_id: 1, ...message('forged') },
        `${secretToken.slice(0, -1)}${secretToken.endsWith('A') ? 'B' : 'A'}`,
      );
      assert.equal(wrong.status, 401);
      assert.equal(wrong.json().error.code, 'invalid_webhook_secret');
      assert.equal((await postUpdate({ update_id: 2, ...message('forged') }, undefined)).status, 401);
      assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen);
    });

    it('the same update_id twice is delivered once', async () => {
      const seen = envelopes(target).length;
      const update = { update_id: 900_000_001, ...message('only once') };
      assert.equal((await postUpdate(update, secretToken)).status, 202);
      const again = await postUpdate(update, secretToken);
      assert.equal(again.status, 200);
      assert.equal(again.json().status, 'duplicate');
      assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen + 1);
    });

    it('outbound: sendMessage with the bot token, 200 with the message id; without the API key 401 and Telegram gets nothing', async () => {
      const before = calls('sendMessage').length;
      for (const headers of [{}, { 'x-api-key': 'not-the-key-0123456789abcdefghijklmnop' }] as Record<
        string,
        string
      >[]) {
        assert.equal((await send({ to: '4242', text: 'unauthorised' }, headers)).status, 401);
      }
      assert.equal(calls('sendMessage').length, before, 'Telegram was called without the API key');

      const reply = await send({ to: 4242, text: 'hi Ana' });
      assert.equal(reply.status, 200, reply.body);
      const sent = fake.sent.at(-1)!;
      assert.deepEqual(reply.json(), { channel: 'tg', id: String(sent.message.message_id), to: '4242' });
      assert.equal(sent.token, fake.token);
      assert.equal(sent.chatId, '4242');
      assert.equal(sent.text, 'hi Ana');
      assert.equal(upstream.received.length, 0);
    });

    it("outbound to an unknown chat: 502 with Telegram's error, and `channels status` shows it as the last error", async () => {
      fake.setKnownChats(['4242']);
      try {
        const reply = await send({ to: '999', text: 'anyone there?' });
        assert.equal(reply.status, 502);
        assert.equal(reply.json().error.code, 'channel_send_failed');
        assert.equal(reply.json().error.platformError, 'telegram: sendMessage: Bad Request: chat not found');
      } finally {
        fake.setKnownChats('any');
      }
      const [human, [status]] = await Promise.all([channelsCli(ws, ['status', 'tg']), statusJson(ws, 'tg')]);
      assert.equal(human.code, 0, human.stderr);
      assert.match(
        human.stdout,
        /^✓ tg \(bot-token, telegram\): connected since \d{4}-\d\d-\d\dT[\d:.]+Z \(\d+ s ago\)$/m,
      );
      assert.match(human.stdout, /^ {4}last event {5}\d{4}-.*ago\)$/m);
      assert.match(
        human.stdout,
        /^ {4}last error {5}telegram: sendMessage: Bad Request: chat not found \(\d{4}-.* ago\)\)$/m,
      );
      assert.equal(status!.lastError, 'telegram: sendMessage: Bad Request: chat not found');
      assert.equal(typeof status!.lastErrorAt, 'number');
      assert.equal(typeof status!.lastEventAt, 'number');
    });
  });

  describe('logout', () => {
    it('deletes the webhook and forgets the grant: the old secret token gets 401, sends get 409, status says not connected', async () => {
      const login = await startLogin(ws, 'tg').exited;
      assert.equal(login.code, 0, login.stderr);
      const secret = fake.registeredWebhook()!.secretToken!;
      const logout = await channelsCli(ws, ['logout', 'tg']);
      assert.equal(logout.code, 0, logout.stderr);
      assert.match(logout.stdout, /channel tg: logged out/);
      assert.equal(calls('deleteWebhook').at(-1)?.status, 200);
      assert.equal(fake.registeredWebhook(), undefined);

      const seen = envelopes(target).length;
      assert.equal((await postUpdate({ update_id: 5, ...message('after logout') }, secret)).status, 401);
      const sends = calls('sendMessage').length;
      const reply = await send({ to: '4242', text: 'after logout' });
      assert.equal(reply.status, 409);
      assert.equal(reply.json().error.code, 'channel_not_connected');
      assert.equal(calls('sendMessage').length, sends);
      assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen);

      const human = await channelsCli(ws, ['status', 'tg']);
      assert.match(human.stdout, /^✗ tg \(bot-token, telegram\): not connected: run `gatehouse channels login tg`$/m);
    });
  });

  it('every call gatehouse made to the Bot API above is a documented one that breaks no rule of the reference', () =>
    assertCallsDocumented(fake));
});
