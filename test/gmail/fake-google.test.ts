/**
 * Proves the fake in test/helpers/fake-google.ts speaks Google's contracts well enough for the
 * official clients: @googleapis/gmail (googleapis-common + gaxios) and google-auth-library's
 * OAuth2Client, used exactly as the Gmail integration will use them; and that it refuses what
 * Google's published discovery documents (test/fixtures/google/) do not allow.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { gmail, type gmail_v1 } from '@googleapis/gmail';
import { CodeChallengeMethod, OAuth2Client } from 'google-auth-library';
import { createRemoteJWKSet, jwtVerify } from 'jose';
import {
  DISCOVERY_METHODS,
  FAKE_CLIENT,
  GMAIL_PUSH_SERVICE_ACCOUNT,
  SCOPES,
  startFakeGoogle,
  type FakeGoogle,
} from '../helpers/fake-google.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

const PROJECT = FAKE_CLIENT.projectId;
const TOPIC = `projects/${PROJECT}/topics/gatehouse-gmail`;
const PULL_SUB = `projects/${PROJECT}/subscriptions/gatehouse-gmail-pull`;
const PUSH_SUB = `projects/${PROJECT}/subscriptions/gatehouse-gmail-push`;
const ALL_SCOPES = [SCOPES.gmailReadonly, SCOPES.pubsub];

/** The OAuth2Client the integration builds, aimed at the fake. */
function oauthClient(fake: FakeGoogle, redirectUri = 'http://127.0.0.1:8085/oauth2callback'): OAuth2Client {
  return new OAuth2Client({
    clientId: FAKE_CLIENT.clientId,
    clientSecret: FAKE_CLIENT.clientSecret,
    redirectUri,
    endpoints: fake.endpoints,
  });
}

/**
 * googleapis-common@8.0.3 pins google-auth-library 10.5.0 while the app has 10.9.1, so TypeScript
 * sees two OAuth2Client classes (private members make them nominal). At runtime googleapis only
 * calls auth.request() and auth.getUniverseDomain(), which both versions have.
 */
const gmailAuth = (auth: OAuth2Client) => auth as unknown as NonNullable<gmail_v1.Options['auth']>;

/** The Gmail client, aimed at the fake, with googleapis' default retries off. */
function gmailClient(fake: FakeGoogle, auth: OAuth2Client): gmail_v1.Gmail {
  return gmail({ version: 'v1', auth: gmailAuth(auth), rootUrl: fake.url, retry: false });
}

/** A Pub/Sub v1 REST call through the authorised client, like the integration makes it. */
async function pubsub<T = any>(
  fake: FakeGoogle,
  auth: OAuth2Client,
  method: string,
  path: string,
  data?: unknown,
): Promise<T> {
  const res = await auth.request<T>({ url: `${fake.url}v1/${path}`, method: method as 'GET', data });
  return res.data;
}

/** Runs the PKCE authorization code flow against the fake: consent, loopback redirect, token exchange. */
async function signIn(fake: FakeGoogle, scopes: string[] = ALL_SCOPES): Promise<OAuth2Client> {
  const loopback = await startRecordingUpstream();
  try {
    const client = oauthClient(fake, `${loopback.url}/oauth2callback`);
    const { codeVerifier, codeChallenge } = await client.generateCodeVerifierAsync();
    const authUrl = client.generateAuthUrl({
      access_type: 'offline',
      prompt: 'consent',
      scope: scopes,
      state: 'st-1',
      code_challenge: codeChallenge,
      code_challenge_method: CodeChallengeMethod.S256,
    });
    // The browser follows the 302 to the app's loopback listener, which reads the code.
    await fetch(await followConsent(authUrl));
    const callback = new URL(loopback.received[0]!.url, loopback.url);
    assert.equal(callback.searchParams.get('state'), 'st-1');
    const { tokens } = await client.getToken({ code: callback.searchParams.get('code')!, codeVerifier });
    client.setCredentials(tokens);
    return client;
  } finally {
    await loopback.close();
  }
}

/** The browser's part: open the consent URL; returns where the 302 sends the user back to. */
async function followConsent(authUrl: string): Promise<URL> {
  const consent = await fetch(authUrl, { redirect: 'manual' });
  assert.equal(consent.status, 302);
  return new URL(consent.headers.get('location')!);
}

/** Awaits a rejected gaxios call and returns its status and Google error body. */
async function failure(promise: Promise<unknown>): Promise<{ status: number; data: any; headers: Headers }> {
  try {
    await promise;
  } catch (err: any) {
    assert.ok(err.response, `expected an HTTP error, got ${err}`);
    return { status: err.response.status, data: err.response.data, headers: err.response.headers };
  }
  throw new Error('expected the call to fail');
}

/** What `gatehouse webhooks gmail setup` will do: create what is missing, touch nothing else. */
async function ensureTopicAndGrant(fake: FakeGoogle, auth: OAuth2Client): Promise<void> {
  const exists = await pubsub(fake, auth, 'GET', TOPIC).then(
    () => true,
    (err) => {
      if (err.response?.status !== 404) throw err;
      return false;
    },
  );
  if (!exists) await pubsub(fake, auth, 'PUT', TOPIC, {});
  const policy = await pubsub(fake, auth, 'GET', `${TOPIC}:getIamPolicy`);
  const member = `serviceAccount:${GMAIL_PUSH_SERVICE_ACCOUNT}`;
  const bindings: { role: string; members: string[] }[] = policy.bindings ?? [];
  if (bindings.some((b) => b.role === 'roles/pubsub.publisher' && b.members.includes(member))) return;
  bindings.push({ role: 'roles/pubsub.publisher', members: [member] });
  await pubsub(fake, auth, 'POST', `${TOPIC}:setIamPolicy`, { policy: { ...policy, bindings } });
}

