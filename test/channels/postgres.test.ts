/**
 * A qr channel on storage.driver "postgres", end to end with real processes: two `gatehouse
 * start` instances on one database. `channels login` (the CLI on postgres) prints a pairing code;
 * the device pairs on the other instance, and the login sees it; the device's message, posted
 * to either instance, reaches the target once; messages sent through one gateway wait in the
 * outbox, and the device polling both instances at once gets each exactly once.
 */
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { request } from '../helpers/http.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { startServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';
import {
  API_KEY,
  channelsCli,
  envelopes,
  nthEnvelope,
  removeWorkspace,
  settledEnvelopeCount,
  startLogin,
  workspace,
  type RunningGatehouse,
  type Workspace,
} from './helpers.js';

const cluster = await startPostgres();
const skip = 'skip' in cluster ? cluster.skip : false;
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

const json = { 'content-type': 'application/json' };

/** The workspace's config on postgres (the URL from the environment, as in production). */
function writePostgresConfig(ws: Workspace, targetUrl: string, upstreamUrl: string): void {
  writeFileSync(
    ws.config,
    JSON.stringify(
      {
        storage: { driver: 'postgres', url: '${TEST_DATABASE_URL}', pool: { max: 4 } },
        log: { level: 'info' },
        gateway: {
          listen: { host: '127.0.0.1', port: 0 },
          upstream: { target: upstreamUrl },
          auth: { apiKey: API_KEY, failures: { max: 10, windowSeconds: 60, lockoutSeconds: 60 } },
        },
        webhooks: {
          enabled: true,
          listen: { host: '127.0.0.1', port: ws.webhookPort },
          targets: { message: { url: `${targetUrl}/messages` } },
          delivery: { initialBackoffMs: 50, maxBackoffMs: 200, timeoutMs: 2_000 },
        },
        channels: { phone: { kind: 'qr', action: 'message' } },
      },
      null,
      2,
    ),
  );
}

async function startInstance(ws: Workspace): Promise<RunningGatehouse> {
  const server = startServerProcess(ws.config, { env: ws.env });
  try {
    const [gateway, webhooks] = await Promise.all([
      server.waitFor((l) => l.msg === 'gateway listening', 30_000),
      server.waitFor((l) => l.msg === 'webhook receiver listening', 30_000),
    ]);
    return {
      process: server,
      gatewayUrl: gateway.url,
      webhookUrl: webhooks.url,
      stop: async () => void (await server.stop()),
    };
  } catch (err) {
    await server.stop('SIGKILL');
    throw err;
  }
}

