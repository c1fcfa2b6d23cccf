/**
 * oauth (Slack) channels end to end, against the local fake Slack: the workspace install played
 * as a browser (denied consent and an invalid code fail at their step), the bot token and team
 * stored (the token sealed), v0-signed Events API requests (url_verification answered),
 * outbound chat.postMessage with the stored xoxb token.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { SLACK_CLIENT, startFakeSlack, type FakeSlack } from '../helpers/fake-chat.js';
import { request } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import {
  API_KEY,
  assertCallsDocumented,
  assertNotInStorage,
  consent,
  envelopes,
  loginThroughBrowser,
  nthEnvelope,
  settledEnvelopeCount,
  sqliteQueued,
  startGatehouse,
  statusJson,
  storedGrant,
  visit,
  removeWorkspace,
  workspace,
  writeConfig,
  type RunningGatehouse,
  type Workspace,
} from './helpers.js';

const json = { 'content-type': 'application/json' };
const CHANNEL = 'C0FAKECHAN1';

/** The bot tokens the fake has issued (Slack shows them only to the client that installed). */
const issuedTokens = (fake: FakeSlack) => [...(fake as unknown as { tokens: Map<string, unknown> }).tokens.keys()];

describe('oauth channel (Slack)', () => {
  let ws: Workspace;
  let fake: FakeSlack;
  let target: RecordingServer;
  let upstream: RecordingServer;
  let gatehouse: RunningGatehouse;

  before(async () => {
    [fake, target, upstream, ws] = await Promise.all([
      startFakeSlack(),
      startRecordingUpstream(),
      startRecordingUpstream(),
      workspace('slack'),
    ]);
    const channel = {
      kind: 'oauth',
      platform: 'slack',
      clientId: SLACK_CLIENT.clientId,
      clientSecret: SLACK_CLIENT.clientSecret,
      signingSecret: SLACK_CLIENT.signingSecret,
      scopes: ['chat:write', 'channels:history'],
      apiBaseUrl: `${fake.url}/api`,
      authorizeUrl: `${fake.url}/oauth/v2/authorize`,
      tokenUrl: `${fake.url}/api/oauth.v2.access`,
    };
    writeConfig(ws, { channels: { sl: channel, slfail: channel }, targetUrl: target.url, upstreamUrl: upstream.url });
    gatehouse = await startGatehouse(ws);
  });
  after(async () => {
    await gatehouse?.stop();
    await Promise.all([fake?.close(), target?.close(), upstream?.close()]);
    removeWorkspace(ws);
  });

  const accessCalls = () => fake.calls.filter((c) => c.path === '/api/oauth.v2.access');
  const events = '/webhook/channels/sl';
  const postSigned = (signed: { headers: Record<string, string>; body: string }) =>
    request(gatehouse.webhookUrl, events, {
      method: 'POST',
      headers: { ...json, ...signed.headers },
      body: signed.body,
    });
  const send = (body: Record<string, unknown>, headers: Record<string, string> = { 'x-api-key': API_KEY }) =>
    request(gatehouse.gatewayUrl, '/_gatehouse/channels/sl/messages', {
      method: 'POST',
      headers: { ...json, ...headers },
      body: JSON.stringify(body),
    });
  const messageEvent = (text: string, eventId: string) => ({
    token: 'deprecated-verification-token',
    team_id: fake.team.id,
    api_app_id: SLACK_CLIENT.appId,
    type: 'event_callback',
    event_id: eventId,
    event_time: 1_700_000_000,
    event: {
      type: 'message',
      channel: CHANNEL,
      user: 'U0FAKEUSER1',
      text,
      ts: '1700000000.000100',
      channel_type: 'channel',
    },
  });

  describe('installed', () => {
    let run: Awaited<ReturnType<typeof loginThroughBrowser>>;
    let botToken: string;
    before(async () => {
      run = await loginThroughBrowser(ws, 'sl');
      botToken = issuedTokens(fake).at(-1) ?? '';
    });

    it('login: the install URL asks for the scopes with a state and a loopback redirect; the bot token and team are stored, the token sealed', async () => {
      const q = run.authorizeUrl.searchParams;
      assert.equal(`${run.authorizeUrl.origin}${run.authorizeUrl.pathname}`, `${fake.url}/oauth/v2/authorize`);
      assert.equal(q.get('client_id'), SLACK_CLIENT.clientId);
      assert.equal(q.get('scope'), 'chat:write,channels:history');
      assert.match(q.get('state') ?? '', /^[A-Za-z0-9_-]{22,}$/);
      assert.match(q.get('redirect_uri') ?? '', /^http:\/\/127\.0\.0\.1:\d+\/$/);

      assert.equal(run.code, 0, run.stderr);
      assert.match(run.stdout, new RegExp(`✓ token\\s+installed in Gatehouse Test \\(${fake.team.id}\\), bot user U0`));
      assert.match(run.stdout, /channel sl connected/);
      assert.equal(accessCalls().at(-1)?.status, 200);

      const [status] = await statusJson(ws, 'sl');
      assert.equal(status!.connected, true);
      assert.equal(status!.details.teamId, fake.team.id);
      assert.equal(status!.details.teamName, fake.team.name);
      assert.match(status!.details.botUserId, /^U0/);
      assert.match(botToken, /^xoxb-/);
      assert.equal(run.stdout.includes(botToken), false, 'the bot token is printed');
      assertNotInStorage(ws, botToken, 'the Slack bot token');
    });

    it('outbound: chat.postMessage with the stored xoxb token, 200 with the message ts; without the API key 401 and Slack gets nothing', async () => {
      const posts = () => fake.calls.filter((c) => c.path === '/api/chat.postMessage');
      const before = posts().length;
      assert.equal((await send({ to: CHANNEL, text: 'unauthorised' }, {})).status, 401);
      assert.equal(posts().length, before, 'Slack was called without the API key');

      const reply = await send({ to: CHANNEL, text: 'build green' });
      assert.equal(reply.status, 200, reply.body);
      const sent = fake.sent.at(-1)!;
      assert.deepEqual(reply.json(), { channel: 'sl', id: sent.ts, to: CHANNEL });
      assert.equal(sent.token, botToken);
      assert.equal(posts().at(-1)!.headers.authorization, `Bearer ${botToken}`);
      assert.equal(sent.channel, CHANNEL);
      assert.equal(sent.text, 'build green');
      assert.equal(upstream.received.length, 0);
    });

    it("outbound to an unknown channel: 502 with Slack's error", async () => {
      fake.setKnownChannels([CHANNEL]);
      try {
        const reply = await send({ to: 'C0NOWHERE01', text: 'anyone?' });
        assert.equal(reply.status, 502);
        assert.equal(reply.json().error.platformError, 'slack: chat.postMessage: channel_not_found');
      } finally {
        fake.setKnownChannels('any');
      }
    });
  });

  describe('install failures', () => {
    it('denied consent: exit 1 at step "authorise", no token exchange, nothing stored', async () => {
      const before = accessCalls().length;
      fake.setConsent({ deny: true });
      let run;
      try {
        run = await loginThroughBrowser(ws, 'slfail');
      } finally {
        fake.setConsent({ deny: false });
      }
      assert.equal(run.code, 1);
      assert.match(run.stderr, /channel slfail: step "authorise" failed: the platform answered "access_denied"/);
      assert.equal(accessCalls().length, before);
      assert.equal(storedGrant(ws, 'slfail'), undefined);
    });

    it('an invalid code: exit 1 at step "token" with Slack\'s error and the fix', async () => {
      const run = await loginThroughBrowser(ws, 'slfail', async (url) => {
        const back = await consent(url);
        back.searchParams.set('code', 'not-a-code-slack-issued');
        await visit(back);
      });
      assert.equal(run.code, 1);
      assert.match(
        run.stderr,
        /channel slfail: step "token" failed: slack: token exchange: invalid_code\. Check channels\.slfail\.clientId\/clientSecret/,
      );
      assert.equal(accessCalls().at(-1)?.status, 200); // Slack's errors are HTTP 200 with ok: false
    });
  });

  describe('events (inbound)', () => {
    it('url_verification is answered with the challenge and delivered nowhere', async () => {
      const seen = envelopes(target).length;
      const reply = await fake.deliverEvent(
        `${gatehouse.webhookUrl}${events}`,
        {
          token: 't',
          challenge: 'challenge-3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P',
          type: 'url_verification',
        },
        SLACK_CLIENT.signingSecret,
      );
      assert.equal(reply.status, 200);
      assert.deepEqual(JSON.parse(reply.body), {
        challenge: 'challenge-3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P',
      });
      assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen);
    });

    it('a signed message event reaches the target: channel, from, text, the raw event as payload; deduped by event_id', async () => {
      const seen = envelopes(target).length;
      const event = messageEvent('hello from slack', 'Ev0FAKE00001');
      const reply = await fake.deliverEvent(`${gatehouse.webhookUrl}${events}`, event, SLACK_CLIENT.signingSecret);
      assert.equal(reply.status, 202, reply.body);
      const envelope = await nthEnvelope(target, seen + 1);
      assert.deepEqual(envelope.channel, { name: 'sl', kind: 'oauth', platform: 'slack' });
      assert.equal(envelope.from, 'U0FAKEUSER1');
      assert.equal(envelope.text, 'hello from slack');
      assert.deepEqual(envelope.payload, event);
      assert.equal(
        (await fake.deliverEvent(`${gatehouse.webhookUrl}${events}`, event, SLACK_CLIENT.signingSecret)).status,
        200,
      );
      assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen + 1);
    });

    it("another secret's signature, a stale timestamp or none gets 401 and nothing reaches the target (not even a challenge)", async () => {
      const seen = envelopes(target).length;
      const event = messageEvent('forged', 'Ev0FAKE00002');
      const stale = fake.signEvent(event, SLACK_CLIENT.signingSecret, Math.floor(Date.now() / 1000) - 600);
      for (const [what, signed] of [
        ['other secret', fake.signEvent(event, 'not-the-signing-secret-0123456789')],
        ['stale', stale],
        ['unsigned', { headers: {}, body: JSON.stringify(event) }],
        [
          'challenge, other secret',
          fake.signEvent({ type: 'url_verification', challenge: 'leak' }, 'not-the-signing-secret-0123456789'),
        ],
      ] as const) {
        const reply = await postSigned(signed);
        assert.equal(reply.status, 401, what);
        assert.doesNotMatch(reply.body, /leak/, what);
      }
      assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen);
    });
  });

  it('every call gatehouse made to Slack above is a documented one that breaks no rule of the reference', () =>
    assertCallsDocumented(fake));
});
