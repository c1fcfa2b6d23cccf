/**
 * oauth-bot (Discord) channels end to end, against the local fake Discord: the bot-install
 * consent played as a browser (authorize URL with scopes, permissions, state and PKCE; the CLI's
 * loopback listener; a wrong state refused while the login keeps waiting; denied consent; expired
 * and invalid codes), the grant stored sealed with its guild and refreshed at start when it
 * expires within a day, Ed25519-signed interactions (PING answered), outbound with `Bot <token>`.
 */
import assert from 'node:assert/strict';
import { generateKeyPairSync, sign } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { DISCORD_CLIENT, startFakeDiscord, type FakeDiscord } from '../helpers/fake-chat.js';
import { request } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import {
  API_KEY,
  assertCallsDocumented,
  assertNotInStorage,
  channelsCli,
  consent,
  envelopes,
  loginThroughBrowser,
  nthEnvelope,
  printedAuthorizeUrl,
  settledEnvelopeCount,
  sqliteQueued,
  startGatehouse,
  startLogin,
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
/** Access tokens live an hour here (Discord: a week), so a grant is always "within a day" of expiry. */
const ACCESS_TOKEN_TTL_SECONDS = 3600;
const CHANNEL_ID = '1100000000000000001';
const GUILD = { id: '1200000000000000002', name: 'Gatehouse Test' };

/** The tokens the fake has issued and not yet spent (read from the fake's state: Discord shows them only to the client). */
function issuedTokens(fake: FakeDiscord): { access: string[]; refresh: string[] } {
  const state = fake as unknown as { accessTokens: Map<string, unknown>; refreshTokens: Map<string, unknown> };
  return { access: [...state.accessTokens.keys()], refresh: [...state.refreshTokens.keys()] };
}

describe('oauth-bot channel (Discord)', () => {
  let ws: Workspace;
  let fake: FakeDiscord;
  let target: RecordingServer;
  let upstream: RecordingServer;
  let gatehouse: RunningGatehouse;

  before(async () => {
    [fake, target, upstream, ws] = await Promise.all([
      startFakeDiscord({ accessTokenTtlSeconds: ACCESS_TOKEN_TTL_SECONDS, guild: GUILD }),
      startRecordingUpstream(),
      startRecordingUpstream(),
      workspace('discord'),
    ]);
    const channel = {
      kind: 'oauth-bot',
      platform: 'discord',
      clientId: DISCORD_CLIENT.clientId,
      clientSecret: DISCORD_CLIENT.clientSecret,
      botToken: fake.botToken,
      publicKey: fake.publicKeyHex,
      permissions: '2048',
      apiBaseUrl: `${fake.url}/api/v10`,
      authorizeUrl: `${fake.url}/oauth2/authorize`,
      tokenUrl: `${fake.url}/api/oauth2/token`,
    };
    writeConfig(ws, {
      channels: {
        dc: channel,
        dcfail: channel,
        dcbadbot: { ...channel, botToken: 'not-the-bot-token-0123456789' },
        dcpub: { ...channel, publicUrl: ws.webhookUrl },
      },
      targetUrl: target.url,
      upstreamUrl: upstream.url,
      failuresMax: 100, // the forged interactions and callbacks below must not lock the test client out
    });
    gatehouse = await startGatehouse(ws);
  });
  after(async () => {
    await gatehouse?.stop();
    await Promise.all([fake?.close(), target?.close(), upstream?.close()]);
    removeWorkspace(ws);
  });

  const tokenCalls = (grantType?: string) =>
    fake.calls.filter(
      (c) => c.path === '/api/oauth2/token' && (grantType === undefined || (c.body as any)?.grant_type === grantType),
    );
  const interactions = '/webhook/channels/dc';
  const postSigned = (signed: { headers: Record<string, string>; body: string }) =>
    request(gatehouse.webhookUrl, interactions, {
      method: 'POST',
      headers: { ...json, ...signed.headers },
      body: signed.body,
    });
  const send = (body: Record<string, unknown>, headers: Record<string, string> = { 'x-api-key': API_KEY }) =>
    request(gatehouse.gatewayUrl, '/_gatehouse/channels/dc/messages', {
      method: 'POST',
      headers: { ...json, ...headers },
      body: JSON.stringify(body),
    });

  describe('login', () => {
    let run: Awaited<ReturnType<typeof loginThroughBrowser>>;
    let wrongState: { status: number; page: string };
    let waitingAfterWrongState = false;
    let tokens: { access: string[]; refresh: string[] };
    before(async () => {
      run = await loginThroughBrowser(ws, 'dc', async (authorizeUrl, login) => {
        // Another tab, or a forged link: the loopback refuses it and the login goes on waiting.
        const forged = new URL(authorizeUrl.searchParams.get('redirect_uri')!);
        forged.search = new URLSearchParams({ code: 'forged-code', state: 'not-the-state' }).toString();
        wrongState = await visit(forged);
        await new Promise((r) => setTimeout(r, 300));
        waitingAfterWrongState = login.running();
        await visit(await consent(authorizeUrl));
      });
      tokens = issuedTokens(fake);
    });

    it('the authorize URL asks for the bot install: scopes, permissions, state, PKCE S256, a loopback redirect', () => {
      const q = run.authorizeUrl.searchParams;
      assert.equal(`${run.authorizeUrl.origin}${run.authorizeUrl.pathname}`, `${fake.url}/oauth2/authorize`);
      assert.equal(q.get('client_id'), DISCORD_CLIENT.clientId);
      assert.equal(q.get('response_type'), 'code');
      assert.equal(q.get('scope'), 'bot applications.commands');
      assert.equal(q.get('permissions'), '2048');
      assert.match(q.get('state') ?? '', /^[A-Za-z0-9_-]{22,}$/);
      assert.equal(q.get('code_challenge_method'), 'S256');
      assert.match(q.get('code_challenge') ?? '', /^[A-Za-z0-9_-]{43}$/);
      assert.match(q.get('redirect_uri') ?? '', /^http:\/\/127\.0\.0\.1:\d+\/$/);
    });

    it('a response with another state gets 400 and the login keeps waiting; the forged code is never exchanged', () => {
      assert.equal(wrongState.status, 400);
      assert.match(wrongState.page, /state mismatch/);
      assert.ok(waitingAfterWrongState, 'the login stopped at a response with the wrong state');
      assert.ok(!tokenCalls().some((c) => (c.body as any)?.code === 'forged-code'));
    });

    it('the code is exchanged with the PKCE verifier; the grant is stored with its guild and expiry, its tokens sealed', async () => {
      assert.equal(run.code, 0, run.stderr);
      assert.match(run.stdout, new RegExp(`✓ authorise\\s+consent given for guild ${GUILD.id}`));
      assert.match(run.stdout, new RegExp(`✓ token\\s+grant for guild ${GUILD.id}, expires in 1 h`));
      assert.match(run.stdout, /channel dc connected/);
      const exchange = tokenCalls('authorization_code').at(-1)!;
      assert.equal(exchange.status, 200);
      assert.match((exchange.body as any).code_verifier, /^[A-Za-z0-9_-]{43}$/);

      const [status] = await statusJson(ws, 'dc');
      assert.equal(status!.connected, true);
      assert.equal(status!.details.guildId, GUILD.id);
      assert.equal(status!.details.guildName, GUILD.name);
      assert.ok(
        Math.abs(status!.expiresAt - (status!.connectedAt + ACCESS_TOKEN_TTL_SECONDS * 1000)) < 5_000,
        `expiresAt ${status!.expiresAt}`,
      );

      assert.equal(tokens.access.length, 1);
      assert.equal(tokens.refresh.length, 1);
      assertNotInStorage(ws, tokens.access[0]!, 'the Discord access token');
      assertNotInStorage(ws, tokens.refresh[0]!, 'the Discord refresh token');
      assert.equal(
        run.stdout.includes(tokens.access[0]!) || run.stdout.includes(tokens.refresh[0]!),
        false,
        'a token was printed',
      );
    });
  });

  describe('login failures', () => {
    it('a wrong bot token fails at step "bot token", before any consent', async () => {
      const before = tokenCalls().length;
      const run = await startLogin(ws, 'dcbadbot').exited;
      assert.equal(run.code, 1);
      assert.match(
        run.stderr,
        /channel dcbadbot: step "bot token" failed: discord: bot token check: 401: Unauthorized\. Check channels\.dcbadbot\.botToken/,
      );
      assert.doesNotMatch(run.stdout, /oauth2\/authorize/);
      assert.equal(tokenCalls().length, before);
    });

    it('denied consent: exit 1 at step "authorise", no code exchanged, nothing stored', async () => {
      const before = tokenCalls().length;
      fake.setConsent({ deny: true });
      let page: { status: number; page: string } | undefined;
      let run;
      try {
        run = await loginThroughBrowser(ws, 'dcfail', async (url) => void (page = await visit(await consent(url))));
      } finally {
        fake.setConsent({ deny: false });
      }
      assert.equal(run.code, 1);
      assert.match(page!.page, /authorisation refused \(access_denied\)/);
      assert.match(
        run.stderr,
        /channel dcfail: step "authorise" failed: the platform answered "access_denied".*consent was not given/,
      );
      assert.equal(tokenCalls().length, before);
      assert.equal(storedGrant(ws, 'dcfail'), undefined);
    });

    for (const [kind, spoil] of [
      [
        'an expired code',
        (back: URL) => {
          // Ten minutes have passed at the platform (the fake's clock for this one code).
          (fake as unknown as { codes: Map<string, { expiresAt: number }> }).codes.get(
            back.searchParams.get('code')!,
          )!.expiresAt = Date.now() - 1;
          return back;
        },
      ],
      [
        'an invalid code',
        (back: URL) => {
          back.searchParams.set('code', 'not-a-code-the-platform-issued');
          return back;
        },
      ],
    ] as const) {
      it(`${kind}: exit 1 at step "token" with the platform's invalid_grant and the fix; nothing stored`, async () => {
        const run = await loginThroughBrowser(
          ws,
          'dcfail',
          async (url) => void (await visit(spoil(await consent(url)))),
        );
        assert.equal(run.code, 1);
        assert.match(run.stdout, /✗ token\s+discord: token exchange: invalid_grant/);
        assert.match(
          run.stderr,
          /channel dcfail: step "token" failed: discord: token exchange: invalid_grant \(Invalid "code" in request\.\)\. Check channels\.dcfail\.clientId\/clientSecret/,
        );
        assert.equal(tokenCalls('authorization_code').at(-1)?.status, 400);
        assert.equal(storedGrant(ws, 'dcfail'), undefined);
      });
    }
  });

  describe('interactions (inbound)', () => {
    const command = {
      id: '1300000000000000003',
      application_id: DISCORD_CLIENT.clientId,
      type: 2,
      token: 'interaction-token',
      version: 1,
      guild_id: GUILD.id,
      channel_id: CHANNEL_ID,
      member: { user: { id: '1000000000000000001', username: 'alice' }, roles: [] },
      data: {
        id: '1400000000000000004',
        name: 'ask',
        type: 1,
        options: [{ name: 'question', type: 3, value: 'is it up?' }],
      },
    };

    it('PING is answered with {"type":1} and delivered nowhere', async () => {
      const seen = envelopes(target).length;
      const ping = await fake.deliverInteraction(`${gatehouse.webhookUrl}${interactions}`, {
        id: '1300000000000000009',
        type: 1,
        application_id: DISCORD_CLIENT.clientId,
        token: 't',
        version: 1,
      });
      assert.equal(ping.status, 200);
      assert.deepEqual(JSON.parse(ping.body), { type: 1 });
      assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen);
    });

    it('a signed command is deferred ({"type":5}) and reaches the target: channel, from, text, the raw interaction as payload', async () => {
      const seen = envelopes(target).length;
      const reply = await fake.deliverInteraction(`${gatehouse.webhookUrl}${interactions}`, command);
      assert.equal(reply.status, 200, reply.body);
      assert.deepEqual(JSON.parse(reply.body), { type: 5 });
      const envelope = await nthEnvelope(target, seen + 1);
      assert.deepEqual(envelope.channel, { name: 'dc', kind: 'oauth-bot', platform: 'discord' });
      assert.deepEqual(envelope.from, { id: '1000000000000000001', username: 'alice', channelId: CHANNEL_ID });
      assert.equal(envelope.text, '/ask question:is it up?');
      assert.deepEqual(envelope.payload, command);
    });

    it("a bad signature, another key's signature or a stale timestamp gets 401 and nothing reaches the target", async () => {
      const seen = envelopes(target).length;
      const forgedBody = { ...command, id: '1300000000000000005', data: { ...command.data, name: 'forged' } };
      // Signed body A, sent body B.
      const swapped = { ...fake.signInteraction(command), body: JSON.stringify(forgedBody) };
      // Someone else's key.
      const { privateKey } = generateKeyPairSync('ed25519');
      const ts = String(Math.floor(Date.now() / 1000));
      const otherKey = {
        headers: {
          'X-Signature-Ed25519': sign(null, Buffer.from(ts + JSON.stringify(forgedBody)), privateKey).toString('hex'),
          'X-Signature-Timestamp': ts,
        },
        body: JSON.stringify(forgedBody),
      };
      // A real signature, replayed ten minutes later.
      const stale = fake.signInteraction(forgedBody, Math.floor(Date.now() / 1000) - 600);
      for (const [what, signed] of [
        ['swapped body', swapped],
        ['other key', otherKey],
        ['stale', stale],
        ['unsigned', { headers: {}, body: JSON.stringify(forgedBody) }],
      ] as const) {
        const reply = await postSigned(signed);
        assert.equal(reply.status, 401, what);
        assert.equal(reply.json().error.code, 'invalid_webhook_signature', what);
      }
      assert.equal(await settledEnvelopeCount(target, sqliteQueued(ws)), seen);
    });
  });

  describe('outbound and refresh (after login)', () => {
    before(async () => {
      if (!storedGrant(ws, 'dc')) {
        const run = await loginThroughBrowser(ws, 'dc');
        assert.equal(run.code, 0, run.stderr);
      }
    });

    it("a message goes to the channel with `Bot <token>`; 200 with Discord's message id; without the API key 401 and Discord gets nothing", async () => {
      const creates = () => fake.calls.filter((c) => c.method === 'POST' && c.path.startsWith('/api/v10/channels/'));
      const before = creates().length;
      assert.equal((await send({ to: CHANNEL_ID, text: 'unauthorised' }, {})).status, 401);
      assert.equal(creates().length, before, 'Discord was called without the API key');

      const reply = await send({ to: CHANNEL_ID, text: 'deploy finished' });
      assert.equal(reply.status, 200, reply.body);
      const sent = fake.sent.at(-1)!;
      assert.deepEqual(reply.json(), { channel: 'dc', id: sent.message.id, to: CHANNEL_ID });
      assert.equal(sent.channelId, CHANNEL_ID);
      assert.equal(sent.content, 'deploy finished');
      assert.equal(creates().at(-1)!.headers.authorization, `Bot ${fake.botToken}`);
    });

    it("an unknown channel: 502 with Discord's error", async () => {
      fake.setKnownChannels([CHANNEL_ID]);
      try {
        const reply = await send({ to: '1100000000000000099', text: 'anyone?' });
        assert.equal(reply.status, 502);
        assert.equal(reply.json().error.platformError, 'discord: create message: Unknown Channel');
      } finally {
        fake.setKnownChannels('any');
      }
    });

    it('a grant expiring within a day is refreshed when gatehouse starts: refresh_token grant at Discord, new expiry in `channels status`, new tokens sealed', async () => {
      const before = storedGrant(ws, 'dc')!;
      const loginRefresh = issuedTokens(fake).refresh.at(-1)!;
      const refreshes = tokenCalls('refresh_token').length;
      await gatehouse.stop();
      gatehouse = await startGatehouse(ws);
      await gatehouse.process.waitFor((l) => l.msg === 'channel grant refreshed' && l.channel === 'dc');

      const refresh = tokenCalls('refresh_token');
      assert.equal(refresh.length, refreshes + 1);
      assert.equal((refresh.at(-1)!.body as any).refresh_token, loginRefresh);
      assert.equal(refresh.at(-1)!.status, 200);
      const [after] = await statusJson(ws, 'dc');
      assert.ok(after!.expiresAt > before.expires_at!, `expiry ${after!.expiresAt} not after ${before.expires_at}`);
      assert.ok(after!.expiresAt - Date.now() > (ACCESS_TOKEN_TTL_SECONDS - 60) * 1000);
      assert.equal(after!.lastError, null);
      const { access, refresh: current } = issuedTokens(fake);
      assertNotInStorage(ws, access.at(-1)!, 'the refreshed access token');
      assertNotInStorage(ws, current.at(-1)!, 'the refreshed refresh token');
      // The new grant serves: sends still work.
      assert.equal((await send({ to: CHANNEL_ID, text: 'after restart' })).status, 200);
    });

    it('a refresh the platform refuses is logged at error level and shown by `channels status` as the last error; the grant stays', async () => {
      fake.revokeRefreshTokens();
      await gatehouse.stop();
      gatehouse = await startGatehouse(ws);
      const line = await gatehouse.process.waitFor((l) => l.channel === 'dc' && /REFRESH FAILED/.test(l.msg ?? ''));
      assert.equal(line.level, 'error');
      assert.match(line.msg, /run `gatehouse channels login dc`/);
      const status = await channelsCli(ws, ['status', 'dc']);
      assert.match(
        status.stdout,
        /^ {4}last error {5}grant refresh failed: discord: token exchange: invalid_grant \(Invalid "refresh_token" in request\.\) \(\d{4}-.* ago\)\)$/m,
      );
      assert.match(status.stdout, /^✓ dc \(oauth-bot, discord\): connected since/m);
      assert.match(status.stdout, /^ {4}expires {8}\d{4}-.*\(in \d+ min\)$/m);
    });
  });

  // Last: its grant and token exchange would change the counts the tests above assert.
  it("login --public: the answer lands on the running server's callback route (a forged state is 400), the CLI takes it from storage", async () => {
    const login = startLogin(ws, 'dcpub', { args: ['--public'] });
    try {
      const authorizeUrl = await printedAuthorizeUrl(login);
      const callback = `${ws.webhookUrl}/webhook/channels/dcpub/oauth/callback`;
      assert.equal(authorizeUrl.searchParams.get('redirect_uri'), callback);
      const forged = await visit(`${callback}?code=forged-code&state=not-the-state`);
      assert.equal(forged.status, 400);
      assert.match(forged.page, /invalid_oauth_state/);
      const back = await consent(authorizeUrl);
      assert.equal(`${back.origin}${back.pathname}`, callback);
      const answered = await visit(back);
      assert.equal(answered.status, 200);
      assert.equal((await visit(back)).status, 400, 'an answer is taken once');
    } catch (err) {
      await login.kill();
      throw err;
    }
    const run = await login.exited;
    assert.equal(run.code, 0, run.stderr);
    assert.match(run.stdout, /channel dcpub connected/);
    assert.ok(
      !tokenCalls('authorization_code').some((c) => (c.body as any)?.code === 'forged-code'),
      'the forged code is never exchanged',
    );
    assert.equal(storedGrant(ws, 'dcpub')?.name, 'dcpub');
  });

  it('every call gatehouse made to Discord above is a documented one that breaks no rule of the reference', () => {
    // The browser's consent pages are the test's calls, not gatehouse's; they are documented too.
    assertCallsDocumented(fake);
  });
});