describe('OAuth 2.0: authorization code with PKCE, refresh', () => {
  let fake: FakeGoogle;
  before(async () => (fake = await startFakeGoogle()));
  after(() => fake.close());

  it('signs in with PKCE and the tokens authorise Gmail as userId "me"', async () => {
    const client = await signIn(fake);
    const tokens = client.credentials;
    assert.match(tokens.access_token!, /^ya29\./);
    assert.match(tokens.refresh_token!, /^1\/\/0/);
    assert.equal(tokens.token_type, 'Bearer');
    assert.equal(tokens.scope, ALL_SCOPES.join(' '));
    assert.ok(tokens.expiry_date! > Date.now() + 3_000_000, 'expires_in 3599 s became expiry_date');

    const authorize = fake.calls.find((c) => c.path === '/o/oauth2/v2/auth')!;
    assert.equal(authorize.query.code_challenge_method, 'S256');
    assert.equal(authorize.query.access_type, 'offline');
    const exchange = fake.calls.find((c) => c.path === '/token')!.body as Record<string, string>;
    assert.equal(exchange.grant_type, 'authorization_code');
    assert.ok(
      exchange.code_verifier && exchange.client_secret === FAKE_CLIENT.clientSecret,
      'verifier and secret sent in the form',
    );

    const profile = await gmailClient(fake, client).users.getProfile({ userId: 'me' });
    assert.deepEqual(profile.data, {
      emailAddress: 'alice@example.com',
      messagesTotal: 0,
      threadsTotal: 0,
      historyId: '1000',
    });
    const byEmail = await gmailClient(fake, client).users.getProfile({ userId: 'alice@example.com' });
    assert.equal(byEmail.data.emailAddress, 'alice@example.com');
    const other = await failure(gmailClient(fake, client).users.getProfile({ userId: 'bob@example.com' }));
    assert.equal(other.status, 403);
  });

  it('refuses a wrong code_verifier, and the code is then spent', async () => {
    const client = oauthClient(fake);
    const { codeVerifier, codeChallenge } = await client.generateCodeVerifierAsync();
    const other = await client.generateCodeVerifierAsync();
    const authUrl = client.generateAuthUrl({
      access_type: 'offline',
      scope: ALL_SCOPES,
      state: 's',
      code_challenge: codeChallenge,
      code_challenge_method: CodeChallengeMethod.S256,
    });
    const code = (await followConsent(authUrl)).searchParams.get('code')!;

    const wrong = await failure(client.getToken({ code, codeVerifier: other.codeVerifier }));
    assert.equal(wrong.status, 400);
    assert.deepEqual(wrong.data, { error: 'invalid_grant', error_description: 'Invalid code verifier.' });
    const reused = await failure(client.getToken({ code, codeVerifier }));
    assert.deepEqual(reused.data, { error: 'invalid_grant', error_description: 'Bad Request' });

    const code2 = (
      await followConsent(
        client.generateAuthUrl({
          scope: ALL_SCOPES,
          code_challenge: codeChallenge,
          code_challenge_method: CodeChallengeMethod.S256,
        }),
      )
    ).searchParams.get('code')!;
    const missing = await failure(client.getToken({ code: code2 }));
    assert.equal(missing.data.error_description, 'Missing code verifier.');
  });

  it('redirect_uri must match, the secret must be right, and without access_type=offline there is no refresh token', async () => {
    const client = oauthClient(fake);
    const { codeVerifier, codeChallenge } = await client.generateCodeVerifierAsync();
    const url = client.generateAuthUrl({
      scope: ALL_SCOPES,
      code_challenge: codeChallenge,
      code_challenge_method: CodeChallengeMethod.S256,
    });
    const code = (await followConsent(url)).searchParams.get('code')!;
    const mismatch = await failure(
      client.getToken({ code, codeVerifier, redirect_uri: 'http://127.0.0.1:9/elsewhere' }),
    );
    assert.equal(mismatch.data.error, 'redirect_uri_mismatch');

    const badSecret = new OAuth2Client({
      clientId: FAKE_CLIENT.clientId,
      clientSecret: 'nope',
      redirectUri: 'http://127.0.0.1:8085/cb',
      endpoints: fake.endpoints,
    });
    const code2 = (await followConsent(badSecret.generateAuthUrl({ scope: ALL_SCOPES }))).searchParams.get('code')!;
    assert.equal((await failure(badSecret.getToken(code2))).status, 401);

    const code3 = (await followConsent(client.generateAuthUrl({ scope: ALL_SCOPES }))).searchParams.get('code')!;
    const { tokens } = await client.getToken(code3);
    assert.ok(tokens.access_token);
    assert.equal(tokens.refresh_token, undefined);

    const page = await fetch(client.generateAuthUrl({ scope: ALL_SCOPES, redirect_uri: 'https://evil.example/cb' }), {
      redirect: 'manual',
    });
    assert.equal(page.status, 400, 'an unregistered redirect_uri gets an error page, not a redirect');
    assert.equal(page.headers.get('location'), null);
  });

  it('refuses an expired authorization code', async () => {
    const shortLived = await startFakeGoogle({ authorizationCodeTtlSeconds: 0 });
    try {
      const client = oauthClient(shortLived);
      const code = (await followConsent(client.generateAuthUrl({ scope: ALL_SCOPES }))).searchParams.get('code')!;
      assert.equal((await failure(client.getToken(code))).data.error, 'invalid_grant');
    } finally {
      await shortLived.close();
    }
  });

  it('a user who denies consent comes back with error=access_denied and the state', async () => {
    fake.setConsent({ deny: true });
    try {
      const client = oauthClient(fake);
      const back = await followConsent(client.generateAuthUrl({ scope: ALL_SCOPES, state: 'xyz' }));
      assert.equal(back.searchParams.get('error'), 'access_denied');
      assert.equal(back.searchParams.get('state'), 'xyz');
      assert.equal(back.searchParams.get('code'), null);
    } finally {
      fake.setConsent({ deny: false });
    }
  });

  it('refreshes: explicitly, and automatically when the access token is about to expire', async () => {
    const client = await signIn(fake);
    const previous = client.credentials.access_token;
    const { credentials } = await client.refreshAccessToken();
    assert.notEqual(credentials.access_token, previous);
    assert.equal(credentials.refresh_token, client.credentials.refresh_token, 'the refresh token is kept');
    const form = fake.calls.filter((c) => c.path === '/token').at(-1)!.body as Record<string, string>;
    assert.equal(form.grant_type, 'refresh_token');

    // OAuth2Client refreshes eagerly within 5 minutes of expiry_date.
    client.setCredentials({ ...client.credentials, expiry_date: Date.now() + 60_000 });
    const tokenCalls = fake.calls.filter((c) => c.path === '/token').length;
    await gmailClient(fake, client).users.getProfile({ userId: 'me' });
    assert.equal(fake.calls.filter((c) => c.path === '/token').length, tokenCalls + 1);
  });

  it('answers 401 like Google without a valid bearer token, and invalid_grant for a revoked refresh token', async () => {
    const noAuth = await fetch(`${fake.url}gmail/v1/users/me/profile`);
    assert.equal(noAuth.status, 401);
    const body = (await noAuth.json()) as any;
    assert.equal(body.error.code, 401);
    assert.equal(body.error.status, 'UNAUTHENTICATED');
    assert.equal(body.error.errors[0].reason, 'required');
    assert.match(noAuth.headers.get('www-authenticate')!, /^Bearer realm=/);

    const client = await signIn(fake);
    fake.expireAccessTokens();
    const expired = await failure(gmailClient(fake, client).users.getProfile({ userId: 'me' }));
    assert.equal(expired.status, 401);
    assert.equal(expired.data.error.errors[0].reason, 'authError');

    fake.revokeRefreshTokens();
    const revoked = await failure(client.refreshAccessToken());
    assert.deepEqual(revoked.data, { error: 'invalid_grant', error_description: 'Token has been expired or revoked.' });
  });

  it('refuses a token without the API scope', async () => {
    const client = await signIn(fake, [SCOPES.gmailReadonly]);
    const res = await failure(pubsub(fake, client, 'GET', TOPIC));
    assert.equal(res.status, 403);
    assert.equal(res.data.error.message, 'Request had insufficient authentication scopes.');
    assert.equal(res.data.error.details[0].reason, 'ACCESS_TOKEN_SCOPE_INSUFFICIENT');
  });
});

