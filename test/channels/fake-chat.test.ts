/**
 * Proves the fakes in test/helpers/fake-chat.ts speak the Telegram Bot API, Discord and Slack
 * the way the platforms do, using plain fetch, as a channel will: each call working, and failing
 * the way the platform fails.
 */
import assert from 'node:assert/strict';
import { createHash, createHmac, createPublicKey, randomBytes, verify } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import {
  DISCORD_CLIENT,
  SLACK_CLIENT,
  startFakeDiscord,
  startFakeSlack,
  startFakeTelegram,
  type FakeDiscord,
  type FakeSlack,
  type FakeTelegram,
} from '../helpers/fake-chat.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

interface Answer {
  status: number;
  headers: Headers;
  body: any;
}

async function answer(res: Response): Promise<Answer> {
  const text = await res.text();
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // an HTML page
  }
  return { status: res.status, headers: res.headers, body };
}

function postJson(url: string, body: unknown, headers: Record<string, string> = {}): Promise<Answer> {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  }).then(answer);
}

function postForm(url: string, form: Record<string, string>, headers: Record<string, string> = {}): Promise<Answer> {
  return fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
    body: new URLSearchParams(form),
  }).then(answer);
}

/** The browser's part of a consent screen: open it, return where the 302 sends the user back to. */
async function consent(url: string): Promise<URL> {
  const res = await fetch(url, { redirect: 'manual' });
  assert.equal(res.status, 302, `expected a redirect from ${url}`);
  return new URL(res.headers.get('location')!);
}

function basic(id: string, secret: string): Record<string, string> {
  return { authorization: `Basic ${Buffer.from(`${id}:${secret}`).toString('base64')}` };
}

function pkce(): { verifier: string; challenge: string } {
  const verifier = randomBytes(32).toString('base64url');
  return { verifier, challenge: createHash('sha256').update(verifier).digest('base64url') };
}

// ─── Telegram ─────────────────────────────────────────────────────────────────────────────────

