import assert from 'node:assert/strict';
import { createHmac, generateKeyPairSync, sign as ed25519Sign } from 'node:crypto';
import { mkdtempSync, readFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { sign as githubSign } from '@octokit/webhooks-methods';
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey, type JWTPayload } from 'jose';
import { Webhook } from 'standardwebhooks';
import Stripe from 'stripe';
import { parseConfig } from '../../src/config/load.js';
import { ConfigError } from '../../src/errors.js';
import { startTestGatehouse, testConfig, type TestGatehouse } from '../helpers/gatehouse.js';
import { request, type Reply } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

// Every verify type of the issue's contract, through the running receiver: real sockets, a real
// SQLite store, a recording target, and each sender's own signing library where one exists.

const fixtureText = (name: string) =>
  readFileSync(new URL(`../fixtures/webhooks/${name}.json`, import.meta.url), 'utf8');
const unix = (offsetSeconds = 0) => Math.floor(Date.now() / 1000) + offsetSeconds;
const hmacHex = (key: string, data: string) => createHmac('sha256', key).update(data).digest('hex');

const WRONG_SECRET = 'not-the-configured-secret-0123456789';
const GITHUB_NEW = 'github-new-secret-0123456789';
const GITHUB_OLD = 'github-old-secret-9876543210';
const STRIPE_NEW = 'whsec_stripeNew0123456789abcdefABCDEF';
const STRIPE_OLD = 'whsec_stripeOld9876543210fedcbaFEDCBA';
const SLACK_SECRET = '8f742231b10e8888abcd99yyyzzz85a5';
const SW_NEW = 'whsec_' + Buffer.from('standard-webhooks-new-key-0123456').toString('base64');
const SW_OLD = 'whsec_' + Buffer.from('standard-webhooks-old-key-6543210').toString('base64');
const SW_WRONG = 'whsec_' + Buffer.from('standard-webhooks-wrong-key-00000').toString('base64');
const TELEGRAM_TOKEN = 'telegram_secret-token_0123456789';
const META_APP_SECRET = 'meta-app-secret-0123456789abcdef';
const META_VERIFY_TOKEN = 'meta-verify-token-4242';
const PUSH_AUDIENCE = 'https://hooks.example.com/webhook/pubsub';
const PUSH_ACCOUNT = 'pubsub-push@acme-prod.iam.gserviceaccount.com';
const GOOGLE_KID = 'google-test-kid-1';
/** Every secret configured below: none may ever reach the log. */
const SECRETS = [
  GITHUB_NEW,
  GITHUB_OLD,
  STRIPE_NEW,
  STRIPE_OLD,
  SLACK_SECRET,
  SW_NEW,
  SW_OLD,
  SW_NEW.slice(6),
  SW_OLD.slice(6),
  TELEGRAM_TOKEN,
  META_APP_SECRET,
  META_VERIFY_TOKEN,
];
/** Bearer tokens sent to the Pub/Sub endpoint: credentials too, so also kept out of the log. */
const issuedTokens: string[] = [];

const stripe = new Stripe('sk_test_x');
const discordKeys = generateKeyPairSync('ed25519');
const discordWrongKeys = generateKeyPairSync('ed25519');
const DISCORD_PUBLIC_KEY = Buffer.from(discordKeys.publicKey.export({ format: 'jwk' }).x!, 'base64url').toString('hex');

// A stand-in for https://www.googleapis.com/oauth2/v3/certs: the "Google" key, plus a foreign key never published.
const googleKey = await generateKeyPair('RS256');
const foreignKey = await generateKeyPair('RS256');
const googleJwk = { ...(await exportJWK(googleKey.publicKey)), kid: GOOGLE_KID, alg: 'RS256', use: 'sig' };
const jwksServer = http.createServer((_req, res) => {
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ keys: [googleJwk] }));
});
await new Promise<void>((resolve) => jwksServer.listen(0, '127.0.0.1', resolve));
const JWKS_URI = `http://127.0.0.1:${(jwksServer.address() as AddressInfo).port}/oauth2/v3/certs`;
after(
  () =>
    new Promise<void>((resolve) => {
      jwksServer.closeAllConnections();
      jwksServer.close(() => resolve());
    }),
);