describe('Pub/Sub v1 REST and Gmail watch', () => {
  let fake: FakeGoogle;
  let auth: OAuth2Client;
  before(async () => {
    fake = await startFakeGoogle();
    auth = await signIn(fake);
  });
  after(() => fake.close());

  it('topic: 404 before, created, 409 on re-create, with Google error bodies', async () => {
    const missing = await failure(pubsub(fake, auth, 'GET', TOPIC));
    assert.deepEqual(missing.data, {
      error: { code: 404, message: 'Resource not found (resource=gatehouse-gmail).', status: 'NOT_FOUND' },
    });
    assert.deepEqual(await pubsub(fake, auth, 'PUT', TOPIC, {}), { name: TOPIC });
    assert.deepEqual(await pubsub(fake, auth, 'GET', TOPIC), { name: TOPIC });
    const again = await failure(pubsub(fake, auth, 'PUT', TOPIC, {}));
    assert.equal(again.status, 409);
    assert.equal(again.data.error.status, 'ALREADY_EXISTS');
  });

  it('watch is refused until gmail-api-push may publish, and in another project', async () => {
    const users = gmailClient(fake, auth).users;
    const denied = await failure(users.watch({ userId: 'me', requestBody: { topicName: TOPIC, labelIds: ['INBOX'] } }));
    assert.equal(denied.status, 403);
    assert.match(
      denied.data.error.message,
      /^Error sending test message to Cloud PubSub .* User not authorized to perform this action\.$/,
    );
    assert.equal(denied.data.error.errors[0].reason, 'forbidden');
    const elsewhere = await failure(
      users.watch({ userId: 'me', requestBody: { topicName: 'projects/other/topics/t' } }),
    );
    assert.equal(elsewhere.status, 400);
    const absent = await failure(
      users.watch({ userId: 'me', requestBody: { topicName: `projects/${PROJECT}/topics/absent` } }),
    );
    assert.equal(absent.status, 404);
  });

  it('IAM: empty policy, grant with etag, stale etag refused, and a second setup changes nothing', async () => {
    assert.deepEqual(await pubsub(fake, auth, 'GET', `${TOPIC}:getIamPolicy`), { etag: 'ACAB' });
    const stale = await failure(
      pubsub(fake, auth, 'POST', `${TOPIC}:setIamPolicy`, { policy: { etag: 'BwZZZZZZZZ0=', bindings: [] } }),
    );
    assert.equal(stale.status, 409);
    assert.equal(stale.data.error.status, 'ABORTED');

    await ensureTopicAndGrant(fake, auth);
    const policy = fake.state.iamPolicies.get(TOPIC)!;
    assert.deepEqual(policy.bindings, [
      { role: 'roles/pubsub.publisher', members: [`serviceAccount:${GMAIL_PUSH_SERVICE_ACCOUNT}`] },
    ]);
    assert.equal(policy.version, 1);

    const mark = fake.calls.length;
    await ensureTopicAndGrant(fake, auth);
    const writes = fake.calls.slice(mark).filter((c) => c.method === 'PUT' || c.path.endsWith(':setIamPolicy'));
    assert.deepEqual(writes, [], 'the second run only read');
  });

  it('subscriptions: pull, push with OIDC, patch, 404 for a missing topic', async () => {
    const pull = await pubsub(fake, auth, 'PUT', PULL_SUB, { topic: TOPIC, ackDeadlineSeconds: 10 });
    assert.deepEqual(pull, {
      name: PULL_SUB,
      topic: TOPIC,
      pushConfig: {},
      ackDeadlineSeconds: 10,
      messageRetentionDuration: '604800s',
    });
    assert.equal((await failure(pubsub(fake, auth, 'PUT', PULL_SUB, { topic: TOPIC }))).status, 409);
    const orphan = await failure(
      pubsub(fake, auth, 'PUT', `projects/${PROJECT}/subscriptions/orphan`, {
        topic: `projects/${PROJECT}/topics/nope`,
      }),
    );
    assert.equal(orphan.data.error.message, 'Resource not found (resource=nope).');

    const pushConfig = {
      pushEndpoint: 'https://gatehouse.example/hooks/gmail',
      oidcToken: { serviceAccountEmail: `push@${PROJECT}.iam.gserviceaccount.com`, audience: 'gatehouse-gmail' },
    };
    const push = await pubsub(fake, auth, 'PUT', PUSH_SUB, { topic: TOPIC, pushConfig });
    assert.deepEqual(push.pushConfig, pushConfig);
    const moved = { ...pushConfig, pushEndpoint: 'https://gatehouse.example/hooks/gmail2' };
    const patched = await pubsub(fake, auth, 'PATCH', PUSH_SUB, {
      subscription: { pushConfig: moved },
      updateMask: 'pushConfig',
    });
    assert.equal(patched.pushConfig.pushEndpoint, moved.pushEndpoint);
    assert.equal((await pubsub(fake, auth, 'GET', PUSH_SUB)).pushConfig.pushEndpoint, moved.pushEndpoint);
    const noMask = await failure(pubsub(fake, auth, 'PATCH', PUSH_SUB, { subscription: { pushConfig } }));
    assert.equal(noMask.status, 400);
    // Nothing reachable listens there; park the push subscription as pull for the rest of the suite.
    await pubsub(fake, auth, 'PATCH', PUSH_SUB, { subscription: {}, updateMask: 'pushConfig' });
  });

  it('watch answers historyId and a 7-day expiration; addEmail is then notified on the topic', async () => {
    const res = await gmailClient(fake, auth).users.watch({
      userId: 'me',
      requestBody: { topicName: TOPIC, labelIds: ['INBOX'], labelFilterBehavior: 'include' },
    });
    assert.equal(res.data.historyId, '1000');
    const expiration = Number(res.data.expiration);
    assert.ok(Math.abs(expiration - (Date.now() + 7 * 86_400_000)) < 60_000, `expiration ${res.data.expiration}`);
    assert.equal(fake.state.watches.get('alice@example.com')!.topicName, TOPIC);

    fake.addEmail({ from: 'Bob <bob@example.com>', subject: 'filtered out', text: 'spam', labels: ['SPAM'] });
    const mail = fake.addEmail({ from: 'Bob <bob@example.com>', subject: 'Hello', text: 'Hi Alice' });
    const pulled = await pubsub(fake, auth, 'POST', `${PULL_SUB}:pull`, { maxMessages: 10 });
    assert.equal(pulled.receivedMessages.length, 1, 'only the INBOX message notified');
    const notification = JSON.parse(Buffer.from(pulled.receivedMessages[0].message.data, 'base64').toString('utf8'));
    assert.deepEqual(notification, { emailAddress: 'alice@example.com', historyId: Number(mail.historyId) });
    await pubsub(fake, auth, 'POST', `${PULL_SUB}:acknowledge`, { ackIds: [pulled.receivedMessages[0].ackId] });
    // Each subscription on the topic gets its own copy.
    const copy = await pubsub(fake, auth, 'POST', `${PUSH_SUB}:pull`, { maxMessages: 10 });
    assert.equal(copy.receivedMessages.length, 1);
  });

  it('stop ends notifications', async () => {
    await gmailClient(fake, auth).users.stop({ userId: 'me' });
    fake.addEmail({ from: 'bob@example.com', subject: 'after stop', text: '.' });
    assert.deepEqual(await pubsub(fake, auth, 'POST', `${PULL_SUB}:pull`, { maxMessages: 10 }), {});
  });
});