describe('qr channel on postgres: two instances, one database', { skip, timeout: 120_000 }, () => {
  let a: Workspace;
  let b: Workspace;
  let target: RecordingServer;
  let upstream: RecordingServer;
  const instances: RunningGatehouse[] = [];
  let device: { id: string; token: string };
  let url: string;
  /** Events the database holds as queued (not yet delivered, nor dead). */
  const queued = async () => {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      return Number((await client.query("SELECT count(*) AS n FROM events WHERE status = 'queued'")).rows[0].n);
    } finally {
      await client.end();
    }
  };

  before(async () => {
    url = await (cluster as PostgresCluster).createDatabase();
    [target, upstream, a, b] = await Promise.all([
      startRecordingUpstream(),
      startRecordingUpstream(),
      workspace('pg-a'),
      workspace('pg-b'),
    ]);
    b.env = a.env = { GATEHOUSE_SECRET_KEY: a.key, TEST_DATABASE_URL: url }; // one key, one database
    writePostgresConfig(a, target.url, upstream.url);
    writePostgresConfig(b, target.url, upstream.url);
    instances.push(await startInstance(a), await startInstance(b));
  });
  after(async () => {
    await Promise.all(instances.map((i) => i.stop()));
    await Promise.all([target?.close(), upstream?.close()]);
    removeWorkspace(a);
    removeWorkspace(b);
  });

  it('login on postgres; the device pairs on the other instance, once; the login sees it', async () => {
    const login = startLogin(a, 'phone');
    const [, code] = await login.waitForOutput(/\n {2}http:\/\/\S+\/pair\/(\S+)\npairing code: /, 30_000);
    const pair = (instance: RunningGatehouse, deviceName: string) =>
      request(instance.webhookUrl, `/webhook/channels/phone/pair/${code}`, {
        method: 'POST',
        headers: json,
        body: JSON.stringify({ deviceName }),
      });
    const [first, second] = await Promise.all([
      pair(instances[1]!, 'Ana phone'),
      pair(instances[0]!, 'Mallory laptop'),
    ]);
    const statuses = [first.status, second.status].sort();
    assert.deepEqual(statuses, [201, 410], `one pairing, one refusal: ${first.body} ${second.body}`);
    const paired = first.status === 201 ? first : second;
    device = { id: paired.json().deviceId, token: paired.json().token };
    const done = await login.exited;
    assert.equal(done.code, 0, done.stderr);
    assert.match(done.stdout, /✓ pair\s+paired: (Ana phone|Mallory laptop) \(dev_/);

    const listed = await channelsCli(b, ['devices', 'phone', '--json']);
    assert.equal(listed.code, 0, listed.stderr);
    assert.deepEqual(
      JSON.parse(listed.stdout).map((d: { id: string }) => d.id),
      [device.id],
    );
  });

  it("the device's message reaches the target once, whichever instance gets it (the resend to the other is a duplicate)", async () => {
    const body = { id: 'm-1', text: 'hello over postgres' };
    const post = (instance: RunningGatehouse) =>
      request(instance.webhookUrl, '/webhook/channels/phone', {
        method: 'POST',
        headers: { ...json, authorization: `Bearer ${device.token}` },
        body: JSON.stringify(body),
      });
    const sent = await post(instances[0]!);
    assert.equal(sent.status, 202, sent.body);
    const resent = await post(instances[1]!);
    assert.equal(resent.status, 200, resent.body);
    assert.deepEqual(resent.json(), { id: sent.json().id, status: 'duplicate' });
    const envelope = await nthEnvelope(target, 1);
    assert.deepEqual(envelope.from, { deviceId: device.id, deviceName: envelope.from.deviceName });
    assert.equal(envelope.text, 'hello over postgres');
    assert.equal(await settledEnvelopeCount(target, queued), 1);
    assert.equal(envelopes(target)[0]!.id, sent.json().id);
  });

  it('messages sent through one gateway wait in the outbox; the device polling both instances at once gets each exactly once', async () => {
    const texts = Array.from({ length: 12 }, (_, i) => `reply ${i}`);
    for (const text of texts) {
      const reply = await request(instances[1]!.gatewayUrl, '/_gatehouse/channels/phone/messages', {
        method: 'POST',
        headers: { ...json, 'x-api-key': API_KEY },
        body: JSON.stringify({ to: device.id, text }),
      });
      assert.equal(reply.status, 200, reply.body);
    }
    const poll = (instance: RunningGatehouse) =>
      request(instance.webhookUrl, '/webhook/channels/phone/outbox', {
        headers: { authorization: `Bearer ${device.token}` },
      });
    const got: string[] = [];
    for (let round = 0; round < 10 && got.length < texts.length; round++) {
      const replies = await Promise.all([
        poll(instances[0]!),
        poll(instances[1]!),
        poll(instances[0]!),
        poll(instances[1]!),
      ]);
      for (const reply of replies) {
        assert.equal(reply.status, 200, reply.body);
        got.push(...reply.json().messages.map((m: { text: string }) => m.text));
      }
    }
    assert.deepEqual([...got].sort(), [...texts].sort(), 'each message once');
    assert.deepEqual((await poll(instances[0]!)).json().messages, []);
  });

  it("PostgreSQL down: the device's message, its outbox and pairing answer 503 (never a 2xx, never a 401 that counts), and work again once it is back", async () => {
    const before = envelopes(target).length;
    const message = (id: string) =>
      request(instances[0]!.webhookUrl, '/webhook/channels/phone', {
        method: 'POST',
        headers: { ...json, authorization: `Bearer ${device.token}` },
        body: JSON.stringify({ id, text: 'during the outage' }),
      });
    await (cluster as PostgresCluster).stop();
    try {
      const sent = await message('m-outage');
      assert.equal(sent.status, 503, sent.body);
      const outbox = await request(instances[1]!.webhookUrl, '/webhook/channels/phone/outbox', {
        headers: { authorization: `Bearer ${device.token}` },
      });
      assert.equal(outbox.status, 503, outbox.body);
      assert.equal(outbox.json().error.code, 'store_unavailable');
      const pairing = await request(instances[1]!.webhookUrl, '/webhook/channels/phone/pair/ABCDEFGH', {
        method: 'POST',
        headers: json,
        body: '{"deviceName":"x"}',
      });
      assert.equal(pairing.status, 503, pairing.body);
      const send = await request(instances[0]!.gatewayUrl, '/_gatehouse/channels/phone/messages', {
        method: 'POST',
        headers: { ...json, 'x-api-key': API_KEY },
        body: JSON.stringify({ to: device.id, text: 'x' }),
      });
      assert.equal(send.status, 503, send.body);
    } finally {
      await (cluster as PostgresCluster).start();
    }
    let last: Awaited<ReturnType<typeof message>> | undefined;
    await waitFor(async () => (last = await message('m-outage')).status === 202, {
      intervalMs: 200,
      what: () => `a 202 for the message once PostgreSQL is back (last: ${last?.status} ${last?.body})`,
    });
    assert.equal((await nthEnvelope(target, before + 1)).payload.id, 'm-outage');
  });
});