/** A Google-shaped OIDC token for the push subscription; `claims` override, `key`/`kid` pick the signer. */
async function googleToken(claims: JWTPayload = {}, signer: { key?: CryptoKey; kid?: string } = {}): Promise<string> {
  const token = await new SignJWT({
    iss: 'https://accounts.google.com',
    aud: PUSH_AUDIENCE,
    azp: '113774264463038321964',
    sub: '113774264463038321964',
    email: PUSH_ACCOUNT,
    email_verified: true,
    iat: unix(),
    exp: unix(3600),
    ...claims,
  })
    .setProtectedHeader({ alg: 'RS256', kid: signer.kid ?? GOOGLE_KID, typ: 'JWT' })
    .sign(signer.key ?? googleKey.privateKey);
  issuedTokens.push(token);
  return token;
}

interface SignOptions {
  /** Sign with a secret/key that is not configured. */
  wrong?: boolean;
  /** Sign with this configured secret (rotation). */
  secret?: string;
  /** Unix seconds to sign at (replay window). */
  at?: number;
  /** Delivery id, for senders that put it in a header. */
  id?: string;
}

interface Sender {
  type: string;
  path: string;
  verify: Record<string, unknown>;
  fixture: string;
  /** The headers a real sender would send for this exact body. */
  sign(body: string, options?: SignOptions): Promise<Record<string, string>> | Record<string, string>;
  /** The header that carries the proof (corrupted or left out by the negative tests). */
  proofHeader: string;
  /** A separate timestamp header, when there is one. */
  timestampHeader?: string;
  replayWindow: boolean;
  /** Whether the proof covers the body bytes (so a changed body must fail). */
  bodySigned: boolean;
  /** What the target must get as `payload` (default: the body as sent). */
  expectPayload?(payload: any, sent: any): void;
}