describe('Gmail: history and messages', () => {
  let fake: FakeGoogle;
  let users: gmail_v1.Resource$Users;
  before(async () => {
    fake = await startFakeGoogle();
    users = gmailClient(fake, await signIn(fake)).users;
  });
  after(() => fake.close());

  it('history.list from a watch historyId lists the added message; messages.get renders metadata and full', async () => {
    const start = (await users.getProfile({ userId: 'me' })).data.historyId!;
    const mail = fake.addEmail({
      from: 'Bob <bob@example.com>',
      to: 'alice@example.com',
      subject: 'Invoice #7',
      text: 'Total: 5 < 7 & "done"',
      html: '<p>Total: <b>5</b></p>',
      date: new Date('2025-03-01T10:00:00Z'),
    });
    fake.addEmail({ from: 'carol@example.com', subject: 'Sent', text: 'x', labels: ['SENT'] });

    const history = await users.history.list({
      userId: 'me',
      startHistoryId: start,
      historyTypes: ['messageAdded'],
      labelId: 'INBOX',
    });
    assert.deepEqual(history.data.history, [
      {
        id: mail.historyId,
        messages: [{ id: mail.id, threadId: mail.id }],
        messagesAdded: [{ message: { id: mail.id, threadId: mail.id, labelIds: ['INBOX'] } }],
      },
    ]);
    assert.equal(history.data.historyId, fake.state.mailboxes.get('alice@example.com')!.historyId.toString());
    const upToDate = await users.history.list({ userId: 'me', startHistoryId: history.data.historyId! });
    assert.deepEqual(upToDate.data, { historyId: history.data.historyId });

    const meta = await users.messages.get({
      userId: 'me',
      id: mail.id,
      format: 'metadata',
      metadataHeaders: ['From', 'subject'],
    });
    assert.deepEqual(meta.data.payload, {
      mimeType: 'multipart/alternative',
      headers: [
        { name: 'Subject', value: 'Invoice #7' },
        { name: 'From', value: 'Bob <bob@example.com>' },
      ],
    });
    assert.equal(meta.data.internalDate, String(Date.parse('2025-03-01T10:00:00Z')));
    assert.equal(meta.data.snippet, 'Total: 5 &lt; 7 &amp; &quot;done&quot;');
    assert.deepEqual(meta.data.labelIds, ['INBOX']);
    assert.equal(meta.data.historyId, mail.historyId);

    const full = (await users.messages.get({ userId: 'me', id: mail.id, format: 'full' })).data.payload!;
    assert.equal(full.mimeType, 'multipart/alternative');
    assert.deepEqual(
      full.parts!.map((p) => p.mimeType),
      ['text/plain', 'text/html'],
    );
    const decode = (data: string | null | undefined) => Buffer.from(data!, 'base64url').toString('utf8');
    assert.equal(decode(full.parts![0]!.body!.data), 'Total: 5 < 7 & "done"');
    assert.equal(decode(full.parts![1]!.body!.data), '<p>Total: <b>5</b></p>');
    assert.equal(full.headers!.find((h) => h.name === 'Date')!.value, 'Sat, 01 Mar 2025 10:00:00 +0000');

    const missing = await failure(users.messages.get({ userId: 'me', id: '0000000000000000' }));
    assert.equal(missing.status, 404);
    assert.equal(missing.data.error.errors[0].reason, 'notFound');
  });

  it('messages.list filters by label and q, newest first, and pages', async () => {
    const list = await users.messages.list({ userId: 'me', labelIds: ['INBOX'], maxResults: 10 });
    assert.equal(list.data.resultSizeEstimate, 1);
    fake.addEmail({
      from: 'dave@example.com',
      subject: 'Second',
      text: 'later',
      date: new Date('2025-03-02T00:00:00Z'),
    });
    const page1 = await users.messages.list({ userId: 'me', labelIds: ['INBOX'], maxResults: 1 });
    assert.equal(page1.data.messages!.length, 1);
    assert.ok(page1.data.nextPageToken);
    const page2 = await users.messages.list({
      userId: 'me',
      labelIds: ['INBOX'],
      maxResults: 1,
      pageToken: page1.data.nextPageToken!,
    });
    const subjects = await Promise.all(
      [page1, page2].map(
        async (p) =>
          (
            await users.messages.get({
              userId: 'me',
              id: p.data.messages![0]!.id!,
              format: 'metadata',
              metadataHeaders: ['Subject'],
            })
          ).data.payload!.headers![0]!.value,
      ),
    );
    assert.deepEqual(subjects, ['Second', 'Invoice #7']);
    const byQuery = await users.messages.list({ userId: 'me', q: 'from:bob subject:invoice' });
    assert.equal(byQuery.data.messages!.length, 1);
  });

  it('history.list answers 404 once the start id is older than retained history', async () => {
    const box = fake.state.mailboxes.get('alice@example.com')!;
    fake.expireHistoryBefore(box.historyId);
    const old = await failure(users.history.list({ userId: 'me', startHistoryId: '1000' }));
    assert.equal(old.status, 404);
    assert.deepEqual(old.data.error, {
      code: 404,
      message: 'Requested entity was not found.',
      errors: [{ message: 'Requested entity was not found.', domain: 'global', reason: 'notFound' }],
      status: 'NOT_FOUND',
    });
    const fresh = await users.history.list({ userId: 'me', startHistoryId: String(box.historyId) });
    assert.equal(fresh.status, 200);
  });
});

