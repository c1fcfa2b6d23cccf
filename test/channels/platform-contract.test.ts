/**
 * Every request gatehouse's channel code makes to Telegram, Discord and Slack, checked against the
 * platforms' published references rather than against what gatehouse expects: one gatehouse
 * runs a Telegram, a Discord and a Slack channel through their flows (login, inbound events,
 * sends, a grant refresh, logout) against the fakes in test/helpers/fake-chat.ts, which record
 * each call, match it to a documented route (TELEGRAM_METHODS, DISCORD_ROUTES, SLACK_METHODS:
 * the reference page and section beside each) and note every way it breaks the reference.
 *
 * The table below is gatehouse's side of the contract: which documented call each flow makes,
 * with which HTTP method, content type, credentials and parameters. A new call, a changed
 * parameter or a call the reference does not allow fails here, with the source to read.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import {
  DISCORD_CLIENT,
  DISCORD_ROUTES,
  SLACK_CLIENT,
  SLACK_METHODS,
  startFakeDiscord,
  startFakeSlack,
  startFakeTelegram,
  TELEGRAM_METHODS,
  TELEGRAM_UPDATE_TYPES,
  type DeliveryResult,
  type DocumentedRoute,
  type FakeChatServer,
  type FakeDiscord,
  type FakeSlack,
  type FakeTelegram,
  type RecordedCall,
} from '../helpers/fake-chat.js';
import { request } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import {
  API_KEY,
  channelsCli,
  loginThroughBrowser,
  nthEnvelope,
  envelopes,
  removeWorkspace,
  startGatehouse,
  startLogin,
  storedGrant,
  workspace,
  writeConfig,
  type RunningGatehouse,
  type Workspace,
} from './helpers.js';

/** One row of gatehouse's calls: what the reference allows, and which flow makes it. */
interface ExpectedCall {
  flow: 'login' | 'inbound' | 'send' | 'refresh' | 'logout';
  platform: DocumentedRoute['platform'];
  /** The documented route (and, for the token URL, the grant). */
  call: string;
  method: string;
  contentType: string;
  /** How the caller proved itself: 'Bot', 'Bearer', 'Basic', 'client_secret in the form', 'token in the path'. */
  auth: string;
  /** Parameter names sent, sorted. */
  params: string[];
}

/**
 * gatehouse's calls, from src/integrations/channels/platforms.ts, each checked by the fake against the
 * reference row named in `call` (its source is in the fake's table and in failures below).
 */
const EXPECTED: ExpectedCall[] = [
  // https://core.telegram.org/bots/api#getme, #setwebhook (url, secret_token 1-256 of A-Za-z0-9_-, allowed_updates: Update types)
  {
    flow: 'login',
    platform: 'telegram',
    call: 'getMe',
    method: 'POST',
    contentType: 'application/json',
    auth: 'token in the path',
    params: [],
  },
  {
    flow: 'login',
    platform: 'telegram',
    call: 'setWebhook',
    method: 'POST',
    contentType: 'application/json',
    auth: 'token in the path',
    params: ['allowed_updates', 'secret_token', 'url'],
  },
  // https://discord.com/developers/docs/resources/user#get-current-user, topics/oauth2#authorization-code-grant-access-token-exchange-example
  {
    flow: 'login',
    platform: 'discord',
    call: 'GET /users/@me',
    method: 'GET',
    contentType: '',
    auth: 'Bot',
    params: [],
  },
  {
    flow: 'login',
    platform: 'discord',
    call: 'POST /oauth2/token authorization_code',
    method: 'POST',
    contentType: 'application/x-www-form-urlencoded',
    auth: 'client_secret in the form',
    params: ['client_id', 'client_secret', 'code', 'code_verifier', 'grant_type', 'redirect_uri'],
  },
  // https://docs.slack.dev/reference/methods/oauth.v2.access
  {
    flow: 'login',
    platform: 'slack',
    call: 'oauth.v2.access',
    method: 'POST',
    contentType: 'application/x-www-form-urlencoded',
    auth: 'client_secret in the form',
    params: ['client_id', 'client_secret', 'code', 'grant_type', 'redirect_uri'],
  },
  // https://core.telegram.org/bots/api#sendmessage, discord resources/message#create-message, slack reference/methods/chat.postMessage
  {
    flow: 'send',
    platform: 'telegram',
    call: 'sendMessage',
    method: 'POST',
    contentType: 'application/json',
    auth: 'token in the path',
    params: ['chat_id', 'text'],
  },
  {
    flow: 'send',
    platform: 'discord',
    call: 'POST /channels/{channel.id}/messages',
    method: 'POST',
    contentType: 'application/json',
    auth: 'Bot',
    params: ['content'],
  },
  {
    flow: 'send',
    platform: 'slack',
    call: 'chat.postMessage',
    method: 'POST',
    contentType: 'application/json; charset=utf-8',
    auth: 'Bearer',
    params: ['channel', 'text'],
  },
  // discord topics/oauth2#authorization-code-grant-refresh-token-exchange-example
  {
    flow: 'refresh',
    platform: 'discord',
    call: 'POST /oauth2/token refresh_token',
    method: 'POST',
    contentType: 'application/x-www-form-urlencoded',
    auth: 'client_secret in the form',
    params: ['client_id', 'client_secret', 'grant_type', 'refresh_token'],
  },
  // https://core.telegram.org/bots/api#deletewebhook (Discord and Slack logouts call nothing)
  {
    flow: 'logout',
    platform: 'telegram',
    call: 'deleteWebhook',
    method: 'POST',
    contentType: 'application/json',
    auth: 'token in the path',
    params: [],
  },
];