const senders: Sender[] = [
  {
    type: 'github',
    path: '/webhook/github',
    fixture: 'github-push',
    verify: { type: 'github', secrets: [GITHUB_NEW, GITHUB_OLD] },
    sign: async (body, o = {}) => ({
      'x-github-event': 'push',
      'x-github-delivery': o.id ?? '72d3162e-cc78-11e3-81ab-4c9367dc0958',
      'x-hub-signature-256': await githubSign(o.wrong ? WRONG_SECRET : (o.secret ?? GITHUB_NEW), body),
    }),
    proofHeader: 'x-hub-signature-256',
    replayWindow: false,
    bodySigned: true,
  },
  {
    type: 'stripe',
    path: '/webhook/stripe',
    fixture: 'stripe-invoice-paid',
    verify: { type: 'stripe', secrets: [STRIPE_NEW, STRIPE_OLD] },
    sign: (body, o = {}) => ({
      'stripe-signature': stripe.webhooks.generateTestHeaderString({
        payload: body,
        secret: o.wrong ? WRONG_SECRET : (o.secret ?? STRIPE_NEW),
        timestamp: o.at ?? unix(),
      }),
    }),
    proofHeader: 'stripe-signature',
    replayWindow: true,
    bodySigned: true,
  },
  {
    type: 'slack',
    path: '/webhook/slack',
    fixture: 'slack-event-message',
    verify: { type: 'slack', signingSecret: SLACK_SECRET },
    sign: (body, o = {}) => {
      const ts = String(o.at ?? unix());
      return {
        'x-slack-request-timestamp': ts,
        'x-slack-signature': `v0=${hmacHex(o.wrong ? WRONG_SECRET : SLACK_SECRET, `v0:${ts}:${body}`)}`,
      };
    },
    proofHeader: 'x-slack-signature',
    timestampHeader: 'x-slack-request-timestamp',
    replayWindow: true,
    bodySigned: true,
  },
  {
    type: 'standard-webhooks',
    path: '/webhook/standard',
    fixture: 'stripe-invoice-paid',
    verify: { type: 'standard-webhooks', secrets: [SW_NEW, SW_OLD] },
    sign: (body, o = {}) => {
      const id = o.id ?? 'msg_2KWPBgLlAfxdpx2AI54pPJ85f4W';
      const at = o.at ?? unix();
      return {
        'webhook-id': id,
        'webhook-timestamp': String(at),
        'webhook-signature': new Webhook(o.wrong ? SW_WRONG : (o.secret ?? SW_NEW)).sign(id, new Date(at * 1000), body),
      };
    },
    proofHeader: 'webhook-signature',
    timestampHeader: 'webhook-timestamp',
    replayWindow: true,
    bodySigned: true,
  },
  {
    type: 'telegram',
    path: '/webhook/telegram',
    fixture: 'telegram-update-message',
    verify: { type: 'telegram', secretToken: TELEGRAM_TOKEN },
    sign: (_body, o = {}) => ({
      'x-telegram-bot-api-secret-token': o.wrong ? 'another_bot_secret_token_0123' : TELEGRAM_TOKEN,
    }),
    proofHeader: 'x-telegram-bot-api-secret-token',
    replayWindow: false,
    bodySigned: false,
  },
  {
    type: 'discord',
    path: '/webhook/discord',
    fixture: 'discord-interaction-command',
    verify: { type: 'discord', publicKey: DISCORD_PUBLIC_KEY },
    sign: (body, o = {}) => {
      const ts = String(o.at ?? unix());
      const signature = ed25519Sign(
        null,
        Buffer.from(ts + body),
        (o.wrong ? discordWrongKeys : discordKeys).privateKey,
      );
      return { 'x-signature-ed25519': signature.toString('hex'), 'x-signature-timestamp': ts };
    },
    proofHeader: 'x-signature-ed25519',
    timestampHeader: 'x-signature-timestamp',
    replayWindow: true,
    bodySigned: true,
  },
  {
    type: 'meta',
    path: '/webhook/meta',
    fixture: 'whatsapp-message',
    verify: { type: 'meta', appSecret: META_APP_SECRET, verifyToken: META_VERIFY_TOKEN },
    sign: (body, o = {}) => ({
      'x-hub-signature-256': `sha256=${hmacHex(o.wrong ? WRONG_SECRET : META_APP_SECRET, body)}`,
    }),
    proofHeader: 'x-hub-signature-256',
    replayWindow: false,
    bodySigned: true,
  },
  {
    type: 'pubsub-oidc',
    path: '/webhook/pubsub',
    fixture: 'pubsub-push',
    verify: { type: 'pubsub-oidc', audience: PUSH_AUDIENCE, serviceAccountEmail: PUSH_ACCOUNT, jwksUri: JWKS_URI },
    // Signed by a key the JWKS does not hold, under the published kid.
    sign: async (_body, o = {}) => ({
      authorization: `Bearer ${await googleToken({}, o.wrong ? { key: foreignKey.privateKey } : {})}`,
    }),
    proofHeader: 'authorization',
    replayWindow: false,
    bodySigned: false,
    expectPayload(payload, sent) {
      assert.deepEqual(payload.data, JSON.parse(Buffer.from(sent.message.data, 'base64').toString('utf8')));
      assert.deepEqual(payload.attributes, sent.message.attributes);
      assert.equal(payload.messageId, sent.message.messageId);
    },
  },
];
const sender = (type: string) => senders.find((s) => s.type === type)!;

function receiverConfig(targetUrl: string, failuresMax: number): Record<string, any> {
  return testConfig(targetUrl, {
    storage: { path: path.join(mkdtempSync(path.join(tmpdir(), 'gatehouse-verifiers-')), 'gatehouse.db') },
    gateway: { auth: { failures: { max: failuresMax, windowSeconds: 60, lockoutSeconds: 60 } } },
    webhooks: {
      enabled: true,
      listen: { host: '127.0.0.1', port: 0 },
      endpoints: senders.map((s) => ({ path: s.path, verify: s.verify, action: 'system-event' })),
      targets: { 'system-event': { url: `${targetUrl}/events` } },
      delivery: { maxAttempts: 3, initialBackoffMs: 20, maxBackoffMs: 100, timeoutMs: 2000, concurrency: 4 },
    },
  });
}

/** Changes one character near the end of a signature (a and b are both hex and base64 digits). */
function corrupt(value: string): string {
  const i = value.length - 5;
  return value.slice(0, i) + (value[i] === 'a' ? 'b' : 'a') + value.slice(i + 1);
}

