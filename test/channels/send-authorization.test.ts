/**
 * The channel send API (`POST /_gatehouse/channels/<name>/messages`) is an egress point: it posts
 * as the organisation's bot. It goes through the same authorization and rate-limit steps as
 * /api/ (rules, defaultAllow, gateway.rateLimits, a key's own rateLimit), and a channel's
 * `send.scopes` is required even when no rule mentions its path. Run against a real `gatehouse
 * start` and the fake Telegram Bot API; every refusal is checked on what the fake received.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { SignJWT } from 'jose';
import { hashApiKey } from '../../src/gateway/credentials/api-key.js';
import { scrape } from '../helpers/admin.js';
import { startFakeTelegram, type FakeTelegram } from '../helpers/fake-chat.js';
import { request, type Reply } from '../helpers/http.js';
import { runCli } from '../helpers/process.js';
import { waitFor } from '../helpers/wait.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import {
  removeWorkspace,
  startGatehouse,
  startLogin,
  workspace,
  writeConfig,
  type RunningGatehouse,
  type Workspace,
} from './helpers.js';

const json = { 'content-type': 'application/json' };
const ORDERS_KEY = 'orders-reader-key-0123456789abcdefghijklmn';
const SENDER_KEY = 'channel-sender-key-0123456789abcdefghijklm';
const OTHER_KEY = 'unscoped-key-0123456789abcdefghijklmnopqrs';
const JWT_SECRET = 'send-authorization-hs256-secret-0123456789';
const CHANNEL_PATH = '/_gatehouse/channels/tg/messages';

/** A key restricted to reading orders, limited to one request an hour (the reproduction's key). */
const ordersKey = {
  id: 'orders',
  hash: hashApiKey(ORDERS_KEY),
  scopes: ['orders:read'],
  rateLimit: { requests: 1, per: '1h' },
};
const ordersRule = { paths: ['/api/orders/**'], methods: ['GET'], scopes: ['orders:read'] };

