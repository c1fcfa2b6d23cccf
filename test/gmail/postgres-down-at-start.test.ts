/**
 * Gmail push on PostgreSQL when the database is down at start (issue 28): gatehouse starts, the
 * Gmail push route answers 503 (Pub/Sub redelivers), and once the database is back Gmail starts
 * without a restart and the email reaches the target once. A real cluster, stopped by the test.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { startFakeGoogle, type FakeGoogle, type StoredEmail } from '../helpers/fake-google.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';
import { PUSH_SERVICE_ACCOUNT, runSetup, webhooksWith, workspace, type Workspace } from './helpers.js';
import { startFanOut, writePostgresConfig } from './postgres-helpers.js';

const cluster = await startPostgres();
const skip = 'skip' in cluster ? cluster.skip : false;
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

describe('gmail push on postgres, the database down at start', { skip, timeout: 180_000 }, () => {
  let fake: FakeGoogle;
  let ws: Workspace;
  let target: RecordingServer;
  let fan: Awaited<ReturnType<typeof startFanOut>>;
  let server: ServerProcess | undefined;

  const deliveries = (mail: StoredEmail) => target.received.filter((r) => JSON.parse(r.body).payload?.id === mail.id);

  before(async () => {
    const url = await (cluster as PostgresCluster).createDatabase();
    // Pub/Sub keeps redelivering for two minutes: longer than the database is down here.
    fake = await startFakeGoogle({ timing: { pushMinBackoffMs: 100, pushMaxBackoffMs: 500, pushMaxAttempts: 300 } });
    target = await startRecordingUpstream();
    fan = await startFanOut();
    ws = workspace();
    ws.env = { ...ws.env, TEST_DATABASE_URL: url };
    writePostgresConfig(ws);
    const setup = await runSetup(fake, ws, [
      '--credentials',
      ws.credentials,
      '--json',
      '--push-endpoint',
      `${fan.url}/webhook/gmail`,
      '--push-service-account',
      PUSH_SERVICE_ACCOUNT,
    ]);
    assert.equal(setup.code, 0, setup.stderr);
    writePostgresConfig(ws, webhooksWith(JSON.parse(setup.stdout).section, target.url));
  });
  after(async () => {
    await server?.stop();
    await fan?.close();
    await target?.close();
    await fake?.close();
  });

  it('pushes get 503 while it is down; Gmail starts once it is back and the email is delivered once', async (t) => {
    const pgc = cluster as PostgresCluster;
    await pgc.stop();
    let up = false;
    t.after(async () => {
      if (!up) await pgc.start();
    });
    server = startServerProcess(ws.config, { env: ws.env });
    const hooks = await server.waitFor((l) => l.msg === 'webhook receiver listening', 45_000);
    fan.targets = [hooks.url as string];
    const mail = fake.addEmail({ from: 'Bob <bob@example.com>', subject: 'While down', text: 'body' });
    await waitFor(() => fan.answers.some((a) => a[0] === 503), { timeoutMs: 30_000, what: 'a push answered 503' });
    assert.equal(deliveries(mail).length, 0);
    assert.ok(!server.lines.some((l) => l.msg === 'gmail integration running'), 'Gmail ran without its database');

    await pgc.start();
    up = true;
    await server.waitFor((l) => l.msg === 'Gmail started: the database is reached', 90_000);
    await waitFor(() => deliveries(mail).length > 0, { timeoutMs: 60_000, what: 'the email delivered' });
    assert.equal(deliveries(mail).length, 1);
    assert.ok(
      fan.answers.some((a) => a[0]! >= 200 && a[0]! < 300),
      'a push was acknowledged once Gmail ran',
    );
  });
});