describe('webhook verifiers: each sender type through the running receiver', () => {
  let target: RecordingServer;
  let gatehouse: TestGatehouse;
  let hooks: string;
  before(async () => {
    target = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(receiverConfig(target.url, 1000));
    hooks = gatehouse.webhooks!.url;
  });
  after(async () => {
    await gatehouse.close();
    await target.close();
  });

  const post = (p: string, body: string, headers: Record<string, string>) =>
    request(hooks, p, { method: 'POST', body, headers: { 'content-type': 'application/json', ...headers } });
  const storedCount = async (endpoint?: string) =>
    (await gatehouse.webhooks!.store.list({ endpoint, limit: 10_000 })).length;
  const deliveredWithId = (id: string) => target.received.filter((r) => JSON.parse(r.body).id === id);
  async function waitForDelivery(id: string) {
    const [first] = await waitFor(() => deliveredWithId(id).length > 0 && deliveredWithId(id), {
      timeoutMs: 5_000,
      what: `event ${id} at the target`,
    });
    return JSON.parse(first!.body);
  }
  /**
   * No event queued: one is stored before its request is answered and stays queued until its delivery
   * settles, after the target got it; so anything wrongly accepted by the requests answered so far has
   * reached the target by then (the explicit signal for a negative check on deliveries).
   */
  const settled = () =>
    waitFor(async () => (await gatehouse.webhooks!.store.list({ status: 'queued', limit: 1 })).length === 0, {
      what: 'no queued event',
    });
  /** Runs `send`, then asserts it changed neither the store nor what the target received. */
  async function assertNothingTaken(send: () => Promise<Reply>): Promise<Reply> {
    const stored = await storedCount();
    const delivered = target.received.length;
    const reply = await send();
    await settled();
    assert.equal(await storedCount(), stored, 'nothing stored');
    assert.equal(target.received.length, delivered, 'nothing delivered');
    return reply;
  }
  async function accepted(s: Sender, body: string, options: SignOptions = {}) {
    const reply = await post(s.path, body, await s.sign(body, options));
    assert.equal(reply.status, s.type === 'discord' ? 200 : 202, reply.body);
    return waitForDelivery(reply.headers['x-gatehouse-event-id'] as string);
  }

  for (const s of senders) {
    it(`${s.type}: a valid delivery → 202 and the envelope at the target; the same delivery again → 200 duplicate, delivered once`, async () => {
      const body = fixtureText(s.fixture);
      const sent = JSON.parse(body);
      const before = await storedCount(s.path);
      const first = await post(s.path, body, await s.sign(body));
      // Discord needs an interaction response, not a 202: the stored event's id comes in a header.
      const interaction = s.type === 'discord';
      assert.equal(first.status, interaction ? 200 : 202, first.body);
      if (interaction) assert.deepEqual(first.json(), { type: 5 });
      const id = first.headers['x-gatehouse-event-id'] as string;
      if (!interaction) assert.equal(first.json().id, id);
      const envelope = await waitForDelivery(id);
      assert.equal(envelope.endpoint, s.path);
      assert.equal(envelope.action, 'system-event');
      if (s.expectPayload) s.expectPayload(envelope.payload, sent);
      else assert.deepEqual(envelope.payload, sent);

      // Senders retry with a fresh signature (and timestamp); the delivery id is what makes it the same event.
      const again = await post(s.path, body, await s.sign(body));
      assert.equal(again.status, 200);
      assert.equal(again.headers['x-gatehouse-event-id'], id);
      if (!interaction) assert.deepEqual(again.json(), { id, status: 'duplicate' });
      await settled();
      assert.equal(deliveredWithId(id).length, 1);
      assert.equal(await storedCount(s.path), before + 1);
    });

    const body = fixtureText(s.fixture);
    const negatives: [string, () => Promise<[string, Record<string, string>]>][] = [
      [
        'a corrupted signature',
        async () => {
          const headers = await s.sign(body);
          return [body, { ...headers, [s.proofHeader]: corrupt(headers[s.proofHeader]!) }];
        },
      ],
      ['a signature made with the wrong secret or key', async () => [body, await s.sign(body, { wrong: true })]],
      [
        `no ${s.proofHeader} header`,
        async () => {
          const headers = await s.sign(body);
          delete headers[s.proofHeader];
          return [body, headers];
        },
      ],
    ];
    if (s.timestampHeader) {
      negatives.push([
        `no ${s.timestampHeader} header`,
        async () => {
          const headers = await s.sign(body);
          delete headers[s.timestampHeader!];
          return [body, headers];
        },
      ]);
    }
    if (s.replayWindow) {
      negatives.push([
        'a correctly signed but stale timestamp (10 minutes old)',
        async () => [body, await s.sign(body, { at: unix(-600) })],
      ]);
      negatives.push([
        'a correctly signed timestamp 10 minutes in the future',
        async () => [body, await s.sign(body, { at: unix(600) })],
      ]);
    }
    if (s.bodySigned) {
      negatives.push([
        'the body changed after signing',
        async () => [body.replace('{', '{"injected":true,'), await s.sign(body)],
      ]);
    }
    for (const [name, build] of negatives) {
      it(`${s.type}: ${name} → 401 invalid_webhook_signature, nothing stored or delivered`, async () => {
        const [sentBody, headers] = await build();
        const reply = await assertNothingTaken(() => post(s.path, sentBody, headers));
        assert.equal(reply.status, 401);
        assert.equal(reply.json().error.code, 'invalid_webhook_signature');
      });
    }
  }

  it('rotation: github, stripe and standard-webhooks accept signatures by either configured secret', async () => {
    const github = sender('github');
    for (const [i, secret] of [GITHUB_NEW, GITHUB_OLD].entries()) {
      // A body of its own: the fixture as sent before, signed with the same secret, is a replay.
      const push = JSON.stringify({ ...JSON.parse(fixtureText('github-push')), rotation: i });
      const envelope = await accepted(github, push, { secret, id: `rotation-github-${i}` });
      assert.equal(envelope.payload.after, '0d1a26e67d8f5eaf1f6ba5c57fc3c7d91ac0fd1c');
    }
    const stripeSender = sender('stripe');
    for (const [i, secret] of [STRIPE_NEW, STRIPE_OLD].entries()) {
      const invoice = JSON.stringify({ ...JSON.parse(fixtureText('stripe-invoice-paid')), id: `evt_rotation_${i}` });
      const envelope = await accepted(stripeSender, invoice, { secret });
      assert.equal(envelope.payload.type, 'invoice.paid');
    }
    const standard = sender('standard-webhooks');
    for (const [i, secret] of [SW_NEW, SW_OLD].entries()) {
      await accepted(standard, fixtureText('stripe-invoice-paid'), { secret, id: `msg_rotation_${i}` });
    }
  });

  it('stripe: any v1 in Stripe-Signature may match, first or last (several signatures while Stripe rolls a secret)', async () => {
    for (const goodFirst of [true, false]) {
      const invoice = JSON.stringify({
        ...JSON.parse(fixtureText('stripe-invoice-paid')),
        id: `evt_several_v1_${goodFirst}`,
      });
      const t = unix();
      const signed = stripe.webhooks.generateTestHeaderString({ payload: invoice, secret: STRIPE_OLD, timestamp: t });
      const good = signed.slice(signed.indexOf('v1='));
      const bad = `v1=${hmacHex(WRONG_SECRET, `${t}.${invoice}`)}`;
      const reply = await post('/webhook/stripe', invoice, {
        'stripe-signature': `t=${t},${goodFirst ? `${good},${bad}` : `${bad},${good}`}`,
      });
      assert.equal(reply.status, 202);
      await waitForDelivery(reply.json().id);
    }
  });

  it('slack: url_verification (signed) is answered 200 {"challenge"} directly: not stored, not delivered', async () => {
    const body = fixtureText('slack-url-verification');
    const slack = sender('slack');
    const reply = await assertNothingTaken(async () => post(slack.path, body, await slack.sign(body)));
    assert.equal(reply.status, 200);
    assert.match(reply.headers['content-type']!, /^application\/json/);
    assert.deepEqual(reply.json(), { challenge: JSON.parse(body).challenge });
  });

  it('slack: url_verification with a bad signature → 401, the challenge is not echoed', async () => {
    const body = fixtureText('slack-url-verification');
    const reply = await assertNothingTaken(async () =>
      post('/webhook/slack', body, await sender('slack').sign(body, { wrong: true })),
    );
    assert.equal(reply.status, 401);
    assert.equal(reply.json().error.code, 'invalid_webhook_signature');
    assert.ok(!reply.body.includes(JSON.parse(body).challenge));
  });

  it('discord: a signed PING is answered 200 {"type":1} directly: not stored, not delivered', async () => {
    const body = fixtureText('discord-ping');
    const discord = sender('discord');
    const reply = await assertNothingTaken(async () => post(discord.path, body, await discord.sign(body)));
    assert.equal(reply.status, 200);
    assert.match(reply.headers['content-type']!, /^application\/json/);
    assert.deepEqual(reply.json(), { type: 1 });
  });

  it('discord: a PING with a bad signature → 401 (Discord sends these to test the endpoint)', async () => {
    const body = fixtureText('discord-ping');
    const reply = await assertNothingTaken(async () =>
      post('/webhook/discord', body, await sender('discord').sign(body, { wrong: true })),
    );
    assert.equal(reply.status, 401);
    assert.equal(reply.json().error.code, 'invalid_webhook_signature');
  });

  const metaGet = (query: Record<string, string>) => request(hooks, `/webhook/meta?${new URLSearchParams(query)}`);

  it('meta: GET subscribe with the right verify token echoes hub.challenge; nothing stored or delivered', async () => {
    const reply = await assertNothingTaken(() =>
      metaGet({ 'hub.mode': 'subscribe', 'hub.verify_token': META_VERIFY_TOKEN, 'hub.challenge': '1158201444' }),
    );
    assert.equal(reply.status, 200);
    assert.equal(reply.body, '1158201444');
  });

  const badMetaGets: [string, Record<string, string>][] = [
    [
      'a wrong verify token',
      { 'hub.mode': 'subscribe', 'hub.verify_token': 'meta-verify-token-4243', 'hub.challenge': '1158201444' },
    ],
    ['no verify token', { 'hub.mode': 'subscribe', 'hub.challenge': '1158201444' }],
    [
      'hub.mode other than subscribe',
      { 'hub.mode': 'unsubscribe', 'hub.verify_token': META_VERIFY_TOKEN, 'hub.challenge': '1158201444' },
    ],
  ];
  for (const [name, query] of badMetaGets) {
    it(`meta: GET with ${name} → 403, the challenge is not echoed`, async () => {
      const reply = await assertNothingTaken(() => metaGet(query));
      assert.equal(reply.status, 403);
      assert.ok(!reply.body.includes('1158201444'));
    });
  }

  it('GET on an endpoint without a subscription check is 405 (only meta answers GET)', async () => {
    const reply = await request(hooks, '/webhook/github');
    assert.equal(reply.status, 405);
    assert.equal(reply.json().error.code, 'method_not_allowed');
    assert.equal((await request(hooks, '/webhook/meta', { method: 'PUT' })).headers.allow, 'GET, POST');
  });

  it('pubsub: the bare issuer form "accounts.google.com" is accepted too', async () => {
    const envelope = JSON.parse(fixtureText('pubsub-push'));
    envelope.message.messageId = envelope.message.message_id = '11236958406545999';
    const reply = await post('/webhook/pubsub', JSON.stringify(envelope), {
      authorization: `Bearer ${await googleToken({ iss: 'accounts.google.com' })}`,
    });
    assert.equal(reply.status, 202);
    assert.equal((await waitForDelivery(reply.json().id)).payload.messageId, '11236958406545999');
  });

  it('pubsub: message.data that is not JSON reaches the target as the decoded text', async () => {
    const envelope = JSON.parse(fixtureText('pubsub-push'));
    envelope.message.messageId = envelope.message.message_id = '11236958406546000';
    envelope.message.data = Buffer.from('plain text, not JSON').toString('base64');
    const reply = await post('/webhook/pubsub', JSON.stringify(envelope), {
      authorization: `Bearer ${await googleToken()}`,
    });
    assert.equal(reply.status, 202);
    const delivered = await waitForDelivery(reply.json().id);
    assert.equal(delivered.payload.data, 'plain text, not JSON');
    assert.deepEqual(delivered.payload.attributes, envelope.message.attributes);
  });

  const badTokens: [string, () => Promise<string>][] = [
    ['a wrong audience', () => googleToken({ aud: 'https://other.example.com/push' })],
    ['another service account email', () => googleToken({ email: 'attacker@evil-project.iam.gserviceaccount.com' })],
    ['email_verified false', () => googleToken({ email_verified: false })],
    ['no email_verified claim', () => googleToken({ email_verified: undefined })],
    ['an expired token', () => googleToken({ iat: unix(-7200), exp: unix(-3600) })],
    ['a non-Google issuer', () => googleToken({ iss: 'https://accounts.google.com.evil.test' })],
    [
      'a token signed by a key not in the JWKS (unknown kid)',
      () => googleToken({}, { key: foreignKey.privateKey, kid: 'not-published' }),
    ],
    ['a token signed by a key not in the JWKS (published kid)', () => googleToken({}, { key: foreignKey.privateKey })],
  ];
  for (const [name, token] of badTokens) {
    it(`pubsub: ${name} → 401 invalid_webhook_signature, nothing stored or delivered`, async () => {
      const body = fixtureText('pubsub-push');
      const authorization = `Bearer ${await token()}`;
      const reply = await assertNothingTaken(() => post('/webhook/pubsub', body, { authorization }));
      assert.equal(reply.status, 401);
      assert.equal(reply.json().error.code, 'invalid_webhook_signature');
    });
  }

  it('the log never contains a configured secret, the Meta verify token or a Pub/Sub bearer token', () => {
    const log = gatehouse.logText();
    assert.ok(log.length > 0);
    for (const secret of [...SECRETS, ...issuedTokens])
      assert.ok(!log.includes(secret), `log contains ${secret.slice(0, 12)}…`);
  });
});

