/**
 * Gmail push on storage.driver "postgres", end to end with real processes: `setup` stores the
 * grant and cursor in PostgreSQL; two `gatehouse start` instances share the database; every push
 * of the fake's Pub/Sub is handed to both instances at once (as a redelivery to another instance
 * would be). Each email reaches the target once, the cursor and counters say so, and `gmail
 * status` reads them from PostgreSQL.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { setTimeout as sleep } from 'node:timers/promises';
import { startFakeGoogle, type FakeGoogle, type StoredEmail } from '../helpers/fake-google.js';
import { postgresDatabases, type PostgresDatabases } from '../helpers/postgres.js';
import { runCli, startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';
import {
  ACCOUNT,
  ENDPOINT,
  PUSH_SERVICE_ACCOUNT,
  runSetup,
  webhooksWith,
  workspace,
  type Workspace,
} from './helpers.js';
import { startFanOut, writePostgresConfig } from './postgres-helpers.js';

const cluster = await postgresDatabases();
const skip = 'skip' in cluster ? cluster.skip : false;
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

describe(
  'gmail push on postgres: two instances, every notification to both at once',
  { skip, timeout: 180_000 },
  () => {
    let fake: FakeGoogle;
    let ws: Workspace;
    let target: RecordingServer;
    let fan: Awaited<ReturnType<typeof startFanOut>>;
    const servers: ServerProcess[] = [];
    let url: string;

    const deliveries = (mail: StoredEmail) => target.received.filter((r) => JSON.parse(r.body).payload?.id === mail.id);

    before(async () => {
      url = await (cluster as PostgresDatabases).createDatabase();
      fake = await startFakeGoogle({ timing: { pushMinBackoffMs: 50, pushMaxBackoffMs: 300, pushMaxAttempts: 60 } });
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
      for (let i = 0; i < 2; i++) servers.push(startServerProcess(ws.config, { env: ws.env }));
      const hooks = await Promise.all(
        servers.map((s) => s.waitFor((l) => l.msg === 'webhook receiver listening', 30_000)),
      );
      await Promise.all(servers.map((s) => s.waitFor((l) => l.msg === 'gmail integration running', 30_000)));
      fan.targets = hooks.map((l) => l.url as string);
    });
    after(async () => {
      await Promise.all(servers.map((s) => s.stop()));
      await fan?.close();
      await target?.close();
      await fake?.close();
    });

    it('setup stored the grant and the cursor in PostgreSQL (gmail status reads them there)', async () => {
      const run = await runCli(['webhooks', 'gmail', 'status', '--json', '--config', ws.config], { env: ws.env });
      assert.equal(run.code, 0, run.stderr);
      const status = JSON.parse(run.stdout);
      assert.equal(status.account, ACCOUNT);
      assert.match(status.cursor, /^\d+$/);
      assert.equal(status.watchActive, true);
      assert.equal(status.sealedGrant, undefined);
    });

    it('each email reaches the target exactly once, though both instances got every notification at once', async () => {
      const mails: StoredEmail[] = [];
      for (let i = 0; i < 6; i++) {
        mails.push(fake.addEmail({ from: 'Bob <bob@example.com>', subject: `Report ${i}`, text: `body ${i}` }));
        if (i % 2 === 1) await sleep(50); // some notifications alone, some close together
      }
      for (const mail of mails)
        await waitFor(() => deliveries(mail).length > 0, { what: `delivery of ${mail.subject}` });
      // A second delivery would come from a second stored event: wait until every stored event is settled.
      await waitFor(
        async () => {
          const client = new pg.Client({ connectionString: url });
          await client.connect();
          try {
            return (
              Number((await client.query("SELECT count(*) AS n FROM events WHERE status = 'queued'")).rows[0].n) === 0
            );
          } finally {
            await client.end();
          }
        },
        { what: 'every stored event settled' },
      );
      for (const mail of mails)
        assert.equal(deliveries(mail).length, 1, `${mail.subject} delivered ${deliveries(mail).length} times`);
      // A push is recorded once both instances answered it: the first to fetch can deliver before the
      // other answers (it waits on the same history), so under load the record may still be coming.
      await waitFor(() => fan.answers.length >= 1, { what: 'a push answered by both instances' });
      assert.ok(
        fan.answers.length >= 1 && fan.answers.every((a) => a.length === 2),
        'every push went to both instances',
      );
      assert.ok(target.received.every((r) => JSON.parse(r.body).endpoint === ENDPOINT));

      const run = await runCli(['webhooks', 'gmail', 'status', '--json', '--config', ws.config], { env: ws.env });
      assert.equal(run.code, 0, run.stderr);
      const status = JSON.parse(run.stdout);
      assert.equal(status.emailsEnqueued, mails.length);
      assert.equal(
        BigInt(status.cursor) >= BigInt(mails[mails.length - 1]!.historyId),
        true,
        'the cursor moved past the last email',
      );
    });
  },
);