describe('Pub/Sub delivery: pull redelivery and push with OIDC', () => {
  let fake: FakeGoogle;
  let auth: OAuth2Client;
  let endpoint: RecordingServer;
  let statuses: number[];
  before(async () => {
    fake = await startFakeGoogle({ timing: { ackDeadlineMs: 400, pushMinBackoffMs: 20 } });
    auth = await signIn(fake);
    await ensureTopicAndGrant(fake, auth);
    await pubsub(fake, auth, 'PUT', PULL_SUB, { topic: TOPIC });
    statuses = [];
    endpoint = await startRecordingUpstream((_req, res) => {
      res.writeHead(statuses.shift() ?? 204);
      res.end();
    });
  });
  after(async () => {
    await fake.close();
    await endpoint.close();
  });

  it('redelivers an unacked message after the ack deadline with a new ackId; an ack removes it', async () => {
    const pull = () => pubsub(fake, auth, 'POST', `${PULL_SUB}:pull`, { maxMessages: 5 });
    const id = fake.publishRaw(TOPIC, { emailAddress: 'alice@example.com', historyId: 1 });
    const first = await pull();
    assert.equal(first.receivedMessages.length, 1);
    assert.equal(first.receivedMessages[0].message.messageId, id);
    assert.match(first.receivedMessages[0].message.publishTime, /^\d{4}-\d\d-\d\dT.*Z$/);
    assert.deepEqual(await pull(), {}, 'leased until the deadline: an empty pull is `{}`');

    await sleep(450); // past the fake's ack deadline: time is the property (the lease runs out)
    const again = await pull();
    assert.equal(again.receivedMessages[0].message.messageId, id, 'redelivered');
    assert.notEqual(again.receivedMessages[0].ackId, first.receivedMessages[0].ackId);

    await pubsub(fake, auth, 'POST', `${PULL_SUB}:acknowledge`, { ackIds: [again.receivedMessages[0].ackId] });
    await sleep(450); // past the ack deadline again: an unacked message would be back by now
    assert.deepEqual(await pull(), {}, 'acked for good');

    const bogus = await failure(pubsub(fake, auth, 'POST', `${PULL_SUB}:acknowledge`, { ackIds: ['not-an-ack-id'] }));
    assert.equal(bogus.status, 400);
    assert.equal(bogus.data.error.status, 'INVALID_ARGUMENT');
  });

  it('pushes the standard body with a verifiable OIDC token, retrying a non-2xx answer', async () => {
    const serviceAccount = `gatehouse-push@${PROJECT}.iam.gserviceaccount.com`;
    await pubsub(fake, auth, 'PUT', PUSH_SUB, {
      topic: TOPIC,
      pushConfig: {
        pushEndpoint: `${endpoint.url}/hooks/gmail`,
        oidcToken: { serviceAccountEmail: serviceAccount, audience: 'https://gatehouse.example/hooks/gmail' },
      },
    });
    await gmailClient(fake, auth).users.watch({ userId: 'me', requestBody: { topicName: TOPIC, labelIds: ['INBOX'] } });
    statuses.push(503, 500);
    const mail = fake.addEmail({ from: 'bob@example.com', subject: 'pushed', text: 'hi' });
    await fake.pushIdle();

    assert.deepEqual(
      fake.pushAttempts.map((a) => a.status),
      [503, 500, 204],
    );
    assert.equal(endpoint.received.length, 3);
    const req = endpoint.received[2]!;
    assert.equal(req.method, 'POST');
    assert.equal(req.url, '/hooks/gmail');
    const body = JSON.parse(req.body);
    assert.equal(body.subscription, PUSH_SUB);
    assert.equal(body.message.messageId, body.message.message_id);
    assert.deepEqual(JSON.parse(Buffer.from(body.message.data, 'base64').toString()), {
      emailAddress: 'alice@example.com',
      historyId: Number(mail.historyId),
    });

    const token = /^Bearer (.+)$/.exec(req.headers.authorization!)![1]!;
    const jwks = createRemoteJWKSet(new URL(fake.jwksUrl));
    const { payload, protectedHeader } = await jwtVerify(token, jwks, {
      issuer: 'https://accounts.google.com',
      audience: 'https://gatehouse.example/hooks/gmail',
    });
    assert.equal(protectedHeader.alg, 'RS256');
    assert.equal(payload.email, serviceAccount);
    assert.equal(payload.email_verified, true);
    assert.equal(payload.exp! - payload.iat!, 3600);

    // google-auth-library's own verifier works against the fake too (it fetches the PEM key set).
    const ticket = await new OAuth2Client({ endpoints: fake.endpoints }).verifyIdToken({
      idToken: token,
      audience: 'https://gatehouse.example/hooks/gmail',
    });
    assert.equal(ticket.getPayload()!.email, serviceAccount);
    // The pull subscription on the same topic got its copy as well.
    assert.equal((await pubsub(fake, auth, 'POST', `${PULL_SUB}:pull`, { maxMessages: 5 })).receivedMessages.length, 1);
  });

  it('signOidcToken makes the tokens a verifier must reject', async () => {
    const jwks = createRemoteJWKSet(new URL(fake.jwksUrl));
    const verify = (token: string) =>
      jwtVerify(token, jwks, { issuer: 'https://accounts.google.com', audience: 'gatehouse' });
    await verify(await fake.signOidcToken({ aud: 'gatehouse' }));
    await assert.rejects(verify(await fake.signOidcToken({ aud: 'someone-else' })), {
      code: 'ERR_JWT_CLAIM_VALIDATION_FAILED',
    });
    const past = Math.floor(Date.now() / 1000) - 7200;
    await assert.rejects(verify(await fake.signOidcToken({ aud: 'gatehouse', iat: past, exp: past + 3600 })), {
      code: 'ERR_JWT_EXPIRED',
    });
    await assert.rejects(verify(await fake.signOidcToken({ aud: 'gatehouse' }, { signer: 'stranger' })), {
      code: 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED',
    });
    const { payload } = await verify(
      await fake.signOidcToken({ aud: 'gatehouse', email: 'intruder@evil.iam.gserviceaccount.com' }),
    );
    assert.equal(
      payload.email,
      'intruder@evil.iam.gserviceaccount.com',
      'a good signature with the wrong email: the app must check email itself',
    );
  });
});