describe('webhook verifiers: provider signatures neither count toward the lockout nor are refused by it', () => {
  // Providers send from shared addresses: anyone can point their own repo or bot at the URL with a
  // wrong secret. Were those failures counted, the provider's address would be locked out and the
  // victim's genuine deliveries lost (GitHub and Discord do not retry).
  it('failures of every verify type (and Meta GET) from one address lock nothing; its valid deliveries are stored, even while a secret endpoint has it locked out', async () => {
    const target = await startRecordingUpstream();
    const config = receiverConfig(target.url, 3);
    const HOOK_SECRET = 'plain-hook-secret-0123456789';
    config.webhooks.endpoints.push({ path: '/webhook/plain', secret: HOOK_SECRET, action: 'system-event' });
    const gatehouse = await startTestGatehouse(config);
    const hooks = gatehouse.webhooks!.url;
    const from = (localAddress: string, p: string, body: string, headers: Record<string, string>) =>
      request(hooks, p, {
        method: 'POST',
        body,
        headers: { 'content-type': 'application/json', ...headers },
        localAddress,
      });
    try {
      for (const s of senders) {
        const body = fixtureText(s.fixture);
        for (let i = 0; i < 4; i++)
          assert.equal(
            (await from('127.0.0.7', s.path, body, await s.sign(body, { wrong: true }))).status,
            401,
            `${s.type}: forged delivery ${i + 1}`,
          );
      }
      for (let i = 0; i < 4; i++) {
        assert.equal(
          (
            await request(hooks, `/webhook/meta?hub.mode=subscribe&hub.verify_token=guess-000${i}&hub.challenge=1`, {
              localAddress: '127.0.0.7',
            })
          ).status,
          403,
        );
      }

      // A `secret` endpoint still counts and locks: max 3.
      for (let i = 0; i < 3; i++)
        assert.equal(
          (await from('127.0.0.7', '/webhook/plain', '{}', { 'x-webhook-secret': `wrong-secret-${i}-0123456789` }))
            .status,
          401,
        );
      const locked = await from('127.0.0.7', '/webhook/plain', '{}', { 'x-webhook-secret': HOOK_SECRET });
      assert.equal(locked.status, 429);
      assert.equal(locked.json().error.code, 'too_many_failures');
      assert.ok(Number(locked.headers['retry-after']) > 0);

      // Every provider's genuine delivery from that same address is taken.
      for (const s of senders) {
        const body = fixtureText(s.fixture);
        const reply = await from('127.0.0.7', s.path, body, await s.sign(body));
        assert.equal(reply.status, s.type === 'discord' ? 200 : 202, `${s.type}: ${reply.body}`);
      }
      const subscribed = await request(
        hooks,
        `/webhook/meta?hub.mode=subscribe&hub.verify_token=${META_VERIFY_TOKEN}&hub.challenge=77`,
        { localAddress: '127.0.0.7' },
      );
      assert.equal(subscribed.status, 200);
      assert.equal(subscribed.body, '77');
      const stored = await gatehouse.webhooks!.store.list({ limit: 100 });
      assert.deepEqual(
        stored.map((e) => e.endpoint).sort(),
        senders.map((s) => s.path).sort(),
        'one event per provider; nothing from the locked-out secret endpoint',
      );
      for (const secret of SECRETS) assert.ok(!gatehouse.logText().includes(secret));
    } finally {
      await gatehouse.close();
      await target.close();
    }
  });
});