describe('channel send API: rules, scopes, defaultAllow and rate limits', () => {
  let ws: Workspace;
  let fake: FakeTelegram;
  let target: RecordingServer;
  let upstream: RecordingServer;
  let gatehouse: RunningGatehouse;
  let adminUrl: string;

  const configure = (options: {
    auth: Record<string, unknown>;
    rateLimits?: unknown[];
    send?: Record<string, unknown>;
  }) => {
    const tg = {
      kind: 'bot-token',
      platform: 'telegram',
      publicUrl: ws.webhookUrl,
      apiBaseUrl: fake.url,
      botToken: fake.token,
      ...(options.send ? { send: options.send } : {}),
    };
    writeConfig(ws, {
      channels: { tg },
      targetUrl: target.url,
      upstreamUrl: upstream.url,
      auth: { bearer: { jwt: { secret: JWT_SECRET } }, ...options.auth },
      rateLimits: options.rateLimits,
      admin: { listen: { host: '127.0.0.1', port: 0 } },
    });
  };
  /** Rewrites the config and waits until the running server has it in force (SIGHUP). */
  const reload = async (options: Parameters<typeof configure>[0]) => {
    configure(options);
    const mark = gatehouse.process.lines.length;
    gatehouse.process.child.kill('SIGHUP');
    const line = await gatehouse.process.waitFor(
      (l) =>
        gatehouse.process.lines.indexOf(l) >= mark &&
        (l.msg === 'configuration reloaded' || l.msg?.startsWith('reload rejected')),
    );
    assert.equal(line.msg, 'configuration reloaded', JSON.stringify(line));
  };
  const send = (headers: Record<string, string>, text = 'deploy finished'): Promise<Reply> =>
    request(gatehouse.gatewayUrl, CHANNEL_PATH, {
      method: 'POST',
      headers: { ...json, ...headers },
      body: JSON.stringify({ to: '4242', text }),
    });
  const jwt = (scope: string | undefined) =>
    new SignJWT(scope === undefined ? {} : { scope })
      .setProtectedHeader({ alg: 'HS256' })
      .setSubject('ci-bot')
      .setExpirationTime('5m')
      .sign(new TextEncoder().encode(JWT_SECRET));
  const requestLines = (status: number) =>
    gatehouse.process.lines.filter((l) => l.msg === 'request' && l.path === CHANNEL_PATH && l.status === status);
  /** The request lines with `status`, once there are `count` (a line is written as its answer closes, after the client read it). */
  const waitForRequestLines = async (status: number, count: number) => {
    await waitFor(() => requestLines(status).length >= count, {
      what: () => `${count} request lines with status ${status}; got ${requestLines(status).length}`,
    });
    return requestLines(status);
  };

  before(async () => {
    [fake, target, upstream, ws] = await Promise.all([
      startFakeTelegram(),
      startRecordingUpstream(),
      startRecordingUpstream(),
      workspace('send-authz'),
    ]);
    configure({
      auth: {
        apiKeys: [ordersKey, { id: 'sender', hash: hashApiKey(SENDER_KEY), scopes: ['channels:send'] }],
        rules: [ordersRule],
        defaultAllow: false,
      },
    });
    gatehouse = await startGatehouse(ws);
    adminUrl = (await gatehouse.process.waitFor((l) => l.msg?.startsWith('admin listener'))).url;
    const login = await startLogin(ws, 'tg').exited;
    assert.equal(login.code, 0, login.stderr);
  });
  after(async () => {
    await gatehouse?.stop();
    await Promise.all([fake?.close(), target?.close(), upstream?.close()]);
    removeWorkspace(ws);
  });

  it('the reproduction: a key restricted to GET /api/orders/** under defaultAllow: false sends nothing, five times over; the platform receives nothing', async () => {
    const sent = fake.sent.length;
    for (let i = 0; i < 5; i++) {
      const reply = await send({ 'x-api-key': ORDERS_KEY });
      assert.equal(reply.status, 403, reply.body);
      assert.equal(reply.json().error.code, 'insufficient_scope');
      assert.equal(reply.headers['www-authenticate'], 'Bearer realm="gatehouse", error="insufficient_scope"');
    }
    // A JWT the provider issued is no more a licence to send than a key is.
    assert.equal((await send({ authorization: `Bearer ${await jwt('orders:read')}` })).status, 403);
    assert.equal(fake.sent.length, sent, 'a refused send reached Telegram');
    // The key itself is valid, and its own limit still counts where it is allowed.
    assert.equal(
      (await request(gatehouse.gatewayUrl, '/api/orders/1', { headers: { 'x-api-key': ORDERS_KEY } })).status,
      200,
    );
    assert.equal(
      (await request(gatehouse.gatewayUrl, '/api/orders/1', { headers: { 'x-api-key': ORDERS_KEY } })).status,
      429,
    );
    // The log and the metrics record these refusals as they do /api/ ones.
    const refused = (await waitForRequestLines(403, 6)).filter((l) => l.subject === 'orders');
    assert.equal(refused.length, 5);
    assert.equal(refused[0]!.error, 'insufficient_scope');
    assert.match(refused[0]!.detail, /no rule matches and gateway\.auth\.defaultAllow is false/);
    const metrics = await scrape(adminUrl);
    assert.ok(
      (metrics.value(
        'gatehouse_http_requests_total{listener="gateway",route="",status="403",code="insufficient_scope",auth="api-key"}',
      ) ?? 0) >= 5,
      metrics.text,
    );
  });

  it("a rule granting the channel path lets only the scope holder send, and its own rateLimit allows one send an hour: the others are 429 with the limit's headers", async () => {
    await reload({
      auth: {
        apiKeys: [
          ordersKey,
          {
            id: 'sender',
            hash: hashApiKey(SENDER_KEY),
            scopes: ['channels:send'],
            rateLimit: { requests: 1, per: '1h' },
          },
        ],
        rules: [ordersRule, { paths: ['/_gatehouse/channels/tg/**'], methods: ['POST'], scopes: ['channels:send'] }],
        defaultAllow: false,
      },
    });
    const sent = fake.sent.length;
    const denied = await send({ 'x-api-key': ORDERS_KEY });
    assert.equal(denied.status, 403);
    assert.equal(
      denied.headers['www-authenticate'],
      'Bearer realm="gatehouse", error="insufficient_scope", scope="channels:send"',
    );
    const replies: Reply[] = [];
    for (let i = 0; i < 5; i++) replies.push(await send({ 'x-api-key': SENDER_KEY }, `send ${i}`));
    assert.deepEqual(
      replies.map((r) => r.status),
      [200, 429, 429, 429, 429],
      replies.map((r) => r.body).join('\n'),
    );
    const limited = replies[1]!;
    assert.equal(limited.json().error.code, 'rate_limited');
    assert.match(String(limited.headers['retry-after']), /^\d+$/);
    assert.equal(limited.headers['ratelimit-policy'], '"key";q=1;w=3600');
    assert.match(String(limited.headers.ratelimit), /^"key";r=0;t=\d+$/);
    assert.equal(fake.sent.length, sent + 1, 'Telegram received more than the one allowed send');
    assert.equal(fake.sent.at(-1)!.text, 'send 0');
    assert.equal((await waitForRequestLines(429, 4)).length, 4);
  });

  it('gateway.rateLimits with a paths filter counts channel sends, and not /api/ requests', async () => {
    await reload({
      auth: { apiKeys: [{ id: 'sender', hash: hashApiKey(SENDER_KEY), scopes: ['channels:send'] }] },
      rateLimits: [{ by: 'subject', requests: 2, per: '1h', paths: ['/_gatehouse/channels/**'] }],
    });
    const sent = fake.sent.length;
    const statuses = [];
    for (let i = 0; i < 3; i++) statuses.push((await send({ 'x-api-key': SENDER_KEY })).status);
    assert.deepEqual(statuses, [200, 200, 429]);
    assert.equal(fake.sent.length, sent + 2);
    for (let i = 0; i < 3; i++)
      assert.equal(
        (await request(gatehouse.gatewayUrl, `/api/items/${i}`, { headers: { 'x-api-key': SENDER_KEY } })).status,
        200,
      );
  });

  it('send.scopes is required with no rule at all and defaultAllow: true, from keys and JWTs alike; a reload that drops it opens the channel at once', async () => {
    const keys = [
      { id: 'sender', hash: hashApiKey(SENDER_KEY), scopes: ['channels:send:tg'] },
      { id: 'other', hash: hashApiKey(OTHER_KEY) },
    ];
    await reload({ auth: { apiKeys: keys }, send: { scopes: ['channels:send:tg'] } });
    const sent = fake.sent.length;
    const refusedCredentials: Record<string, string>[] = [
      { 'x-api-key': OTHER_KEY },
      { authorization: `Bearer ${await jwt('channels:send')}` },
      { authorization: `Bearer ${await jwt(undefined)}` },
    ];
    for (const headers of refusedCredentials) {
      const reply = await send(headers);
      assert.equal(reply.status, 403, reply.body);
      assert.equal(reply.json().error.code, 'insufficient_scope');
      assert.equal(
        reply.headers['www-authenticate'],
        'Bearer realm="gatehouse", error="insufficient_scope", scope="channels:send:tg"',
      );
    }
    assert.equal(fake.sent.length, sent, 'a send without channels:send:tg reached Telegram');
    const line = (await waitForRequestLines(403, 10)).at(-3)!;
    assert.equal(line.subject, 'other');
    assert.equal(line.detail, 'channels.tg.send: scope "channels:send:tg" not granted');
    // Other paths are not touched by the channel's scopes.
    assert.equal(
      (await request(gatehouse.gatewayUrl, '/api/items', { headers: { 'x-api-key': OTHER_KEY } })).status,
      200,
    );

    assert.equal((await send({ 'x-api-key': SENDER_KEY }, 'by key')).status, 200);
    assert.equal(
      (await send({ authorization: `Bearer ${await jwt('deploy channels:send:tg')}` }, 'by token')).status,
      200,
    );
    assert.deepEqual(
      fake.sent.slice(sent).map((m) => m.text),
      ['by key', 'by token'],
    );

    await reload({ auth: { apiKeys: keys } });
    assert.equal((await send({ 'x-api-key': OTHER_KEY }, 'open again')).status, 200);
    await reload({ auth: { apiKeys: keys }, send: { scopes: ['channels:send:tg'] } });
    assert.equal((await send({ 'x-api-key': OTHER_KEY })).status, 403);
    assert.deepEqual(
      fake.sent.slice(sent).map((m) => m.text),
      ['by key', 'by token', 'open again'],
    );
  });

  it('send.scopes under defaultAllow: false grants the channel by itself, like a rule for its path', async () => {
    await reload({
      auth: {
        apiKeys: [{ id: 'sender', hash: hashApiKey(SENDER_KEY), scopes: ['channels:send:tg'] }],
        defaultAllow: false,
      },
      send: { scopes: ['channels:send:tg'] },
    });
    assert.equal((await send({ 'x-api-key': SENDER_KEY }, 'granted by send.scopes')).status, 200);
    assert.equal(fake.sent.at(-1)!.text, 'granted by send.scopes');
    assert.equal(
      (await request(gatehouse.gatewayUrl, '/api/items', { headers: { 'x-api-key': SENDER_KEY } })).status,
      403,
    );
  });

  it('config check warns when any credential can send through a channel, and not once send.scopes, a rule or defaultAllow: false closes it', async () => {
    const check = async () => {
      const run = await runCli(['config', 'check', '--config', ws.config], { env: ws.env });
      assert.equal(run.code, 0, run.stderr);
      return run.stdout + run.stderr;
    };
    const warning =
      /channels\.tg: any credential the gateway accepts can send through this channel \(no send\.scopes, no rule covers POST \/_gatehouse\/channels\/tg\/messages, gateway\.auth\.defaultAllow is true\)/;
    const keys = [{ id: 'sender', hash: hashApiKey(SENDER_KEY) }];
    configure({ auth: { apiKeys: keys } });
    assert.match(await check(), warning);
    // A rule that covers only GET, or another channel, leaves POST open.
    configure({
      auth: {
        apiKeys: keys,
        rules: [
          { paths: ['/_gatehouse/channels/tg/**'], methods: ['GET'], scopes: ['x'] },
          { paths: ['/_gatehouse/channels/other/**'], scopes: ['x'] },
        ],
      },
    });
    assert.match(await check(), warning);
    for (const closed of [
      { auth: { apiKeys: keys }, send: { scopes: ['channels:send:tg'] } },
      { auth: { apiKeys: keys, rules: [{ paths: ['/_gatehouse/channels/**'], scopes: ['channels:send'] }] } },
      { auth: { apiKeys: keys, defaultAllow: false } },
    ]) {
      configure(closed);
      assert.doesNotMatch(await check(), /channels\.tg: any credential/);
    }
  });
});