const CHANNEL_ID = '1100000000000000001';
const SLACK_CHANNEL = 'C0FAKECHAN1';

/** A recorded call as a row of the table (the flow is the test's, filled in by the caller). */
function rowOf(platform: DocumentedRoute['platform'], call: RecordedCall): Omit<ExpectedCall, 'flow'> {
  const body = call.body && typeof call.body === 'object' ? (call.body as Record<string, unknown>) : {};
  const scheme = String(call.headers.authorization ?? '').split(' ')[0]!;
  const auth =
    platform === 'telegram'
      ? 'token in the path'
      : scheme || ('client_secret' in body ? 'client_secret in the form' : 'none');
  const name =
    call.route?.name === 'POST /oauth2/token'
      ? `POST /oauth2/token ${String(body.grant_type)}`
      : (call.route?.name ?? `(undocumented) ${call.path}`);
  return {
    platform,
    call: name,
    method: call.method,
    contentType: String(call.headers['content-type'] ?? ''),
    auth,
    params: [...Object.keys(call.query), ...Object.keys(body)].sort(),
  };
}

/** A call's violations, each with the reference row it was checked against, for a failure message. */
function explain(call: RecordedCall): string {
  return `${call.method} ${call.path.replace(/\/bot[^/]+\//, '/bot<token>/')} → ${call.status}\n  route: ${call.route ? `${call.route.name} (${call.route.source})` : 'none in the reference'}\n  ${call.violations.join('\n  ')}`;
}