describe('failure injection and client retry behaviour', () => {
  let fake: FakeGoogle;
  let auth: OAuth2Client;
  before(async () => {
    fake = await startFakeGoogle();
    auth = await signIn(fake);
  });
  after(() => fake.close());

  it('failNext answers Google error bodies for the matching calls only', async () => {
    fake.failNext(
      { method: 'PUT', path: /\/topics\// },
      { status: 403, message: 'The caller does not have permission', times: 2 },
    );
    for (let i = 0; i < 2; i++) {
      const denied = await failure(pubsub(fake, auth, 'PUT', TOPIC, {}));
      assert.deepEqual(denied.data, {
        error: { code: 403, message: 'The caller does not have permission', status: 'PERMISSION_DENIED' },
      });
    }
    assert.deepEqual(await pubsub(fake, auth, 'PUT', TOPIC, {}), { name: TOPIC });

    fake.failNext(
      { path: '/gmail/v1/users/me/profile' },
      { status: 429, message: 'Too many concurrent requests for user.', reason: 'rateLimitExceeded' },
    );
    const limited = await failure(gmailClient(fake, auth).users.getProfile({ userId: 'me' }));
    assert.equal(limited.status, 429);
    assert.equal(limited.data.error.errors[0].reason, 'rateLimitExceeded');
    assert.equal(limited.data.error.status, 'RESOURCE_EXHAUSTED');
  });

  it('disableApi answers SERVICE_DISABLED', async () => {
    fake.disableApi('pubsub');
    try {
      const res = await failure(pubsub(fake, auth, 'GET', TOPIC));
      assert.equal(res.status, 403);
      assert.match(
        res.data.error.message,
        /^Cloud Pub\/Sub API has not been used in project 123456789012 before or it is disabled\./,
      );
      assert.equal(res.data.error.details[0].reason, 'SERVICE_DISABLED');
    } finally {
      fake.disableApi('pubsub', false);
    }
  });

  it('googleapis retries GET on 5xx by default (100 ms, then 500 ms, …); retry: false turns it off; POST is never retried', async () => {
    const retrying = gmail({ version: 'v1', auth: gmailAuth(auth), rootUrl: fake.url });
    const profileCalls = () => fake.calls.filter((c) => c.path === '/gmail/v1/users/me/profile').length;
    let n = profileCalls();
    fake.failNext(
      { path: '/gmail/v1/users/me/profile' },
      { status: 503, message: 'The service is currently unavailable.' },
    );
    const started = Date.now();
    assert.equal((await retrying.users.getProfile({ userId: 'me' })).status, 200);
    assert.equal(profileCalls() - n, 2, 'one failure, one retry');
    assert.ok(Date.now() - started >= 90, 'the first retry waits about 100 ms');

    n = profileCalls();
    fake.failNext(
      { path: '/gmail/v1/users/me/profile' },
      { status: 503, message: 'The service is currently unavailable.' },
    );
    assert.equal((await failure(gmailClient(fake, auth).users.getProfile({ userId: 'me' }))).status, 503);
    assert.equal(profileCalls() - n, 1);

    await ensureTopicAndGrant(fake, auth);
    fake.failNext({ path: '/gmail/v1/users/me/watch' }, { status: 500, message: 'Backend Error' });
    const watchCalls = () => fake.calls.filter((c) => c.path.endsWith('/watch')).length;
    const w = watchCalls();
    assert.equal(
      (await failure(retrying.users.watch({ userId: 'me', requestBody: { topicName: TOPIC } }))).status,
      500,
    );
    assert.equal(watchCalls() - w, 1);

    // OAuth2Client.request (the Pub/Sub path) does not retry unless asked.
    fake.failNext({ path: `/v1/${TOPIC}` }, { status: 503, message: 'unavailable' });
    const t = fake.calls.length;
    assert.equal((await failure(pubsub(fake, auth, 'GET', TOPIC))).status, 503);
    assert.equal(fake.calls.length - t, 1);
  });

  it('a 5xx from /token is retried by OAuth2Client (its auth calls retry POST too)', async () => {
    fake.failNext({ path: '/token' }, { status: 503, message: 'try later' });
    const n = fake.calls.filter((c) => c.path === '/token').length;
    await auth.refreshAccessToken();
    assert.equal(fake.calls.filter((c) => c.path === '/token').length - n, 2);
    fake.failNext({ path: '/token' }, { status: 400, message: 'Bad Request', reason: 'invalid_grant' });
    assert.deepEqual((await failure(auth.refreshAccessToken())).data, {
      error: 'invalid_grant',
      error_description: 'Bad Request',
    });
  });
});

describe("Google's published contract: the fake routes and checks by the discovery documents", () => {
  let fake: FakeGoogle;
  let auth: OAuth2Client;
  before(async () => {
    fake = await startFakeGoogle();
    auth = await signIn(fake);
  });
  after(() => fake.close());
  const last = () => fake.calls.at(-1)!;

  it('each Gmail method in the extract is where @googleapis/gmail (generated from the same document) sends it', async () => {
    const users = gmailClient(fake, auth).users as unknown as Record<string, any>;
    const methods = [...DISCOVERY_METHODS].filter(([, m]) => m.api === 'gmail');
    assert.ok(methods.length >= 6, methods.map(([id]) => id).join());
    for (const [id, { path }] of methods) {
      // gmail.users.history.list → users.history.list({ userId, … }): its path parameters only.
      const [resource, verb] = [id.split('.').slice(2, -1), id.split('.').at(-1)!];
      const target = resource.reduce((r, key) => r[key], users);
      const params: Record<string, unknown> = Object.fromEntries(
        [...path.matchAll(/\{\+?([^}]+)\}/g)].map(([, name]) => [name, name === 'userId' ? 'me' : '0000000000000000']),
      );
      if (verb === 'watch') params.requestBody = { topicName: TOPIC };
      await target[verb].call(target, params).catch(() => undefined);
      assert.equal(last().discoveryId, id, `${id}: ${last().method} ${last().path}`);
      assert.equal(last().refused, undefined, `${id}: ${last().problem}`);
    }
  });

  it("a wrong HTTP method or path gets Google's HTML 404 page: getIamPolicy is GET, not POST", async () => {
    await pubsub(fake, auth, 'PUT', TOPIC, {});
    const wrong = await fetch(`${fake.url}v1/${TOPIC}:getIamPolicy`, {
      method: 'POST',
      headers: { authorization: `Bearer ${auth.credentials.access_token}`, 'content-type': 'application/json' },
      body: '{}',
    });
    assert.equal(wrong.status, 404);
    assert.match(wrong.headers.get('content-type')!, /^text\/html/);
    const page = await wrong.text();
    assert.match(page, /<title>Error 404 \(Not Found\)!!1<\/title>/);
    assert.ok(page.includes(`The requested URL <code>/v1/${TOPIC}:getIamPolicy</code> was not found on this server.`));
    assert.equal(last().refused, 'not-found');

    const right = await pubsub(fake, auth, 'GET', `${TOPIC}:getIamPolicy?options.requestedPolicyVersion=3`);
    assert.equal(typeof right.etag, 'string');
    assert.equal(last().discoveryId, 'pubsub.projects.topics.getIamPolicy');
    for (const path of [
      '/v1/projects/gatehouse-test/topics/gatehouse-gmail:nope',
      '/gmail/v1/users/me/watches',
      '/v2/projects/p/topics/t',
      '/gmail/v1/users/me/messages/0000000000000000/labels',
    ]) {
      const res = await fetch(`${fake.url}${path.slice(1)}`, {
        headers: { authorization: `Bearer ${auth.credentials.access_token}` },
      });
      assert.equal(res.status, 404, path);
      assert.match(res.headers.get('content-type')!, /^text\/html/, path);
    }
    // The path's documented pattern is part of the template: a topic name in a subscription's place is no method.
    assert.equal((await failure(pubsub(fake, auth, 'GET', `projects/${PROJECT}/subscriptions/a/b`))).status, 404);
    assert.equal(last().refused, 'not-found');
  });

  it('users.watch: labelFilterBehavior must be "include" or "exclude" (lower case); either proto3 spelling of the name is accepted', async () => {
    await pubsub(fake, auth, 'POST', `${TOPIC}:setIamPolicy`, {
      policy: {
        bindings: [{ role: 'roles/pubsub.publisher', members: [`serviceAccount:${GMAIL_PUSH_SERVICE_ACCOUNT}`] }],
      },
    });
    const users = gmailClient(fake, auth).users;
    const upper = await failure(
      users.watch({
        userId: 'me',
        requestBody: { topicName: TOPIC, labelIds: ['INBOX'], labelFilterBehavior: 'INCLUDE' },
      }),
    );
    assert.equal(upper.status, 400);
    assert.equal(upper.data.error.status, 'INVALID_ARGUMENT');
    assert.equal(upper.data.error.message, 'Invalid value at \'label_filter_behavior\' (TYPE_ENUM), "INCLUDE"');
    assert.equal(last().refused, 'invalid');
    assert.equal(fake.state.watches.size, 0, 'no watch made');

    await users.watch({
      userId: 'me',
      requestBody: { topicName: TOPIC, labelIds: ['INBOX'], labelFilterBehavior: 'include' },
    });
    assert.equal(fake.state.watches.get('alice@example.com')!.labelFilterBehavior, 'include');
    await users.watch({
      userId: 'me',
      requestBody: { topic_name: TOPIC, label_ids: ['SPAM'], label_filter_behavior: 'exclude' } as object,
    });
    assert.deepEqual(
      { ...fake.state.watches.get('alice@example.com')!, historyId: '', expiration: '' },
      { topicName: TOPIC, labelIds: ['SPAM'], labelFilterBehavior: 'exclude', historyId: '', expiration: '' },
    );
  });

  it('an undocumented field, query parameter or enum value, or a wrong JSON type, is 400 INVALID_ARGUMENT', async () => {
    const refused = async (call: Promise<unknown>, message: RegExp) => {
      const res = await failure(call);
      assert.equal(res.status, 400);
      assert.equal(res.data.error.status, 'INVALID_ARGUMENT');
      assert.match(res.data.error.message, message);
      assert.equal(last().refused, 'invalid');
    };
    const sub = `projects/${PROJECT}/subscriptions/contract-check`;
    await refused(
      pubsub(fake, auth, 'PUT', sub, { topic: TOPIC, pushConfig: { pushEndpoint: 'https://x.example/', oidc: {} } }),
      /^Invalid JSON payload received\. Unknown name "oidc" at 'push_config': Cannot find field\.$/,
    );
    await refused(
      pubsub(fake, auth, 'PUT', sub, { topic: TOPIC, ackDeadlineSeconds: 'sixty' }),
      /^Invalid value at 'ack_deadline_seconds' \(TYPE_INT32\), "sixty"$/,
    );
    await refused(pubsub(fake, auth, 'GET', `${TOPIC}?view=FULL`), /Unknown name "view": Cannot bind query parameter/);
    await refused(
      pubsub(fake, auth, 'GET', `${TOPIC}:getIamPolicy?options.requestedPolicyVersion=three`),
      /\(TYPE_INT32\), "three"/,
    );
    await refused(
      pubsub(fake, auth, 'POST', `${TOPIC}:setIamPolicy`, {
        policy: { bindings: [{ role: 'roles/viewer', members: 'user:a@example.com' }] },
      }),
      /^Invalid value at 'policy\.bindings\[0\]\.members'/,
    );
    const users = gmailClient(fake, auth).users;
    await refused(
      users.messages.get({ userId: 'me', id: '0000000000000000', format: 'FULL' }),
      /^Invalid value at 'format' \(TYPE_ENUM\), "FULL"$/,
    );
    await refused(
      users.history.list({ userId: 'me', startHistoryId: '1', historyTypes: ['MESSAGE_ADDED'] }),
      /'history_types' \(TYPE_ENUM\)/,
    );
    await refused(
      users.stop({ userId: 'me', requestBody: { now: true } } as object),
      /Unknown name "now": Cannot find field/,
    );
    // A documented value the resource rejects is the method's own 400, not the contract's.
    assert.equal(
      (await failure(pubsub(fake, auth, 'GET', `${TOPIC}:getIamPolicy?options.requestedPolicyVersion=2`))).status,
      400,
    );
    assert.equal(last().refused, undefined);
  });

  it('a documented method the fake does not serve answers 501, never a made-up success', async () => {
    const res = await failure(pubsub(fake, auth, 'GET', `projects/${PROJECT}/topics`));
    assert.equal(res.status, 501);
    assert.equal(res.data.error.status, 'UNIMPLEMENTED');
    assert.equal(last().discoveryId, 'pubsub.projects.topics.list');
  });

  it("failNext can answer the front end's HTML page (a 502 while the backend is down)", async () => {
    fake.failNext({ path: `/v1/${TOPIC}` }, { status: 502, message: '', html: true });
    const res = await fetch(`${fake.url}v1/${TOPIC}`, {
      headers: { authorization: `Bearer ${auth.credentials.access_token}` },
    });
    assert.equal(res.status, 502);
    assert.match(res.headers.get('content-type')!, /^text\/html/);
    assert.match(await res.text(), /<b>502\.<\/b> <ins>That’s an error\.<\/ins>/);
  });
});
