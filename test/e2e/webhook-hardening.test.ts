/**
 * Findings 8, 10 and 11 of the outside security review, through the running receiver and gateway
 * (real sockets, a real SQLite file, a recording target):
 * - signed replays: a sender that signs no timestamp (github, meta) cannot get the same signed
 *   request delivered twice by changing its delivery id or waiting out the idempotency window;
 * - prototype lookups: channel names and paths from the request never reach Object.prototype;
 * - deeply nested bodies: refused with 400 `invalid_json` before anything recursive sees them,
 *   never a 503 the sender retries forever.
 */
import assert from 'node:assert/strict';
import { createHmac, randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { sign as githubSign } from '@octokit/webhooks-methods';
import Database from 'better-sqlite3';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { SqliteChannelStore } from '../../src/storage/sqlite/channels.js';
import { errorCatalogue } from '../../src/errors.js';
import { startTestGatehouse, testConfig, TEST_PLAIN_KEY, type TestGatehouse } from '../helpers/gatehouse.js';
import { request, type Reply } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

// In-process channels seal their grants: this test process gets a key of its own.
process.env.GATEHOUSE_SECRET_KEY ??= randomBytes(32).toString('base64');

const GITHUB_SECRET = 'github-hardening-secret-0123456789';
const META_APP_SECRET = 'meta-hardening-app-secret-0123456789';
const DEPLOY_SECRET = 'deploy-hardening-secret-0123456789';
const PUSH_AUDIENCE = 'https://hooks.example.com/webhook/pubsub';
const PUSH_ACCOUNT = 'pubsub-push@acme-prod.iam.gserviceaccount.com';
const DAY_MS = 24 * 60 * 60 * 1000;
const json = { 'content-type': 'application/json' };
const metaSignature = (body: string) => `sha256=${createHmac('sha256', META_APP_SECRET).update(body).digest('hex')}`;
/** `{ …head, "data": [[[…]]] }` with `depth` nested arrays under `data` (the object itself is one level more). */
const nestedUnder = (head: string, depth: number) => `{${head}"data":${'['.repeat(depth)}${']'.repeat(depth)}}`;

// A stand-in for Google's JWKS (https://www.googleapis.com/oauth2/v3/certs) for the Pub/Sub push endpoint.
const googleKey = await generateKeyPair('RS256');
const googleJwk = { ...(await exportJWK(googleKey.publicKey)), kid: 'hardening-kid', alg: 'RS256', use: 'sig' };
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

const googleToken = () =>
  new SignJWT({
    iss: 'https://accounts.google.com',
    aud: PUSH_AUDIENCE,
    email: PUSH_ACCOUNT,
    email_verified: true,
    sub: '1137742644',
  })
    .setProtectedHeader({ alg: 'RS256', kid: 'hardening-kid', typ: 'JWT' })
    .setIssuedAt()
    .setExpirationTime('1h')
    .sign(googleKey.privateKey);

function hardeningConfig(
  upstreamUrl: string,
  targetUrl: string,
  webhooks: Record<string, unknown> = {},
): Record<string, any> {
  return testConfig(upstreamUrl, {
    storage: { path: path.join(mkdtempSync(path.join(tmpdir(), 'gatehouse-hardening-')), 'gatehouse.db') },
    webhooks: {
      enabled: true,
      listen: { host: '127.0.0.1', port: 0 },
      endpoints: [
        {
          path: '/webhook/github',
          verify: { type: 'github', secret: GITHUB_SECRET },
          action: 'message',
          template: '{{sender.login}}: {{data}}',
        },
        {
          path: '/webhook/whatsapp',
          verify: { type: 'meta', appSecret: META_APP_SECRET, verifyToken: 'verify-token-1234' },
          action: 'message',
        },
        { path: '/webhook/deploys', secret: DEPLOY_SECRET, action: 'system-event', template: 'deploy {{data}}' },
        {
          path: '/webhook/pubsub',
          verify: {
            type: 'pubsub-oidc',
            audience: PUSH_AUDIENCE,
            serviceAccountEmail: PUSH_ACCOUNT,
            jwksUri: JWKS_URI,
          },
          action: 'system-event',
        },
      ],
      targets: { message: { url: `${targetUrl}/messages` }, 'system-event': { url: `${targetUrl}/events` } },
      delivery: { maxAttempts: 3, initialBackoffMs: 20, maxBackoffMs: 100, timeoutMs: 2000 },
      ...webhooks,
    },
    channels: { phone: { kind: 'qr', action: 'message' } },
  });
}

describe('webhook hardening (review findings 8, 10, 11)', () => {
  let upstream: RecordingServer;
  let target: RecordingServer;
  let gatehouse: TestGatehouse;
  let hooks: string;
  let channelStore: SqliteChannelStore;
  let storagePath: string;

  before(async () => {
    [upstream, target] = await Promise.all([startRecordingUpstream(), startRecordingUpstream()]);
    const config = hardeningConfig(upstream.url, target.url);
    storagePath = config.storage.path;
    gatehouse = await startTestGatehouse(config);
    hooks = gatehouse.webhooks!.url;
    // A second connection to the same file, as `gatehouse channels login` would have.
    channelStore = new SqliteChannelStore(storagePath);
  });
  after(async () => {
    await channelStore?.close();
    await gatehouse?.close();
    await Promise.all([upstream?.close(), target?.close()]);
  });

  const post = (p: string, body: string, headers: Record<string, string> = {}) =>
    request(hooks, p, { method: 'POST', body, headers: { ...json, ...headers } });
  const githubPost = async (body: string, delivery: string, signature?: string) =>
    post('/webhook/github', body, {
      'x-github-event': 'push',
      'x-github-delivery': delivery,
      'x-hub-signature-256': signature ?? (await githubSign(GITHUB_SECRET, body)),
    });
  /**
   * Bodies the target received that carry `marker`, once no event is queued: an event is stored before
   * its request is answered and stays queued until its delivery settles, after the target got it; so
   * anything wrongly accepted by the requests answered so far is counted.
   */
  const deliveredWith = async (marker: string) => {
    await waitFor(async () => (await gatehouse.webhooks!.store.list({ status: 'queued', limit: 1 })).length === 0, {
      what: 'no queued event',
    });
    return target.received.filter((r) => r.body.includes(marker));
  };
  const storedCount = async () => (await gatehouse.webhooks!.store.list({ limit: 10_000 })).length;
  /** Moves an event's receipt back in time, as if it had arrived `ms` earlier (a second connection, as an operator's sqlite3). */
  const age = (id: string, ms: number) => {
    const db = new Database(storagePath);
    try {
      db.pragma('busy_timeout = 5000');
      assert.equal(db.prepare('UPDATE events SET received_at = received_at - ? WHERE id = ?').run(ms, id).changes, 1);
    } finally {
      db.close();
    }
  };
  /** Error lines (a stack, a refusing store) logged since `mark` (a count of log lines). */
  const unexpectedErrors = (mark: number) =>
    gatehouse.logs.slice(mark).filter((l) => l.msg === 'unexpected error' || l.msg === 'event store refused a webhook');

  describe('finding 8: signed replays of senders that sign no timestamp', () => {
    it('github: the same signed body with a new X-GitHub-Delivery is a duplicate, stored and delivered once', async () => {
      const body = JSON.stringify({ sender: { login: 'octo' }, data: 'replay-gh-1', after: 'c0ffee' });
      const first = await githubPost(body, 'delivery-original');
      assert.equal(first.status, 202, first.body);
      const { id } = first.json();
      await waitFor(() => target.received.find((r) => r.body.includes(id)), { what: 'the original at the target' });

      const stored = await storedCount();
      const replay = await githubPost(body, 'delivery-forged-by-replayer');
      assert.equal(replay.status, 200, replay.body);
      assert.deepEqual(replay.json(), { id, status: 'duplicate' });
      assert.equal(replay.headers['x-gatehouse-event-id'], id);
      // The same signature in upper-case hex verifies too: it must not count as a new request.
      const upper = await githubPost(
        body,
        'delivery-upper-hex',
        `sha256=${(await githubSign(GITHUB_SECRET, body)).slice(7).toUpperCase()}`,
      );
      assert.deepEqual(upper.json(), { id, status: 'duplicate' });

      assert.equal(await storedCount(), stored, 'nothing new stored');
      assert.equal((await deliveredWith('replay-gh-1')).length, 1, 'the target got the event once');
      const keys = (await gatehouse.webhooks!.store.list({ endpoint: '/webhook/github', limit: 100 })).map(
        (e) => e.idempotencyKey,
      );
      assert.ok(
        !keys.includes('delivery-forged-by-replayer'),
        'the replayed delivery id is not remembered as a new event',
      );
    });

    it('github: a replay after the idempotency window (delivery id forgotten) is still a duplicate', async () => {
      const body = JSON.stringify({ sender: { login: 'octo' }, data: 'replay-gh-2' });
      const first = await githubPost(body, 'delivery-aged');
      assert.equal(first.status, 202);
      const { id } = first.json();
      await waitFor(() => target.received.find((r) => r.body.includes(id)), { what: 'the original at the target' });
      age(id, DAY_MS + 60_000);

      for (const delivery of ['delivery-aged', 'delivery-aged-new']) {
        const replay = await githubPost(body, delivery);
        assert.equal(replay.status, 200, replay.body);
        assert.deepEqual(replay.json(), { id, status: 'duplicate' });
      }
      assert.equal((await deliveredWith('replay-gh-2')).length, 1);
    });

    it('github: what is stored is a digest of the signature, not the signature (a file reader cannot rebuild the signed request)', async () => {
      const body = JSON.stringify({ sender: { login: 'octo' }, data: 'replay-gh-3' });
      const signature = await githubSign(GITHUB_SECRET, body);
      assert.equal((await githubPost(body, 'delivery-digest', signature)).status, 202);
      const db = new Database(storagePath, { readonly: true });
      try {
        const dump = JSON.stringify(db.prepare('SELECT * FROM event_replay_keys').all());
        assert.ok(!dump.toLowerCase().includes(signature.slice(7).toLowerCase()));
      } finally {
        db.close();
      }
    });

    it('github: a different body is a new event', async () => {
      const a = await githubPost(JSON.stringify({ sender: { login: 'octo' }, data: 'replay-gh-4a' }), 'delivery-4a');
      const b = await githubPost(JSON.stringify({ sender: { login: 'octo' }, data: 'replay-gh-4b' }), 'delivery-4b');
      assert.equal(a.status, 202);
      assert.equal(b.status, 202);
      assert.notEqual(a.json().id, b.json().id);
    });

    it('meta: a signed notification replayed after its dedupe id aged out of the window is a duplicate, delivered once', async () => {
      const body = JSON.stringify({
        object: 'whatsapp_business_account',
        entry: [
          {
            id: 'WABA',
            changes: [
              { field: 'messages', value: { messages: [{ id: 'wamid.replay-meta-1', text: { body: 'hi' } }] } },
            ],
          },
        ],
      });
      const first = await post('/webhook/whatsapp', body, { 'x-hub-signature-256': metaSignature(body) });
      assert.equal(first.status, 202, first.body);
      const { id } = first.json();
      await waitFor(() => target.received.find((r) => r.body.includes(id)), { what: 'the original at the target' });
      age(id, DAY_MS + 60_000);

      const stored = await storedCount();
      const replay = await post('/webhook/whatsapp', body, { 'x-hub-signature-256': metaSignature(body) });
      assert.equal(replay.status, 200, replay.body);
      assert.deepEqual(replay.json(), { id, status: 'duplicate' });
      assert.equal(await storedCount(), stored);
      assert.equal((await deliveredWith('wamid.replay-meta-1')).length, 1);
    });

    it('senders with a delivery id and no signature digest (secret) keep the 24 h window as before', async () => {
      const headers = { 'x-webhook-secret': DEPLOY_SECRET, 'idempotency-key': 'deploy-window-1' };
      const first = await post('/webhook/deploys', '{"data":"window-1"}', headers);
      assert.equal(first.status, 202);
      age(first.json().id, DAY_MS + 60_000);
      const later = await post('/webhook/deploys', '{"data":"window-1"}', headers);
      assert.equal(later.status, 202, 'a delivery id past the window is a new event');
      assert.notEqual(later.json().id, first.json().id);
    });
  });

  describe('finding 10: lookups keyed by request input read own properties only', () => {
    const notFound = { error: { code: 'not_found', message: errorCatalogue.not_found.message } };

    it('POST /_gatehouse/channels/<Object.prototype name>/messages with a valid key: 404 not_found, nothing sent, no stack', async () => {
      const mark = gatehouse.logs.length;
      for (const name of [
        'constructor',
        'tostring',
        'valueof',
        'hasownproperty',
        'isprototypeof',
        '__proto__',
        'toString',
        'hasOwnProperty',
      ]) {
        const reply = await request(gatehouse.url, `/_gatehouse/channels/${name}/messages`, {
          method: 'POST',
          headers: { ...json, 'x-api-key': TEST_PLAIN_KEY },
          body: JSON.stringify({ to: 'anyone', text: 'hello' }),
        });
        assert.equal(reply.status, 404, `${name}: ${reply.body}`);
        assert.deepEqual(reply.json(), notFound, name);
      }
      assert.deepEqual(unexpectedErrors(mark), []);
      assert.equal(upstream.received.length, 0);
    });

    it("the webhook listener's /webhook/channels/<name>/… routes: 404 not_found for Object.prototype names", async () => {
      const mark = gatehouse.logs.length;
      const probes: [string, string][] = [];
      for (const name of ['__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf']) {
        probes.push(
          ['POST', `/webhook/channels/${name}`],
          ['POST', `/webhook/channels/${name}/pair/ABCDEFGH`],
          ['GET', `/webhook/channels/${name}/outbox`],
          ['GET', `/webhook/channels/${name}/oauth/callback?state=x`],
        );
      }
      probes.push(
        ['GET', '/webhook/channels/phone/constructor'],
        ['GET', '/webhook/channels/phone/__proto__'],
        ['POST', '/webhook/constructor'],
        ['POST', '/webhook/__proto__'],
      );
      const stored = await storedCount();
      for (const [method, p] of probes) {
        const reply = await request(hooks, p, {
          method,
          headers: { ...json, authorization: 'Bearer x' },
          body: method === 'POST' ? '{"deviceName":"x","text":"y"}' : undefined,
        });
        assert.equal(reply.status, 404, `${method} ${p}: ${reply.body}`);
        assert.deepEqual(reply.json(), notFound, `${method} ${p}`);
      }
      assert.equal(await storedCount(), stored);
      assert.deepEqual(unexpectedErrors(mark), []);
    });
  });

  describe('finding 11: nesting depth is bounded before parsing', () => {
    /** Posts `body` to the verified GitHub endpoint; asserts 400 invalid_json, nothing stored or delivered. */
    async function refused(send: () => Promise<Reply>, marker: string) {
      const stored = await storedCount();
      const reply = await send();
      assert.equal(reply.status, 400, reply.body);
      assert.equal(reply.json().error.code, 'invalid_json');
      assert.equal(reply.headers['retry-after'], undefined);
      assert.equal(await storedCount(), stored, 'nothing stored');
      assert.equal((await deliveredWith(marker)).length, 0, 'nothing delivered');
    }

    it('a verified ~98 KB body nested ~49k levels under a templated field: 400 invalid_json, not 503', async () => {
      const mark = gatehouse.logs.length;
      const body = nestedUnder('"sender":{"login":"deep-gh"},', 49_000);
      assert.ok(body.length > 97_000);
      await refused(() => githubPost(body, 'delivery-deep'), 'deep-gh');
      await refused(
        () =>
          post('/webhook/deploys', nestedUnder('"marker":"deep-secret",', 49_000), {
            'x-webhook-secret': DEPLOY_SECRET,
          }),
        'deep-secret',
      );
      assert.deepEqual(unexpectedErrors(mark), []);
    });

    it('64 levels (the default) are accepted and rendered; 65 are refused', async () => {
      // The top-level object is level 1: 63 arrays under it make 64.
      const ok = await githubPost(nestedUnder('"sender":{"login":"depth-64"},', 63), 'delivery-depth-64');
      assert.equal(ok.status, 202, ok.body);
      const got = await waitFor(() => target.received.find((r) => r.body.includes(ok.json().id)), {
        what: 'the 64-level event',
      });
      assert.equal(JSON.parse(got.body).message, `depth-64: ${'['.repeat(63)}${']'.repeat(63)}`);
      await refused(
        () => githubPost(nestedUnder('"sender":{"login":"depth-65"},', 64), 'delivery-depth-65'),
        'depth-65',
      );
    });

    it('brackets inside strings, escaped quotes and backslashes do not count', async () => {
      const deepText = `\\\\\\"${'[{'.repeat(500)}\\"`;
      const reply = await post('/webhook/deploys', `{"marker":"in-strings","data":"${deepText}","k\\"[[[":[[1]]}`, {
        'x-webhook-secret': DEPLOY_SECRET,
      });
      assert.equal(reply.status, 202, reply.body);
      const got = await waitFor(() => target.received.find((r) => r.body.includes(reply.json().id)), {
        what: 'the event with brackets in strings',
      });
      assert.equal(JSON.parse(got.body).payload.data, JSON.parse(`"${deepText}"`));
    });

    it('channel routes use the same reader: a deep device message and a deep pairing body are 400 invalid_json', async () => {
      const code = (await channelStore.createPairing('phone', 60_000, Date.now()))!;
      await refused(
        () => post(`/webhook/channels/phone/pair/${code}`, nestedUnder('"deviceName":"deep",', 5_000)),
        'deep',
      );
      const paired = await post(`/webhook/channels/phone/pair/${code}`, '{"deviceName":"Hardening phone"}');
      assert.equal(paired.status, 201, 'the refused body did not use up the pairing code');
      const token = paired.json().token as string;
      await refused(
        () =>
          post('/webhook/channels/phone', nestedUnder('"id":"m-deep","text":"deep-device",', 49_000), {
            authorization: `Bearer ${token}`,
          }),
        'deep-device',
      );
      const fine = await post('/webhook/channels/phone', '{"id":"m-ok","text":"shallow-device"}', {
        authorization: `Bearer ${token}`,
      });
      assert.equal(fine.status, 202, fine.body);
    });

    it("Pub/Sub push (the Gmail push route's verifier): a deep body is 400; deep JSON inside base64 data reaches the target as text", async () => {
      const mark = gatehouse.logs.length;
      const deepBody = nestedUnder(`"message":{"messageId":"m-deep-push"},`, 49_000);
      await refused(
        async () => post('/webhook/pubsub', deepBody, { authorization: `Bearer ${await googleToken()}` }),
        'm-deep-push',
      );

      const deepData = '['.repeat(40_000) + ']'.repeat(40_000);
      const push = {
        message: {
          data: Buffer.from(deepData).toString('base64'),
          messageId: 'm-deep-data',
          publishTime: '2026-01-01T00:00:00Z',
        },
        subscription: 'projects/p/subscriptions/s',
      };
      const reply = await post('/webhook/pubsub', JSON.stringify(push), {
        authorization: `Bearer ${await googleToken()}`,
      });
      assert.equal(reply.status, 202, reply.body);
      const got = await waitFor(() => target.received.find((r) => r.body.includes(reply.json().id)), {
        what: 'the push with deep data',
      });
      assert.equal(JSON.parse(got.body).payload.data, deepData, 'too deep to parse: delivered as the decoded text');

      const shallow = {
        ...push,
        message: { ...push.message, data: Buffer.from('{"n":[1]}').toString('base64'), messageId: 'm-shallow-data' },
      };
      const ok = await post('/webhook/pubsub', JSON.stringify(shallow), {
        authorization: `Bearer ${await googleToken()}`,
      });
      const delivered = await waitFor(() => target.received.find((r) => r.body.includes(ok.json().id)), {
        what: 'the push with shallow data',
      });
      assert.deepEqual(JSON.parse(delivered.body).payload.data, { n: [1] });
      assert.deepEqual(unexpectedErrors(mark), []);
    });
  });
});

describe('webhooks.maxJsonDepth', () => {
  it('a configured depth applies to every endpoint', async () => {
    const [upstream, target] = await Promise.all([startRecordingUpstream(), startRecordingUpstream()]);
    const gatehouse = await startTestGatehouse(hardeningConfig(upstream.url, target.url, { maxJsonDepth: 3 }));
    try {
      const send = (body: string) =>
        request(gatehouse.webhooks!.url, '/webhook/deploys', {
          method: 'POST',
          body,
          headers: { ...json, 'x-webhook-secret': DEPLOY_SECRET },
        });
      assert.equal((await send('{"data":[[1]]}')).status, 202);
      const deep = await send('{"data":[[[1]]]}');
      assert.equal(deep.status, 400);
      assert.equal(deep.json().error.code, 'invalid_json');
    } finally {
      await gatehouse.close();
      await Promise.all([upstream.close(), target.close()]);
    }
  });
});