describe('platform contract: every call gatehouse makes is one the platforms document', () => {
  let ws: Workspace;
  let telegram: FakeTelegram;
  let discord: FakeDiscord;
  let slack: FakeSlack;
  let target: RecordingServer;
  let upstream: RecordingServer;
  let gatehouse: RunningGatehouse;
  /** Each fake's calls, split by the flow that made them (the browser's consent pages left out). */
  const byFlow = new Map<ExpectedCall['flow'], { platform: DocumentedRoute['platform']; call: RecordedCall }[]>();
  const deliveries: { what: string; result: DeliveryResult }[] = [];
  const fakes = () =>
    [
      ['telegram', telegram],
      ['discord', discord],
      ['slack', slack],
    ] as [DocumentedRoute['platform'], FakeChatServer][];
  let seen = [0, 0, 0];

  /** Files the calls made since the last flow under `flow`. */
  function closeFlow(flow: ExpectedCall['flow']): void {
    const list = byFlow.get(flow) ?? [];
    fakes().forEach(([platform, fake], i) => {
      for (const call of fake.calls.slice(seen[i])) {
        // The test's browser opening a consent page is not gatehouse's call.
        if (!call.route?.name.endsWith('/authorize')) list.push({ platform, call });
      }
    });
    byFlow.set(flow, list);
    seen = fakes().map(([, fake]) => fake.calls.length);
  }

  const send = (channel: string, body: Record<string, unknown>) =>
    request(gatehouse.gatewayUrl, `/_gatehouse/channels/${channel}/messages`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': API_KEY },
      body: JSON.stringify(body),
    });

  before(async () => {
    [telegram, discord, slack, target, upstream, ws] = await Promise.all([
      startFakeTelegram(),
      startFakeDiscord({ accessTokenTtlSeconds: 3600 }),
      startFakeSlack(),
      startRecordingUpstream(),
      startRecordingUpstream(),
      workspace('contract'),
    ]);
    writeConfig(ws, {
      channels: {
        tg: {
          kind: 'bot-token',
          platform: 'telegram',
          botToken: telegram.token,
          publicUrl: ws.webhookUrl,
          apiBaseUrl: telegram.url,
        },
        dc: {
          kind: 'oauth-bot',
          platform: 'discord',
          clientId: DISCORD_CLIENT.clientId,
          clientSecret: DISCORD_CLIENT.clientSecret,
          botToken: discord.botToken,
          publicKey: discord.publicKeyHex,
          apiBaseUrl: `${discord.url}/api/v10`,
          authorizeUrl: `${discord.url}/oauth2/authorize`,
          tokenUrl: `${discord.url}/api/oauth2/token`,
        },
        sl: {
          kind: 'oauth',
          platform: 'slack',
          clientId: SLACK_CLIENT.clientId,
          clientSecret: SLACK_CLIENT.clientSecret,
          signingSecret: SLACK_CLIENT.signingSecret,
          apiBaseUrl: `${slack.url}/api`,
          authorizeUrl: `${slack.url}/oauth/v2/authorize`,
          tokenUrl: `${slack.url}/api/oauth.v2.access`,
        },
      },
      targetUrl: target.url,
      upstreamUrl: upstream.url,
    });
    gatehouse = await startGatehouse(ws);
  });
  after(async () => {
    await gatehouse?.stop();
    await Promise.all([telegram?.close(), discord?.close(), slack?.close(), target?.close(), upstream?.close()]);
    removeWorkspace(ws);
  });

  it('login: each channel logs in against its fake', async () => {
    const tg = await startLogin(ws, 'tg').exited;
    assert.equal(tg.code, 0, tg.stderr);
    const dc = await loginThroughBrowser(ws, 'dc');
    assert.equal(dc.code, 0, dc.stderr);
    const sl = await loginThroughBrowser(ws, 'sl');
    assert.equal(sl.code, 0, sl.stderr);
    closeFlow('login');
  });

  it("inbound: gatehouse answers each platform's deliveries as the platform documents (no calls of its own)", async () => {
    const seenEnvelopes = envelopes(target).length;
    const status = await telegram.deliverUpdate(telegram.token, {
      message: {
        message_id: 1,
        from: { id: 7, is_bot: false, first_name: 'Ana' },
        chat: { id: 7, type: 'private' },
        date: 1_700_000_000,
        text: 'hi',
      },
    });
    assert.equal(status, 202);
    const endpoint = `${gatehouse.webhookUrl}/webhook/channels/dc`;
    const check = await discord.checkInteractionsEndpoint(endpoint);
    deliveries.push(
      { what: 'discord PING', result: check.ping },
      { what: 'discord PING, forged signature', result: check.forged },
    );
    deliveries.push({
      what: 'discord command',
      result: await discord.deliverInteraction(endpoint, {
        id: '1300000000000000003',
        application_id: DISCORD_CLIENT.clientId,
        type: 2,
        token: 'interaction-token',
        version: 1,
        channel_id: CHANNEL_ID,
        member: { user: { id: '1000000000000000001', username: 'alice' } },
        data: { id: '1400000000000000004', name: 'ask', type: 1 },
      }),
    });
    const events = `${gatehouse.webhookUrl}/webhook/channels/sl`;
    deliveries.push({
      what: 'slack url_verification',
      result: await slack.deliverEvent(
        events,
        { token: 't', challenge: 'challenge-0123456789', type: 'url_verification' },
        SLACK_CLIENT.signingSecret,
      ),
    });
    deliveries.push({
      what: 'slack message event',
      result: await slack.deliverEvent(
        events,
        {
          type: 'event_callback',
          event_id: 'Ev0CONTRACT1',
          team_id: slack.team.id,
          event: { type: 'message', channel: SLACK_CHANNEL, user: 'U0FAKEUSER1', text: 'hi', ts: '1700000000.000100' },
        },
        SLACK_CLIENT.signingSecret,
      ),
    });
    await nthEnvelope(target, seenEnvelopes + 3);
    for (const { what, result } of deliveries) assert.deepEqual(result.violations, [], what);
    closeFlow('inbound');
    assert.deepEqual(
      byFlow.get('inbound')!.map(({ platform, call }) => `${platform}: ${call.method} ${call.path}`),
      [],
      'an inbound event made gatehouse call a platform',
    );
  });

  it('send: one message through each channel', async () => {
    for (const [channel, to] of [
      ['tg', '4242'],
      ['dc', CHANNEL_ID],
      ['sl', SLACK_CHANNEL],
    ]) {
      const reply = await send(channel!, { to, text: `deploy finished (${channel})` });
      assert.equal(reply.status, 200, `${channel}: ${reply.body}`);
    }
    closeFlow('send');
  });

  it("send: a text the platform documents it would refuse is refused before calling it (400 with the platform's rule)", async () => {
    const before = [telegram.calls.length, discord.calls.length, slack.calls.length];
    const cases: [string, string, string, RegExp][] = [
      // Discord: "Message contents (up to 2000 characters)"; gatehouse takes up to 4000 for any channel.
      [
        'dc',
        CHANNEL_ID,
        'x'.repeat(2001),
        /discord takes at most 2000 characters in a message, got 2001 \(https:\/\/discord\.com\/developers\/docs\/resources\/message#create-message\)/,
      ],
      ['dc', CHANNEL_ID, ' \n ', /discord refuses a blank message/],
      // Telegram: "1-4096 characters after entities parsing", which trims.
      [
        'tg',
        '4242',
        '   ',
        /telegram refuses a blank message \(https:\/\/core\.telegram\.org\/bots\/api#sendmessage\)/,
      ],
    ];
    for (const [channel, to, text, problem] of cases) {
      const reply = await send(channel, { to, text });
      assert.equal(reply.status, 400, `${channel} ${JSON.stringify(text.slice(0, 10))}: ${reply.body}`);
      assert.equal(reply.json().error.code, 'invalid_message');
      assert.match(reply.json().error.problem, problem);
    }
    // Discord counts characters, not UTF-16 units: 2000 emoji go through.
    assert.equal((await send('dc', { to: CHANNEL_ID, text: '🚀'.repeat(2000) })).status, 200);
    assert.deepEqual(
      [telegram.calls.length, discord.calls.length - 1, slack.calls.length],
      before,
      'a refused text reached a platform',
    );
    closeFlow('send');
  });

  it('refresh: a Discord grant within a day of expiry is refreshed when gatehouse starts', async () => {
    await gatehouse.stop();
    gatehouse = await startGatehouse(ws);
    await gatehouse.process.waitFor((l) => l.msg === 'channel grant refreshed' && l.channel === 'dc');
    closeFlow('refresh');
  });

  it('logout: each channel logs out', async () => {
    for (const name of ['tg', 'dc', 'sl']) {
      const run = await channelsCli(ws, ['logout', name]);
      assert.equal(run.code, 0, run.stderr);
      assert.equal(storedGrant(ws, name), undefined);
    }
    closeFlow('logout');
  });

  it('every call gatehouse made matches a documented route, with no violation of the reference, and succeeded', () => {
    const all = [...byFlow.values()].flat();
    const broken = all.filter(({ call }) => !call.route || call.violations.length > 0 || (call.status ?? 500) >= 400);
    assert.deepEqual(
      broken.map(({ platform, call }) => `${platform}: ${explain(call)}`),
      [],
    );
    assert.ok(all.length >= EXPECTED.length, `only ${all.length} calls recorded`);
  });

  it('the calls are exactly the table: documented route, HTTP method, content type, credentials, parameters, per flow', () => {
    const observed = [...byFlow.entries()].flatMap(([flow, calls]) =>
      calls.map(({ platform, call }) => ({ flow, ...rowOf(platform, call) })),
    );
    const key = (r: ExpectedCall) =>
      JSON.stringify([r.flow, r.platform, r.call, r.method, r.contentType, r.auth, r.params]);
    // The 2000-emoji send is one more Create Message.
    const unique = [...new Map(observed.map((r) => [key(r), r])).values()];
    assert.deepEqual(unique.map(key).sort(), EXPECTED.map(key).sort());
  });

  it("the table's routes are rows of the fakes' reference tables, each with its source", () => {
    const reference = [...TELEGRAM_METHODS, ...DISCORD_ROUTES, ...SLACK_METHODS];
    for (const row of EXPECTED) {
      const name = row.call.replace(/ (authorization_code|refresh_token)$/, '');
      const route = reference.find((r) => r.platform === row.platform && r.name === name);
      assert.ok(route, `${row.platform} ${row.call} is not in the reference tables`);
      assert.ok(
        route.methods.includes(row.method),
        `${row.call}: ${row.method} is not among ${route.methods.join(', ')} (${route.source})`,
      );
      const mediaType = row.contentType.split(';')[0]!;
      assert.ok(
        mediaType === '' ? true : route.bodyTypes.includes(mediaType),
        `${row.call}: ${mediaType} is not among ${route.bodyTypes.join(', ')} (${route.source})`,
      );
      assert.match(route.source, /^https:\/\/(core\.telegram\.org|discord\.com\/developers\/docs|docs\.slack\.dev)\//);
    }
  });

  it('the values gatehouse sends stay inside the documented enums and limits', () => {
    const calls = [...byFlow.values()].flat().map(({ call }) => call);
    const setWebhook = calls.find((c) => c.route?.name === 'setWebhook')!;
    const params = setWebhook.body as { secret_token: string; allowed_updates: string[]; url: string };
    assert.match(
      params.secret_token,
      /^[A-Za-z0-9_-]{1,256}$/,
      'secret_token: 1-256 of A-Z a-z 0-9 _ - (core.telegram.org/bots/api#setwebhook)',
    );
    assert.deepEqual(
      params.allowed_updates.filter((u) => !TELEGRAM_UPDATE_TYPES.includes(u)),
      [],
      'allowed_updates: Update types (core.telegram.org/bots/api#update)',
    );
    // The fake takes http://127.0.0.1 so it can deliver here; Telegram itself wants https on 443, 80, 88 or 8443.
    assert.equal(params.url, `${ws.webhookUrl}/webhook/channels/tg`);
    for (const call of calls.filter((c) => c.route?.platform === 'discord')) {
      assert.match(
        String(call.headers['user-agent']),
        /^DiscordBot \([^,()]+, [^,()]+\)/,
        `${call.route!.name}: User-Agent (discord.com/developers/docs/reference#user-agent)`,
      );
    }
    const botToken = discord.botToken;
    for (const call of calls.filter((c) => c.route?.platform === 'discord' && !c.route.name.includes('oauth2'))) {
      assert.equal(
        call.headers.authorization,
        `Bot ${botToken}`,
        `${call.route!.name}: Authorization: Bot <token> (reference#authentication)`,
      );
    }
    for (const call of calls.filter((c) => c.route?.name === 'chat.postMessage')) {
      assert.match(
        String(call.headers.authorization),
        /^Bearer xoxb-/,
        'chat.postMessage: Authorization: Bearer xoxb-… (docs.slack.dev/apis/web-api#posting_json)',
      );
    }
  });
});