describe('webhook verifiers: config', () => {
  const withEndpoints = (endpoints: Record<string, unknown>[]) =>
    testConfig('http://127.0.0.1:9', {
      webhooks: { enabled: true, endpoints, targets: { 'system-event': { url: 'http://127.0.0.1:9/events' } } },
    });
  const problemsOf = (raw: Record<string, any>): readonly string[] => {
    try {
      parseConfig(raw);
    } catch (err) {
      assert.ok(err instanceof ConfigError);
      return err.problems;
    }
    assert.fail('parseConfig accepted an invalid config');
  };

  it('a config with every verify type parses; single secrets normalise to `secrets`, plain `secret` to type secret', () => {
    const config = parseConfig(
      withEndpoints([
        ...senders.map((s) => ({ path: s.path, verify: s.verify, action: 'system-event' })),
        { path: '/webhook/github-single', verify: { type: 'github', secret: GITHUB_NEW }, action: 'system-event' },
        {
          path: '/webhook/stripe-single',
          verify: { type: 'stripe', secret: STRIPE_NEW, toleranceSeconds: 60 },
          action: 'system-event',
        },
        { path: '/webhook/secret', verify: { type: 'secret', secret: WRONG_SECRET }, action: 'system-event' },
        { path: '/webhook/plain', secret: WRONG_SECRET, action: 'system-event' },
      ]),
    );
    const verify = new Map(config.webhooks.endpoints.map((e) => [e.path, e.verify as Record<string, unknown>]));
    assert.deepEqual([...new Set([...verify.values()].map((v) => v.type))].sort(), [
      'discord',
      'github',
      'meta',
      'pubsub-oidc',
      'secret',
      'slack',
      'standard-webhooks',
      'stripe',
      'telegram',
    ]);
    assert.deepEqual(verify.get('/webhook/github-single'), { type: 'github', secrets: [GITHUB_NEW] });
    assert.deepEqual(verify.get('/webhook/stripe-single'), {
      type: 'stripe',
      secrets: [STRIPE_NEW],
      toleranceSeconds: 60,
    });
    assert.equal(verify.get('/webhook/stripe')!.toleranceSeconds, 300);
    assert.deepEqual(verify.get('/webhook/plain'), { type: 'secret', secret: WRONG_SECRET });
  });

  const invalid: [string, Record<string, unknown>, string][] = [
    [
      'secret and verify together',
      {
        path: '/webhook/x',
        secret: WRONG_SECRET,
        verify: { type: 'telegram', secretToken: TELEGRAM_TOKEN },
        action: 'system-event',
      },
      'webhooks.endpoints[0]:',
    ],
    [
      'a discord public key of the wrong length',
      {
        path: '/webhook/x',
        verify: { type: 'discord', publicKey: DISCORD_PUBLIC_KEY.slice(2) },
        action: 'system-event',
      },
      'webhooks.endpoints[0].verify.publicKey:',
    ],
    [
      'stripe with neither secret nor secrets',
      { path: '/webhook/x', verify: { type: 'stripe' }, action: 'system-event' },
      'webhooks.endpoints[0].verify:',
    ],
    [
      'github with both secret and secrets',
      {
        path: '/webhook/x',
        verify: { type: 'github', secret: GITHUB_NEW, secrets: [GITHUB_OLD] },
        action: 'system-event',
      },
      'webhooks.endpoints[0].verify:',
    ],
    [
      'an unknown verify type',
      { path: '/webhook/x', verify: { type: 'gitlab', secret: GITHUB_NEW }, action: 'system-event' },
      'webhooks.endpoints[0].verify',
    ],
  ];
  for (const [name, endpoint, pathPrefix] of invalid) {
    it(`${name} → ConfigError naming ${pathPrefix.replace(/:$/, '')}`, () => {
      const problems = problemsOf(withEndpoints([endpoint]));
      assert.ok(
        problems.some((p) => p.startsWith(pathPrefix)),
        JSON.stringify(problems),
      );
    });
  }
});