describe('fake Telegram Bot API', () => {
  let fake: FakeTelegram;
  let hooks: RecordingServer;
  const api = (method: string, token = fake.token) => `${fake.url}/bot${token}/${method}`;
  before(async () => {
    fake = await startFakeTelegram();
    hooks = await startRecordingUpstream();
  });
  after(async () => {
    await fake.close();
    await hooks.close();
  });

  it('getMe answers the bot for its token, 401 for an unknown one, 404 for a malformed one or an unknown method', async () => {
    const me = await answer(await fetch(api('getMe')));
    assert.equal(me.status, 200);
    assert.equal(me.body.ok, true);
    assert.equal(me.body.result.is_bot, true);
    assert.equal(me.body.result.username, 'gatehouse_test_bot');
    assert.equal(me.body.result.id, Number(fake.token.split(':')[0]));
    assert.equal(typeof me.body.result.first_name, 'string');

    const unknown = await answer(await fetch(api('getMe', '123456:AAunknown')));
    assert.deepEqual(
      [unknown.status, unknown.body],
      [401, { ok: false, error_code: 401, description: 'Unauthorized' }],
    );
    assert.equal((await answer(await fetch(api('getMe', 'not-a-token')))).status, 404);
    assert.deepEqual((await answer(await fetch(api('noSuchMethod')))).body, {
      ok: false,
      error_code: 404,
      description: 'Not Found',
    });
    assert.equal((await answer(await fetch(api('GETME')))).status, 200, 'method names are case-insensitive');
  });

  it('addBot adds a second bot with its own identity', async () => {
    const bot = fake.addBot('987654321:AAsecond-bot-secret', { username: 'second_bot' });
    assert.equal(bot.id, 987654321);
    const me = await answer(await fetch(api('getMe', bot.token)));
    assert.equal(me.body.result.username, 'second_bot');
    assert.throws(() => fake.addBot('nope', { username: 'x' }));
  });

  it('setWebhook records url and secret_token; getWebhookInfo shows the url but never the secret', async () => {
    const set = await postJson(api('setWebhook'), {
      url: `${hooks.url}/tg`,
      secret_token: 'Sec_ret-123',
      allowed_updates: ['message'],
      drop_pending_updates: true,
    });
    assert.deepEqual([set.status, set.body], [200, { ok: true, result: true, description: 'Webhook was set' }]);
    const hook = fake.registeredWebhook(fake.token)!;
    assert.equal(hook.url, `${hooks.url}/tg`);
    assert.equal(hook.secretToken, 'Sec_ret-123');
    assert.deepEqual(hook.allowedUpdates, ['message']);

    const again = await postJson(api('setWebhook'), { url: `${hooks.url}/tg`, secret_token: 'Sec_ret-123' });
    assert.equal(
      again.body.description,
      'Webhook is already set',
      'allowed_updates omitted keeps the previous setting',
    );

    const info = await answer(await fetch(api('getWebhookInfo')));
    assert.equal(info.body.result.url, `${hooks.url}/tg`);
    assert.equal(info.body.result.pending_update_count, 0);
    assert.equal(info.body.result.has_custom_certificate, false);
    assert.deepEqual(info.body.result.allowed_updates, ['message']);
    assert.ok(!JSON.stringify(info.body).includes('Sec_ret-123'), 'the secret is not shown');

    const busy = await answer(await fetch(api('getUpdates')));
    assert.equal(busy.status, 409);
  });

  it('setWebhook takes a form body too, with allowed_updates as a JSON string', async () => {
    const set = await postForm(api('setWebhook'), {
      url: `${hooks.url}/form`,
      secret_token: 'form_secret',
      allowed_updates: '["message","callback_query"]',
    });
    assert.equal(set.body.ok, true);
    assert.deepEqual(fake.registeredWebhook()!.allowedUpdates, ['message', 'callback_query']);
    assert.equal(fake.registeredWebhook()!.secretToken, 'form_secret');
  });

  it('setWebhook refuses a bad secret_token, http to a public host and a port Telegram does not use; nothing changes', async () => {
    await postJson(api('setWebhook'), { url: `${hooks.url}/tg`, secret_token: 'good' });
    const cases: [Record<string, unknown>, string][] = [
      [{ url: `${hooks.url}/x`, secret_token: 'has space' }, 'Bad Request: secret token contains unallowed characters'],
      [{ url: `${hooks.url}/x`, secret_token: 'a:b' }, 'Bad Request: secret token contains unallowed characters'],
      [{ url: `${hooks.url}/x`, secret_token: 'a'.repeat(257) }, 'Bad Request: secret token is too long'],
      [{ url: 'http://example.com/hook' }, 'Bad Request: bad webhook: An HTTPS URL must be provided for webhook'],
      [
        { url: 'https://example.com:9443/hook' },
        'Bad Request: bad webhook: Webhook can be set up only on ports 80, 88, 443 or 8443',
      ],
    ];
    for (const [params, description] of cases) {
      const res = await postJson(api('setWebhook'), params);
      assert.deepEqual(
        [res.status, res.body],
        [400, { ok: false, error_code: 400, description }],
        JSON.stringify(params).slice(0, 60),
      );
    }
    assert.equal(fake.registeredWebhook()!.secretToken, 'good');
    assert.equal(fake.registeredWebhook()!.url, `${hooks.url}/tg`);

    const ok = await postJson(api('setWebhook'), {
      url: 'https://example.com:8443/hook',
      secret_token: 'A'.repeat(256),
    });
    assert.equal(ok.body.ok, true, 'https on 8443 and a 256-character secret are fine');
  });

  it('deleteWebhook (or setWebhook with an empty url) removes it', async () => {
    await postJson(api('setWebhook'), { url: `${hooks.url}/tg`, secret_token: 's' });
    const del = await postJson(api('deleteWebhook'), { drop_pending_updates: true });
    assert.deepEqual(del.body, { ok: true, result: true, description: 'Webhook was deleted' });
    assert.equal(fake.registeredWebhook(), undefined);
    assert.equal((await answer(await fetch(api('deleteWebhook')))).body.description, 'Webhook is already deleted');
    assert.deepEqual((await answer(await fetch(api('getWebhookInfo')))).body.result, {
      url: '',
      has_custom_certificate: false,
      pending_update_count: 0,
    });
    assert.deepEqual((await answer(await fetch(api('getUpdates')))).body, { ok: true, result: [] });

    await postJson(api('setWebhook'), { url: `${hooks.url}/tg` });
    assert.equal((await postJson(api('setWebhook'), { url: '' })).body.description, 'Webhook was deleted');
  });

  it('sendMessage answers the Message, message_id counting up per chat, and records it', async () => {
    const first = await postJson(api('sendMessage'), { chat_id: 4242, text: 'hello' });
    assert.equal(first.status, 200);
    const m = first.body.result;
    assert.deepEqual(m.chat, { id: 4242, type: 'private' });
    assert.equal(m.text, 'hello');
    assert.equal(m.from.is_bot, true);
    assert.ok(Math.abs(m.date - Date.now() / 1000) < 5, 'date is unix seconds');
    const second = await postForm(api('sendMessage'), { chat_id: '4242', text: 'again' });
    assert.equal(second.body.result.message_id, m.message_id + 1, 'a form chat_id is the same chat');
    const group = await postJson(api('sendMessage'), { chat_id: -1001234567890, text: 'hi group' });
    assert.equal(group.body.result.chat.type, 'supergroup');
    assert.equal(group.body.result.message_id, 1);

    const last = fake.sent.at(-1)!;
    assert.equal(last.chatId, '-1001234567890');
    assert.equal(last.text, 'hi group');
    assert.equal(last.token, fake.token);
  });

  it('sendMessage refuses an unknown chat (when chats are restricted), an empty text, a missing chat_id', async () => {
    fake.setKnownChats([4242]);
    try {
      const before = fake.sent.length;
      const unknown = await postJson(api('sendMessage'), { chat_id: 777, text: 'x' });
      assert.deepEqual(
        [unknown.status, unknown.body],
        [400, { ok: false, error_code: 400, description: 'Bad Request: chat not found' }],
      );
      assert.equal((await postJson(api('sendMessage'), { chat_id: 4242, text: 'known' })).status, 200);
      assert.equal(
        (await postJson(api('sendMessage'), { chat_id: 4242, text: '  ' })).body.description,
        'Bad Request: message text is empty',
      );
      assert.equal(
        (await postJson(api('sendMessage'), { text: 'x' })).body.description,
        'Bad Request: chat_id is empty',
      );
      assert.equal(
        (await postJson(api('sendMessage'), { chat_id: 4242, text: 'x'.repeat(4097) })).body.description,
        'Bad Request: message is too long',
      );
      assert.equal(fake.sent.length, before + 1, 'only the good message was sent');
    } finally {
      fake.setKnownChats('any');
    }
  });

  it('deliverUpdate POSTs the update with X-Telegram-Bot-Api-Secret-Token and returns the status', async () => {
    await postJson(api('setWebhook'), { url: `${hooks.url}/tg-hook`, secret_token: 'deliver_me' });
    const before = hooks.received.length;
    const status = await fake.deliverUpdate(fake.token, {
      message: { message_id: 1, chat: { id: 4242, type: 'private' }, date: 1, text: 'hi' },
    });
    assert.equal(status, 200);
    const got = hooks.received[before]!;
    assert.equal(got.method, 'POST');
    assert.equal(got.url, '/tg-hook');
    assert.equal(got.headers['x-telegram-bot-api-secret-token'], 'deliver_me');
    assert.equal(got.headers['content-type'], 'application/json');
    const update = JSON.parse(got.body);
    assert.equal(typeof update.update_id, 'number');
    assert.equal(update.message.text, 'hi');

    await fake.deliverUpdate(fake.token, { update_id: 5, message: { text: 'again' } });
    assert.equal(JSON.parse(hooks.received.at(-1)!.body).update_id, 5, 'a given update_id is kept');

    await postJson(api('setWebhook'), { url: `${hooks.url}/no-secret` });
    await fake.deliverUpdate(fake.token, { message: { text: 'x' } });
    assert.equal(
      hooks.received.at(-1)!.headers['x-telegram-bot-api-secret-token'],
      undefined,
      'no secret_token, no header',
    );
  });

  it('deliverUpdate reports a refusing webhook in getWebhookInfo, and fails without a webhook', async () => {
    const refusing = await startRecordingUpstream((_req, res) => res.writeHead(401).end());
    try {
      await postJson(api('setWebhook'), { url: `${refusing.url}/tg`, secret_token: 's' });
      assert.equal(await fake.deliverUpdate(fake.token, { message: { text: 'x' } }), 401);
      const info = (await answer(await fetch(api('getWebhookInfo')))).body.result;
      assert.equal(info.last_error_message, 'Wrong response from the webhook: 401 Unauthorized');
      assert.equal(typeof info.last_error_date, 'number');
      assert.equal(fake.deliveries.at(-1)!.status, 401);
    } finally {
      await refusing.close();
    }
    await postJson(api('deleteWebhook'), {});
    await assert.rejects(fake.deliverUpdate(fake.token, { message: {} }), /no webhook/);
  });

  it('failNext answers an injected error once; calls are recorded with headers and body', async () => {
    fake.failNext({ path: /\/sendMessage$/ }, { status: 429 });
    const limited = await postJson(api('sendMessage'), { chat_id: 1, text: 'x' }, { 'x-test': 'yes' });
    assert.equal(limited.status, 429);
    assert.deepEqual(limited.body, {
      ok: false,
      error_code: 429,
      description: 'Too Many Requests: retry after 1',
      parameters: { retry_after: 1 },
    });
    assert.equal((await postJson(api('sendMessage'), { chat_id: 1, text: 'x' })).status, 200);

    fake.failNext(
      { method: 'POST', path: `/bot${fake.token}/sendMessage` },
      { status: 403, body: { ok: false, error_code: 403, description: 'Forbidden: bot was blocked by the user' } },
    );
    assert.equal(
      (await postJson(api('sendMessage'), { chat_id: 1, text: 'x' })).body.description,
      'Forbidden: bot was blocked by the user',
    );

    const call = fake.calls.find((c) => c.headers['x-test'] === 'yes')!;
    assert.equal(call.method, 'POST');
    assert.equal(call.path, `/bot${fake.token}/sendMessage`);
    assert.deepEqual(call.body, { chat_id: 1, text: 'x' });
    assert.equal(call.status, 429);
  });

  it('refuses what the Bot API refuses, each noted as a violation with its source: a wrong HTTP method or path, an unknown method, a malformed parameter', async () => {
    const put = await answer(await fetch(api('getMe'), { method: 'PUT' }));
    assert.equal(put.status, 405);
    assert.match(fake.calls.at(-1)!.violations[0]!, /takes GET and POST .*#making-requests/);
    const unknown = await answer(await fetch(api('sendMesage')));
    assert.deepEqual([unknown.status, unknown.body], [404, { ok: false, error_code: 404, description: 'Not Found' }]);
    assert.equal(fake.calls.at(-1)!.route, undefined);
    assert.match(fake.calls.at(-1)!.violations[0]!, /no Bot API method "sendMesage"/);
    assert.equal((await answer(await fetch(`${fake.url}/sendMessage`))).status, 404);

    const badUrl = await postJson(api('setWebhook'), { url: 'https://exa mple.com/hook' });
    assert.deepEqual(badUrl.body, {
      ok: false,
      error_code: 400,
      description: 'Bad Request: invalid webhook URL specified',
    });
    const parseMode = await postJson(api('sendMessage'), { chat_id: 4242, text: 'x', parse_mode: 'markdown_v2' });
    assert.deepEqual(parseMode.body, {
      ok: false,
      error_code: 400,
      description: 'Bad Request: unsupported parse_mode',
    });
    assert.match(fake.calls.at(-1)!.violations[0]!, /#formatting-options/);
    assert.equal(
      (await postJson(api('sendMessage'), { chat_id: 4242, text: 'x', parse_mode: 'html' })).status,
      200,
      'parse_mode is compared lower-cased',
    );
  });

  it('notes what the Bot API silently ignores: unknown update types, a malformed allowed_updates, setWebhook without url, a body it cannot read', async () => {
    const set = await postJson(api('setWebhook'), {
      url: `${hooks.url}/tg`,
      allowed_updates: ['message', 'Edited_Message', 'messages'],
    });
    assert.equal(set.body.ok, true, 'Telegram accepts the call');
    assert.deepEqual(
      fake.registeredWebhook()!.allowedUpdates,
      ['message', 'edited_message'],
      'names compare lower-cased; an unknown one is dropped',
    );
    assert.deepEqual(
      fake.calls.at(-1)!.violations.map((v) => v.replace(/ \(.*/, '')),
      ['telegram: allowed_updates names no such update type: messages'],
    );

    assert.equal(
      (await postJson(api('setWebhook'), { url: `${hooks.url}/tg`, allowed_updates: 'message' })).body.ok,
      true,
    );
    assert.deepEqual(
      fake.registeredWebhook()!.allowedUpdates,
      ['message', 'edited_message'],
      'a malformed list keeps the previous one',
    );
    assert.match(fake.calls.at(-1)!.violations[0]!, /JSON-serialized list/);

    const noUrl = await postJson(api('setWebhook'), { secret_token: 'abc' });
    assert.equal(noUrl.body.description, 'Webhook was deleted', 'the server reads a missing url as ""');
    assert.match(fake.calls.at(-1)!.violations[0]!, /without its required "url"/);

    const text = await answer(
      await fetch(api('sendMessage'), {
        method: 'POST',
        headers: { 'content-type': 'text/plain' },
        body: 'chat_id=1&text=x',
      }),
    );
    assert.equal(text.body.description, 'Bad Request: chat_id is empty', 'a text/plain body carries no parameters');
    assert.equal(fake.calls.at(-1)!.violations.length, 2);
  });

  it('records the documented route of each call; a refusal for another reason (an unknown chat) is no violation', async () => {
    await postJson(api('sendMessage'), { chat_id: 4242, text: 'fine' });
    const ok = fake.calls.at(-1)!;
    assert.equal(ok.route?.name, 'sendMessage');
    assert.equal(ok.route?.source, 'https://core.telegram.org/bots/api#sendmessage');
    assert.deepEqual(ok.violations, []);
    fake.setKnownChats([4242]);
    try {
      assert.equal((await postJson(api('sendMessage'), { chat_id: 1, text: 'x' })).status, 400);
    } finally {
      fake.setKnownChats('any');
    }
    assert.deepEqual(fake.calls.at(-1)!.violations, []);
    assert.equal((await answer(await fetch(api('getMe', '123456:AAunknown')))).status, 401);
    assert.deepEqual(fake.calls.at(-1)!.violations, [], 'an unknown token is not a contract violation');
  });
});

// ─── Discord ──────────────────────────────────────────────────────────────────────────────────

describe('fake Discord', () => {
  let fake: FakeDiscord;
  const redirectUri = 'http://127.0.0.1:9/discord/callback';
  /** Every API call carries the User-Agent Discord requires (reference#user-agent). */
  const ua = { 'user-agent': 'DiscordBot (https://gatehouse.test, 1.0)' };
  const channelId = '1200000000000000001';
  before(async () => (fake = await startFakeDiscord()));
  after(() => fake.close());

  function authorizeUrl(params: Record<string, string> = {}): string {
    const q = new URLSearchParams({
      client_id: DISCORD_CLIENT.clientId,
      redirect_uri: redirectUri,
      response_type: 'code',
      scope: 'bot applications.commands',
      permissions: '2048',
      state: 'st-1',
      ...params,
    });
    return `${fake.url}/oauth2/authorize?${q}`;
  }

  async function install(): Promise<{ code: string; verifier: string }> {
    const { verifier, challenge } = pkce();
    const back = await consent(authorizeUrl({ code_challenge: challenge, code_challenge_method: 'S256' }));
    return { code: back.searchParams.get('code')!, verifier };
  }

  const tokenUrl = () => `${fake.url}/api/oauth2/token`;
  const exchange = (form: Record<string, string>, headers?: Record<string, string>) =>
    postForm(tokenUrl(), form, { ...ua, ...headers });

  it('the install page approves: 302 to redirect_uri with code, state, guild_id and permissions', async () => {
    fake.setConsent({ guildId: '1300000000000000001', guildName: 'Ops' });
    const back = await consent(authorizeUrl());
    assert.equal(`${back.origin}${back.pathname}`, redirectUri);
    assert.match(back.searchParams.get('code')!, /^[A-Za-z0-9]{30}$/);
    assert.equal(back.searchParams.get('state'), 'st-1');
    assert.equal(back.searchParams.get('guild_id'), '1300000000000000001');
    assert.equal(back.searchParams.get('permissions'), '2048');
  });

  it('exchanges the code (PKCE S256, secret in the form) for tokens and the guild', async () => {
    fake.setConsent({ guildId: '1300000000000000002', guildName: 'Ops' });
    const { code, verifier } = await install();
    const res = await exchange({
      client_id: DISCORD_CLIENT.clientId,
      client_secret: DISCORD_CLIENT.clientSecret,
      grant_type: 'authorization_code',
      code,
      redirect_uri: redirectUri,
      code_verifier: verifier,
    });
    assert.equal(res.status, 200);
    assert.equal(res.body.token_type, 'Bearer');
    assert.equal(res.body.expires_in, 604800);
    assert.equal(res.body.scope, 'bot applications.commands');
    assert.ok(res.body.access_token && res.body.refresh_token);
    assert.equal(res.body.guild.id, '1300000000000000002');
    assert.equal(res.body.guild.name, 'Ops');

    const me = await answer(
      await fetch(`${fake.url}/api/v10/oauth2/@me`, {
        headers: { ...ua, authorization: `Bearer ${res.body.access_token}` },
      }),
    );
    assert.deepEqual(me.body.scopes, ['bot', 'applications.commands']);
    assert.equal(me.body.application.id, DISCORD_CLIENT.clientId);
  });

  it('takes the client by HTTP Basic, and refuses a wrong secret with 401 invalid_client', async () => {
    const first = await install();
    const ok = await exchange(
      { grant_type: 'authorization_code', code: first.code, redirect_uri: redirectUri, code_verifier: first.verifier },
      basic(DISCORD_CLIENT.clientId, DISCORD_CLIENT.clientSecret),
    );
    assert.equal(ok.status, 200);
    const second = await install();
    const bad = await exchange(
      {
        grant_type: 'authorization_code',
        code: second.code,
        redirect_uri: redirectUri,
        code_verifier: second.verifier,
      },
      basic(DISCORD_CLIENT.clientId, 'wrong'),
    );
    assert.deepEqual([bad.status, bad.body], [401, { error: 'invalid_client' }]);
  });

  it('refuses a wrong code_verifier, then the spent code; a wrong redirect_uri; an unknown grant type', async () => {
    const creds = { client_id: DISCORD_CLIENT.clientId, client_secret: DISCORD_CLIENT.clientSecret };
    const { code, verifier } = await install();
    const wrong = await exchange({
      ...creds,
      grant_type: 'authorization_code',
      code,
      redirect_uri: redirectUri,
      code_verifier: pkce().verifier,
    });
    assert.deepEqual([wrong.status, wrong.body.error], [400, 'invalid_grant']);
    const reused = await exchange({
      ...creds,
      grant_type: 'authorization_code',
      code,
      redirect_uri: redirectUri,
      code_verifier: verifier,
    });
    assert.deepEqual(reused.body, { error: 'invalid_grant', error_description: 'Invalid "code" in request.' });

    const other = await install();
    const elsewhere = await exchange({
      ...creds,
      grant_type: 'authorization_code',
      code: other.code,
      redirect_uri: 'http://127.0.0.1:9/elsewhere',
      code_verifier: other.verifier,
    });
    assert.deepEqual(elsewhere.body, {
      error: 'invalid_grant',
      error_description: 'Invalid "redirect_uri" in request.',
    });

    const third = await install();
    const missing = await exchange({
      ...creds,
      grant_type: 'authorization_code',
      code: third.code,
      redirect_uri: redirectUri,
    });
    assert.deepEqual(missing.body, { error: 'invalid_request', error_description: 'Missing "code_verifier"' });

    assert.deepEqual((await exchange({ ...creds, grant_type: 'password' })).body, { error: 'unsupported_grant_type' });
  });

  it('a code without a challenge needs no verifier', async () => {
    const back = await consent(authorizeUrl());
    const res = await exchange({
      client_id: DISCORD_CLIENT.clientId,
      client_secret: DISCORD_CLIENT.clientSecret,
      grant_type: 'authorization_code',
      code: back.searchParams.get('code')!,
      redirect_uri: redirectUri,
    });
    assert.equal(res.status, 200);
  });

  it('a user who denies comes back with error=access_denied and the state, and no code', async () => {
    fake.setConsent({ deny: true });
    try {
      const back = await consent(authorizeUrl({ state: 'xyz' }));
      assert.equal(back.searchParams.get('error'), 'access_denied');
      assert.equal(back.searchParams.get('state'), 'xyz');
      assert.equal(back.searchParams.get('code'), null);
      assert.equal(back.searchParams.get('guild_id'), null);
    } finally {
      fake.setConsent({ deny: false });
    }
  });

  it('an unknown client or unregistered redirect_uri gets an error page, never a redirect', async () => {
    const strict = await startFakeDiscord({ clients: [{ ...DISCORD_CLIENT, redirectUris: [redirectUri] }] });
    try {
      const q = (extra: Record<string, string>) =>
        new URLSearchParams({
          client_id: DISCORD_CLIENT.clientId,
          redirect_uri: redirectUri,
          response_type: 'code',
          scope: 'bot',
          ...extra,
        });
      const evil = await fetch(`${strict.url}/oauth2/authorize?${q({ redirect_uri: 'https://evil.example/cb' })}`, {
        redirect: 'manual',
      });
      assert.equal(evil.status, 400);
      assert.equal(evil.headers.get('location'), null);
      const unknown = await fetch(`${strict.url}/oauth2/authorize?${q({ client_id: '1' })}`, { redirect: 'manual' });
      assert.equal(unknown.status, 400);
      assert.equal((await consent(`${strict.url}/oauth2/authorize?${q({})}`)).searchParams.has('code'), true);
    } finally {
      await strict.close();
    }
  });

  it('refreshes (the old refresh token is then spent); expired access and revoked refresh tokens fail', async () => {
    const creds = { client_id: DISCORD_CLIENT.clientId, client_secret: DISCORD_CLIENT.clientSecret };
    const { code, verifier } = await install();
    const tokens = (
      await exchange({
        ...creds,
        grant_type: 'authorization_code',
        code,
        redirect_uri: redirectUri,
        code_verifier: verifier,
      })
    ).body;
    const refreshed = await exchange({ ...creds, grant_type: 'refresh_token', refresh_token: tokens.refresh_token });
    assert.equal(refreshed.status, 200);
    assert.notEqual(refreshed.body.access_token, tokens.access_token);
    assert.equal(refreshed.body.scope, 'bot applications.commands');
    assert.equal(refreshed.body.guild, undefined, 'only the install answer carries the guild');
    const spent = await exchange({ ...creds, grant_type: 'refresh_token', refresh_token: tokens.refresh_token });
    assert.deepEqual([spent.status, spent.body.error], [400, 'invalid_grant']);

    const authMe = (token: string) =>
      fetch(`${fake.url}/api/v10/oauth2/@me`, { headers: { ...ua, authorization: `Bearer ${token}` } }).then(answer);
    assert.equal((await authMe(refreshed.body.access_token)).status, 200);
    fake.expireAccessTokens();
    assert.deepEqual(await authMe(refreshed.body.access_token).then((a) => [a.status, a.body]), [
      401,
      { message: '401: Unauthorized', code: 0 },
    ]);

    fake.revokeRefreshTokens();
    const revoked = await exchange({
      ...creds,
      grant_type: 'refresh_token',
      refresh_token: refreshed.body.refresh_token,
    });
    assert.deepEqual(revoked.body, {
      error: 'invalid_grant',
      error_description: 'Invalid "refresh_token" in request.',
    });
  });

  it('GET /users/@me validates the bot token', async () => {
    const me = await answer(
      await fetch(`${fake.url}/api/v10/users/@me`, { headers: { ...ua, authorization: `Bot ${fake.botToken}` } }),
    );
    assert.equal(me.status, 200);
    assert.equal(me.body.id, fake.botUser.id);
    assert.equal(me.body.bot, true);
    const bad = await answer(
      await fetch(`${fake.url}/api/v10/users/@me`, { headers: { ...ua, authorization: 'Bot nope' } }),
    );
    assert.deepEqual([bad.status, bad.body], [401, { message: '401: Unauthorized', code: 0 }]);
    const none = await answer(await fetch(`${fake.url}/api/v10/users/@me`, { headers: ua }));
    assert.equal(none.status, 401);
  });

  it('creates a message with a bot token and records it', async () => {
    const res = await postJson(
      `${fake.url}/api/v10/channels/${channelId}/messages`,
      { content: 'deploy finished', nonce: 'n-1' },
      { ...ua, authorization: `Bot ${fake.botToken}` },
    );
    assert.equal(res.status, 200);
    assert.match(res.body.id, /^\d{17,20}$/);
    assert.equal(res.body.channel_id, channelId);
    assert.equal(res.body.content, 'deploy finished');
    assert.equal(res.body.author.id, fake.botUser.id);
    assert.equal(res.body.nonce, 'n-1');
    assert.ok(!Number.isNaN(Date.parse(res.body.timestamp)));
    const next = await postJson(
      `${fake.url}/api/v10/channels/${channelId}/messages`,
      { content: 'again' },
      { ...ua, authorization: `Bot ${fake.botToken}` },
    );
    assert.ok(BigInt(next.body.id) > BigInt(res.body.id), 'snowflakes increase');
    assert.deepEqual(fake.sent.at(-1)!.content, 'again');
    assert.equal(fake.sent.at(-1)!.channelId, channelId);
  });

  it('message errors: bad bot token 401, unknown channel 404 10003, not a snowflake, empty, too long', async () => {
    const before = fake.sent.length;
    const post = (channel: string, body: unknown, token = fake.botToken) =>
      postJson(`${fake.url}/api/v10/channels/${channel}/messages`, body, { ...ua, authorization: `Bot ${token}` });
    assert.deepEqual(await post(channelId, { content: 'x' }, 'stolen').then((a) => [a.status, a.body]), [
      401,
      { message: '401: Unauthorized', code: 0 },
    ]);
    fake.setKnownChannels([channelId]);
    try {
      assert.deepEqual(await post('1200000000000000999', { content: 'x' }).then((a) => [a.status, a.body]), [
        404,
        { message: 'Unknown Channel', code: 10003 },
      ]);
    } finally {
      fake.setKnownChannels('any');
    }
    const notSnowflake = await post('general', { content: 'x' });
    assert.deepEqual([notSnowflake.status, notSnowflake.body.code], [400, 50035]);
    assert.deepEqual(await post(channelId, { content: '' }).then((a) => [a.status, a.body]), [
      400,
      { message: 'Cannot send an empty message', code: 50006 },
    ]);
    const long = await post(channelId, { content: 'x'.repeat(2001) });
    assert.equal(long.body.errors.content._errors[0].code, 'BASE_TYPE_MAX_LENGTH');
    const badJson = await answer(
      await fetch(`${fake.url}/api/v10/channels/${channelId}/messages`, {
        method: 'POST',
        headers: { ...ua, authorization: `Bot ${fake.botToken}`, 'content-type': 'application/json' },
        body: '{',
      }),
    );
    assert.deepEqual([badJson.status, badJson.body.code], [400, 50109]);
    assert.equal(fake.sent.length, before, 'nothing was sent');
  });

  it('setBotToken rotates the token: the old one answers 401', async () => {
    const old = fake.botToken;
    fake.setBotToken('MTE4NzY1NDMyMTA5ODc2NTQzMg.rotated.new-secret');
    try {
      assert.equal(
        (await fetch(`${fake.url}/api/v10/users/@me`, { headers: { ...ua, authorization: `Bot ${old}` } })).status,
        401,
      );
      assert.equal(
        (await fetch(`${fake.url}/api/v10/users/@me`, { headers: { ...ua, authorization: `Bot ${fake.botToken}` } }))
          .status,
        200,
      );
    } finally {
      fake.setBotToken(old);
    }
  });

  it("failNext injects a 429 with Discord's rate-limit body and Retry-After", async () => {
    fake.failNext({ method: 'POST', path: `/api/v10/channels/${channelId}/messages` }, { status: 429 });
    const limited = await postJson(
      `${fake.url}/api/v10/channels/${channelId}/messages`,
      { content: 'x' },
      { ...ua, authorization: `Bot ${fake.botToken}` },
    );
    assert.equal(limited.status, 429);
    assert.equal(limited.headers.get('retry-after'), '1');
    assert.deepEqual(limited.body, { message: 'You are being rate limited.', retry_after: 1, global: false });
  });

  it('signInteraction signs timestamp+body with Ed25519; the public key is 64 hex chars', async () => {
    assert.match(fake.publicKeyHex, /^[0-9a-f]{64}$/);
    const publicKey = createPublicKey({
      key: { kty: 'OKP', crv: 'Ed25519', x: Buffer.from(fake.publicKeyHex, 'hex').toString('base64url') },
      format: 'jwk',
    });
    const signed = fake.signInteraction({ type: 1, id: '1', application_id: DISCORD_CLIENT.clientId }, 1_700_000_000);
    assert.equal(signed.headers['X-Signature-Timestamp'], '1700000000');
    const signature = Buffer.from(signed.headers['X-Signature-Ed25519']!, 'hex');
    assert.equal(signature.length, 64);
    assert.ok(verify(null, Buffer.from(`1700000000${signed.body}`), publicKey, signature));
    assert.ok(
      !verify(null, Buffer.from(`1700000000${signed.body} `), publicKey, signature),
      'a changed body does not verify',
    );
    assert.ok(
      !verify(null, Buffer.from(`1700000001${signed.body}`), publicKey, signature),
      'a changed timestamp does not verify',
    );
  });

  it('deliverInteraction POSTs a signed interaction and returns the answer', async () => {
    const endpoint = await startRecordingUpstream((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"type":1}');
    });
    try {
      const result = await fake.deliverInteraction(`${endpoint.url}/interactions`, { type: 1 });
      assert.deepEqual([result.status, JSON.parse(result.body)], [200, { type: 1 }]);
      const got = endpoint.received[0]!;
      assert.equal(got.body, '{"type":1}');
      assert.match(got.headers['x-signature-ed25519'] as string, /^[0-9a-f]{128}$/);
      assert.match(got.headers['x-signature-timestamp'] as string, /^\d+$/);
    } finally {
      await endpoint.close();
    }
  });

  it("refuses an API call without Discord's User-Agent (403, code 40333), but not the browser's consent page", async () => {
    for (const agent of [undefined, 'node', 'Mozilla/5.0']) {
      const res = await answer(
        await fetch(`${fake.url}/api/v10/users/@me`, {
          headers: { authorization: `Bot ${fake.botToken}`, ...(agent ? { 'user-agent': agent } : {}) },
        }),
      );
      assert.deepEqual([res.status, res.body.code], [403, 40333], String(agent));
      assert.match(fake.calls.at(-1)!.violations[0]!, /DiscordBot \(\$url, \$versionNumber\).*reference#user-agent/);
    }
    assert.equal(
      (
        await postForm(
          tokenUrl(),
          { grant_type: 'refresh_token', refresh_token: 'x' },
          { ...basic(DISCORD_CLIENT.clientId, DISCORD_CLIENT.clientSecret) },
        )
      ).status,
      403,
      'the token URL is the API too',
    );
    assert.equal((await fetch(authorizeUrl(), { redirect: 'manual' })).status, 302);
  });

  it('a wrong method is 405, an unknown route 404, a discontinued version 400; a deprecated or missing version is noted', async () => {
    const bot = { ...ua, authorization: `Bot ${fake.botToken}` };
    const wrong = await answer(await fetch(`${fake.url}/api/v10/users/@me`, { method: 'POST', headers: bot }));
    assert.deepEqual([wrong.status, wrong.body], [405, { message: '405: Method Not Allowed', code: 0 }]);
    assert.match(fake.calls.at(-1)!.violations[0]!, /the reference has GET \/users\/@me/);
    const missing = await answer(await fetch(`${fake.url}/api/v10/users/@you`, { headers: bot }));
    assert.deepEqual([missing.status, missing.body], [404, { message: '404: Not Found', code: 0 }]);
    assert.equal((await fetch(`${fake.url}/api/v5/users/@me`, { headers: bot })).status, 400);
    assert.equal((await fetch(`${fake.url}/api/v8/users/@me`, { headers: bot })).status, 200);
    assert.match(fake.calls.at(-1)!.violations[0]!, /API v8 is deprecated/);
    assert.equal((await fetch(`${fake.url}/api/users/@me`, { headers: bot })).status, 200);
    assert.match(fake.calls.at(-1)!.violations[0]!, /default, v6/);
    assert.equal(
      (await fetch(`${fake.url}/api/v10/channels/${channelId}/messages`, { headers: bot })).status,
      500,
      'documented, not faked: fails loudly',
    );
  });

  it('the token URL takes only a form, and the client by Basic or in the form: anything else is refused and noted', async () => {
    const creds = { client_id: DISCORD_CLIENT.clientId, client_secret: DISCORD_CLIENT.clientSecret };
    const json = await postJson(tokenUrl(), { ...creds, grant_type: 'refresh_token', refresh_token: 'x' }, ua);
    assert.deepEqual([json.status, json.body.error], [400, 'unsupported_grant_type']);
    assert.match(fake.calls.at(-1)!.violations[0]!, /only application\/x-www-form-urlencoded/);
    const anonymous = await exchange({ grant_type: 'refresh_token', refresh_token: 'x' });
    assert.deepEqual([anonymous.status, anonymous.body], [401, { error: 'invalid_client' }]);
    assert.match(fake.calls.at(-1)!.violations[0]!, /needs the client/);
    await exchange({
      client_id: DISCORD_CLIENT.clientId,
      client_secret: 'wrong',
      grant_type: 'refresh_token',
      refresh_token: 'x',
    });
    assert.deepEqual(
      fake.calls.at(-1)!.violations,
      [],
      "a wrong secret is the platform's answer, not a contract violation",
    );
    const noRefresh = await exchange({ ...creds, grant_type: 'refresh_token' });
    assert.equal(noRefresh.body.error, 'invalid_request');
    assert.match(fake.calls.at(-1)!.violations[0]!, /needs "refresh_token"/);
  });

  it('Create Message takes `Bot <token>` and a JSON or form body with content; anything else is refused and noted', async () => {
    const url = `${fake.url}/api/v10/channels/${channelId}/messages`;
    const before = fake.sent.length;
    const cases: [Record<string, string>, string | undefined, number, RegExp][] = [
      [{}, JSON.stringify({ content: 'x' }), 401, /without an Authorization header/],
      [
        { authorization: `Bearer ${fake.botToken}` },
        JSON.stringify({ content: 'x' }),
        401,
        /takes Bot <token>, not Bearer/,
      ],
      [{ authorization: `Bot ${fake.botToken}`, 'content-type': 'text/plain' }, 'x', 400, /takes application\/json/],
      [
        { authorization: `Bot ${fake.botToken}`, 'content-type': 'application/json' },
        JSON.stringify({ content: '  \n' }),
        400,
        /needs content/,
      ],
      [
        { authorization: `Bot ${fake.botToken}`, 'content-type': 'application/json' },
        JSON.stringify({ content: 'x', nonce: 'n'.repeat(26) }),
        400,
        /nonce is up to 25/,
      ],
    ];
    for (const [headers, body, status, violation] of cases) {
      const res = await fetch(url, { method: 'POST', headers: { ...ua, ...headers }, body });
      assert.equal(res.status, status, String(violation));
      assert.match(fake.calls.at(-1)!.violations[0] ?? '', violation);
    }
    // 2000 characters are code points: 2000 emoji (4000 UTF-16 units) are fine, 2001 are not.
    const post = (content: string) => postJson(url, { content }, { ...ua, authorization: `Bot ${fake.botToken}` });
    assert.equal((await post('🚀'.repeat(2000))).status, 200);
    assert.equal((await post('🚀'.repeat(2001))).status, 400);
    assert.equal(fake.sent.length, before + 1);
  });

  it('checkInteractionsEndpoint: a PING answered {"type":1} and a forged one 401 pass; an endpoint that accepts the forgery fails', async () => {
    const good = await startRecordingUpstream((req, res) => {
      const valid = verify(
        null,
        Buffer.from(`${req.headers['x-signature-timestamp']}${req.body}`),
        createPublicKey({
          key: { kty: 'OKP', crv: 'Ed25519', x: Buffer.from(fake.publicKeyHex, 'hex').toString('base64url') },
          format: 'jwk',
        }),
        Buffer.from(String(req.headers['x-signature-ed25519']), 'hex'),
      );
      res.writeHead(valid ? 200 : 401, { 'content-type': 'application/json' }).end(valid ? '{"type":1}' : '{}');
    });
    const careless = await startRecordingUpstream((_req, res) =>
      res.writeHead(200, { 'content-type': 'text/plain' }).end('{"type":1}'),
    );
    try {
      assert.deepEqual((await fake.checkInteractionsEndpoint(good.url)).violations, []);
      const bad = await fake.checkInteractionsEndpoint(careless.url);
      assert.equal(bad.violations.length, 2, bad.violations.join('\n'));
      assert.match(bad.violations.join('\n'), /Content-Type is "text\/plain"/);
      assert.match(bad.violations.join('\n'), /invalid signature was answered 200, not 401/);
    } finally {
      await Promise.all([good.close(), careless.close()]);
    }
  });

  it('deliverInteraction notes an answer whose callback type the interaction type does not allow', async () => {
    const deferred = await startRecordingUpstream((_req, res) =>
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"type":5}'),
    );
    try {
      assert.deepEqual(
        (await fake.deliverInteraction(deferred.url, { type: 2, id: '1', data: { name: 'x' } })).violations,
        [],
      );
      const autocomplete = await fake.deliverInteraction(deferred.url, { type: 4, id: '2', data: { name: 'x' } });
      assert.match(autocomplete.violations[0]!, /type 4 was answered with callback type 5; allowed: 8/);
    } finally {
      await deferred.close();
    }
  });
});

// ─── Slack ────────────────────────────────────────────────────────────────────────────────────

describe('fake Slack', () => {
  let fake: FakeSlack;
  const redirectUri = 'http://127.0.0.1:9/slack/callback';
  before(async () => (fake = await startFakeSlack()));
  after(() => fake.close());

  function authorizeUrl(params: Record<string, string> = {}): string {
    const q = new URLSearchParams({
      client_id: SLACK_CLIENT.clientId,
      scope: 'chat:write,channels:read',
      redirect_uri: redirectUri,
      state: 'st-1',
      ...params,
    });
    return `${fake.url}/oauth/v2/authorize?${q}`;
  }

  const access = (form: Record<string, string>, headers?: Record<string, string>) =>
    postForm(`${fake.url}/api/oauth.v2.access`, form, headers);
  const creds = { client_id: SLACK_CLIENT.clientId, client_secret: SLACK_CLIENT.clientSecret };
  const post = (token: string | undefined, body: unknown) =>
    postJson(`${fake.url}/api/chat.postMessage`, body, {
      'content-type': 'application/json; charset=utf-8',
      ...(token ? { authorization: `Bearer ${token}` } : {}),
    });

  async function installCode(): Promise<string> {
    return (await consent(authorizeUrl())).searchParams.get('code')!;
  }

  it('installs: authorize redirects with code and state; oauth.v2.access answers the bot token', async () => {
    const back = await consent(authorizeUrl());
    assert.equal(`${back.origin}${back.pathname}`, redirectUri);
    assert.equal(back.searchParams.get('state'), 'st-1');
    const res = await access({ ...creds, code: back.searchParams.get('code')!, redirect_uri: redirectUri });
    assert.equal(res.status, 200);
    const b = res.body;
    assert.equal(b.ok, true);
    assert.match(b.access_token, /^xoxb-/);
    assert.equal(b.token_type, 'bot');
    assert.equal(b.scope, 'chat:write,channels:read');
    assert.match(b.bot_user_id, /^U/);
    assert.equal(b.app_id, SLACK_CLIENT.appId);
    assert.deepEqual(b.team, { name: fake.team.name, id: fake.team.id });
    assert.equal(b.enterprise, null);
    assert.match(b.authed_user.id, /^U/);

    const auth = await postForm(`${fake.url}/api/auth.test`, {}, { authorization: `Bearer ${b.access_token}` });
    assert.equal(auth.body.ok, true);
    assert.equal(auth.body.team_id, fake.team.id);
    assert.equal(auth.body.user_id, b.bot_user_id);
    assert.equal(auth.body.url, `https://${fake.team.domain}.slack.com/`);
    assert.match(auth.body.bot_id, /^B/);
  });

  it('takes the client by HTTP Basic', async () => {
    const res = await access(
      { code: await installCode(), redirect_uri: redirectUri },
      basic(SLACK_CLIENT.clientId, SLACK_CLIENT.clientSecret),
    );
    assert.equal(res.body.ok, true);
  });

  it('oauth.v2.access errors come back as HTTP 200 with ok:false', async () => {
    const code = await installCode();
    const cases: [Record<string, string>, string][] = [
      [{ ...creds, client_id: '999.999', code, redirect_uri: redirectUri }, 'invalid_client_id'],
      [{ ...creds, client_secret: 'wrong', code, redirect_uri: redirectUri }, 'bad_client_secret'],
      [{ ...creds, code: 'nope', redirect_uri: redirectUri }, 'invalid_code'],
    ];
    for (const [form, error] of cases) {
      const res = await access(form);
      assert.deepEqual([res.status, res.body], [200, { ok: false, error }], error);
    }
    // The code survived the client errors above; a wrong redirect_uri spends it.
    assert.deepEqual((await access({ ...creds, code, redirect_uri: 'http://127.0.0.1:9/elsewhere' })).body, {
      ok: false,
      error: 'bad_redirect_uri',
    });
    assert.deepEqual((await access({ ...creds, code, redirect_uri: redirectUri })).body, {
      ok: false,
      error: 'invalid_code',
    });
  });

  it('a user who cancels comes back with error=access_denied and the state', async () => {
    fake.setConsent({ deny: true });
    try {
      const back = await consent(authorizeUrl({ state: 'abc' }));
      assert.equal(back.searchParams.get('error'), 'access_denied');
      assert.equal(back.searchParams.get('state'), 'abc');
      assert.equal(back.searchParams.get('code'), null);
    } finally {
      fake.setConsent({ deny: false });
    }
  });

  it('an unknown client or unregistered redirect gets an error page, never a redirect', async () => {
    const strict = await startFakeSlack({ clients: [{ ...SLACK_CLIENT, redirectUris: [redirectUri] }] });
    try {
      const page = await fetch(
        `${strict.url}/oauth/v2/authorize?${new URLSearchParams({ client_id: SLACK_CLIENT.clientId, scope: 'chat:write', redirect_uri: 'https://evil.example/cb' })}`,
        { redirect: 'manual' },
      );
      assert.equal(page.status, 400);
      assert.equal(page.headers.get('location'), null);
      const unknown = await fetch(`${strict.url}/oauth/v2/authorize?client_id=1.2&scope=chat:write`, {
        redirect: 'manual',
      });
      assert.equal(unknown.status, 400);
      const noRedirect = await consent(
        `${strict.url}/oauth/v2/authorize?${new URLSearchParams({ client_id: SLACK_CLIENT.clientId, scope: 'chat:write' })}`,
      );
      assert.equal(
        `${noRedirect.origin}${noRedirect.pathname}`,
        redirectUri,
        'without redirect_uri, the first registered one',
      );
    } finally {
      await strict.close();
    }
  });

  it('chat.postMessage posts with a bot token and records it', async () => {
    const token = fake.issueBotToken();
    const res = await post(token, { channel: 'C0123456789', text: 'deploy finished' });
    assert.equal(res.status, 200);
    assert.equal(res.body.ok, true);
    assert.equal(res.body.channel, 'C0123456789');
    assert.match(res.body.ts, /^\d{10}\.\d{6}$/);
    assert.equal(res.body.message.text, 'deploy finished');
    assert.equal(res.body.message.ts, res.body.ts);
    assert.equal(res.body.warning, undefined, 'charset given, no warning');
    const again = await post(token, { channel: 'C0123456789', text: 'again' });
    assert.ok(again.body.ts > res.body.ts, 'ts increases (same width, so string order is time order)');
    assert.deepEqual(
      fake.sent.slice(-2).map((s) => [s.channel, s.text, s.token]),
      [
        ['C0123456789', 'deploy finished', token],
        ['C0123456789', 'again', token],
      ],
    );
  });

  it('chat.postMessage errors: not_authed, invalid_auth, token_revoked, channel_not_found, no_text, missing_scope — all HTTP 200', async () => {
    const token = fake.issueBotToken();
    const before = fake.sent.length;
    assert.deepEqual(await post(undefined, { channel: 'C1', text: 'x' }).then((a) => [a.status, a.body]), [
      200,
      { ok: false, error: 'not_authed' },
    ]);
    assert.deepEqual((await post('xoxb-1-2-nope', { channel: 'C1', text: 'x' })).body, {
      ok: false,
      error: 'invalid_auth',
    });
    assert.deepEqual(
      (
        await postJson(
          `${fake.url}/api/chat.postMessage`,
          { token, channel: 'C1', text: 'x' },
          { 'content-type': 'application/json; charset=utf-8' },
        )
      ).body,
      { ok: false, error: 'not_authed' },
      'a token in a JSON body is not read',
    );
    fake.setKnownChannels(['C1']);
    try {
      assert.deepEqual((await post(token, { channel: 'C2', text: 'x' })).body, {
        ok: false,
        error: 'channel_not_found',
      });
    } finally {
      fake.setKnownChannels('any');
    }
    assert.deepEqual((await post(token, { channel: 'C1' })).body, { ok: false, error: 'no_text' });
    const readOnly = fake.issueBotToken(['channels:read']);
    assert.deepEqual((await post(readOnly, { channel: 'C1', text: 'x' })).body, {
      ok: false,
      error: 'missing_scope',
      needed: 'chat:write',
      provided: 'channels:read',
    });
    fake.revokeTokens();
    assert.deepEqual((await post(token, { channel: 'C1', text: 'x' })).body, { ok: false, error: 'token_revoked' });
    assert.equal(fake.sent.length, before, 'nothing was sent');
  });

  it('a form call may carry the token; JSON without a charset draws missing_charset', async () => {
    const token = fake.issueBotToken();
    const form = await postForm(`${fake.url}/api/chat.postMessage`, { token, channel: 'C1', text: 'form' });
    assert.equal(form.body.ok, true);
    const json = await postJson(
      `${fake.url}/api/chat.postMessage`,
      { channel: 'C1', text: 'json' },
      { authorization: `Bearer ${token}` },
    );
    assert.equal(json.body.ok, true);
    assert.equal(json.body.warning, 'missing_charset');
    assert.deepEqual(json.body.response_metadata, { warnings: ['missing_charset'] });
    const unknown = await postForm(`${fake.url}/api/chat.nope`, { token });
    assert.deepEqual([unknown.status, unknown.body.error], [404, 'unknown_method']);
  });

  it('failNext injects a 429 with Retry-After, or any Slack error', async () => {
    const token = fake.issueBotToken();
    fake.failNext({ path: '/api/chat.postMessage' }, { status: 429 });
    const limited = await post(token, { channel: 'C1', text: 'x' });
    assert.deepEqual(
      [limited.status, limited.headers.get('retry-after'), limited.body],
      [429, '1', { ok: false, error: 'ratelimited' }],
    );
    fake.failNext({ path: '/api/chat.postMessage' }, { status: 200, body: { ok: false, error: 'not_in_channel' } });
    assert.deepEqual((await post(token, { channel: 'C1', text: 'x' })).body, { ok: false, error: 'not_in_channel' });
    assert.equal((await post(token, { channel: 'C1', text: 'x' })).body.ok, true);
  });

  it('signEvent signs v0:timestamp:body with HMAC-SHA256, as Slack does', () => {
    const body = '{"type":"event_callback","event":{"type":"message","text":"hi"}}';
    const signed = fake.signEvent(body, SLACK_CLIENT.signingSecret, 1_700_000_000);
    const expected = `v0=${createHmac('sha256', SLACK_CLIENT.signingSecret).update(`v0:1700000000:${body}`).digest('hex')}`;
    assert.deepEqual(signed, {
      headers: { 'X-Slack-Signature': expected, 'X-Slack-Request-Timestamp': '1700000000' },
      body,
    });
    const now = Number(fake.signEvent({ a: 1 }, 's').headers['X-Slack-Request-Timestamp']);
    assert.ok(Math.abs(now - Date.now() / 1000) < 5, 'the timestamp defaults to now');
  });

  it('deliverEvent POSTs a signed event and returns the answer (url_verification echoes the challenge)', async () => {
    const endpoint = await startRecordingUpstream((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ challenge: JSON.parse(req.body).challenge }));
    });
    try {
      const event = { token: 'legacy', challenge: 'c-123', type: 'url_verification' };
      const result = await fake.deliverEvent(`${endpoint.url}/slack/events`, event, SLACK_CLIENT.signingSecret);
      assert.deepEqual([result.status, JSON.parse(result.body)], [200, { challenge: 'c-123' }]);
      const got = endpoint.received[0]!;
      const ts = got.headers['x-slack-request-timestamp'] as string;
      const expected = `v0=${createHmac('sha256', SLACK_CLIENT.signingSecret).update(`v0:${ts}:${got.body}`).digest('hex')}`;
      assert.equal(got.headers['x-slack-signature'], expected);
      assert.equal(got.headers['content-type'], 'application/json');
    } finally {
      await endpoint.close();
    }
  });

  it('refuses bodies the Web API cannot read with its own errors (missing_post_type, invalid_post_type, invalid_charset, invalid_json, json_not_object), each noted', async () => {
    const token = fake.issueBotToken();
    const url = `${fake.url}/api/chat.postMessage`;
    const bearer = { authorization: `Bearer ${token}` };
    const cases: [Record<string, string>, string, string][] = [
      [{}, 'channel=C1&text=x', 'missing_post_type'],
      [{ 'content-type': 'application/xml' }, '<x/>', 'invalid_post_type'],
      [{ 'content-type': 'application/json; charset=latin-9' }, '{}', 'invalid_charset'],
      [{ 'content-type': 'application/json; charset=utf-8' }, '{', 'invalid_json'],
      [{ 'content-type': 'application/json; charset=utf-8' }, '[1]', 'json_not_object'],
    ];
    for (const [headers, body, error] of cases) {
      // fetch adds text/plain to a string body unless told otherwise: an empty header value removes it for the first case.
      const res = await fetch(url, {
        method: 'POST',
        headers: { ...bearer, 'content-type': '', ...headers },
        body,
      }).then(answer);
      assert.deepEqual([res.status, res.body.error], [200, error], error);
      assert.equal(fake.calls.at(-1)!.violations.length, 1, error);
    }
  });

  it('notes the charset warnings, a token in a JSON body, a JSON body to oauth.v2.access, another Authorization scheme, a missing channel; PUT is refused', async () => {
    const token = fake.issueBotToken();
    const url = `${fake.url}/api/chat.postMessage`;
    await postForm(
      url,
      { channel: 'C1', text: 'x' },
      { authorization: `Bearer ${token}`, 'content-type': 'application/x-www-form-urlencoded; charset=utf-8' },
    );
    assert.match(fake.calls.at(-1)!.violations[0]!, /superfluous_charset/);
    await postJson(url, { channel: 'C1', text: 'x' }, { authorization: `Bearer ${token}` });
    assert.match(fake.calls.at(-1)!.violations[0]!, /missing_charset/);
    const bodyToken = await post(undefined, { token, channel: 'C1', text: 'x' });
    assert.equal(bodyToken.body.error, 'not_authed');
    assert.deepEqual(
      fake.calls.at(-1)!.violations.map((v) => v.replace(/;.*| \(.*/, '')),
      ['slack: a token in a JSON body is not read', 'slack: chat.postMessage without a token'],
    );
    const botScheme = await postJson(
      url,
      { channel: 'C1', text: 'x' },
      { authorization: `Bot ${token}`, 'content-type': 'application/json; charset=utf-8' },
    );
    assert.equal(botScheme.body.error, 'not_authed');
    assert.match(fake.calls.at(-1)!.violations[0]!, /must be "Bearer <token>"/);
    assert.equal((await post(token, { text: 'x' })).body.error, 'channel_not_found');
    assert.match(fake.calls.at(-1)!.violations[0]!, /required "channel"/);
    fake.setKnownChannels(['C1']);
    try {
      assert.equal((await post(token, { channel: 'C2', text: 'x' })).body.error, 'channel_not_found');
      assert.deepEqual(fake.calls.at(-1)!.violations, [], 'an unknown channel is not a contract violation');
    } finally {
      fake.setKnownChannels('any');
    }
    const json = await postJson(
      `${fake.url}/api/oauth.v2.access`,
      { ...creds, code: await installCode() },
      { 'content-type': 'application/json; charset=utf-8' },
    );
    assert.deepEqual(json.body, { ok: false, error: 'invalid_client_id' });
    assert.match(fake.calls.at(-1)!.violations[0]!, /oauth.v2.access does not take application\/json/);
    const put = await fetch(url, { method: 'PUT', headers: { authorization: `Bearer ${token}` } });
    assert.equal(put.status, 405);
    assert.equal(fake.calls.at(-1)!.route, undefined);
  });

  it('deliverEvent notes an answer that is not a 2xx, or a url_verification answered without the challenge', async () => {
    const failing = await startRecordingUpstream((_req, res) => res.writeHead(500).end());
    const forgetful = await startRecordingUpstream((_req, res) =>
      res.writeHead(200, { 'content-type': 'text/plain' }).end('ok'),
    );
    const plain = await startRecordingUpstream((req, res) =>
      res.writeHead(200, { 'content-type': 'text/plain' }).end(JSON.parse(req.body).challenge),
    );
    try {
      assert.match(
        (await fake.deliverEvent(failing.url, { type: 'event_callback', event: {} }, 's')).violations[0]!,
        /answered 500, not 2xx/,
      );
      const challenge = { type: 'url_verification', token: 't', challenge: 'c-1' };
      assert.match(
        (await fake.deliverEvent(forgetful.url, challenge, 's')).violations[0]!,
        /url_verification was not answered 200 with the challenge/,
      );
      assert.deepEqual(
        (await fake.deliverEvent(plain.url, challenge, 's')).violations,
        [],
        'text/plain with the challenge is one documented answer',
      );
    } finally {
      await Promise.all([failing.close(), forgetful.close(), plain.close()]);
    }
  });
});
