import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import pg from 'pg';
import type { PostgresStorageConfig } from '../../src/config/schema.js';
import { PostgresChannelStore } from '../../src/storage/postgres/channels.js';
import { PostgresEventStore } from '../../src/storage/postgres/events.js';
import { PostgresGmailStore } from '../../src/storage/postgres/gmail.js';
import { SqliteChannelStore } from '../../src/storage/sqlite/channels.js';
import { SqliteEventStore } from '../../src/storage/sqlite/events.js';
import { SqliteGmailStore } from '../../src/storage/sqlite/gmail.js';
import { request } from '../helpers/http.js';
import { startTestGatehouse, testConfig } from '../helpers/gatehouse.js';
import { postgresDatabases, type PostgresDatabases } from '../helpers/postgres.js';
import { runCli } from '../helpers/process.js';
import { waitFor } from '../helpers/wait.js';

// `gatehouse storage copy`: an SQLite store into an empty PostgreSQL database, on the run's cluster (or one of this file's own).
const cluster = await postgresDatabases();
const skip = 'skip' in cluster ? cluster.skip : false;
const pgc = () => cluster as PostgresDatabases;
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

const SECRET = 's'.repeat(24);
const ENDPOINT = '/webhook/deploys';
const storage = (url: string): PostgresStorageConfig => ({ driver: 'postgres', url, pool: { max: 3 } });

/** A target answering 200 and recording the event ids it got. */
async function startTarget(): Promise<{ url: string; ids: string[]; close(): Promise<void> }> {
  const ids: string[] = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => {
      ids.push(JSON.parse(body).id);
      res.end('ok');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    ids,
    close: () =>
      new Promise<void>((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

/** A folder with a config whose storage is `dbFile` (SQLite) and one webhook endpoint to `targetUrl`. */
function sqliteSetup(targetUrl = 'http://127.0.0.1:1'): {
  dir: string;
  dbFile: string;
  configFile: string;
  raw: Record<string, any>;
} {
  const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-copy-'));
  const dbFile = path.join(dir, 'gatehouse.db');
  const raw = testConfig('http://127.0.0.1:1', {
    storage: { path: dbFile },
    webhooks: {
      enabled: true,
      listen: { host: '127.0.0.1', port: 0 },
      endpoints: [{ path: ENDPOINT, secret: SECRET, action: 'system-event' }],
      targets: { 'system-event': { url: targetUrl } },
    },
  });
  const configFile = path.join(dir, 'gateway.json5');
  writeFileSync(configFile, JSON.stringify(raw));
  return { dir, dbFile, configFile, raw };
}

/**
 * An SQLite store as a server leaves it: queued events (fresh, and after failed attempts, due
 * now), delivered ones (one after a retry) and dead ones, with delivery ids and replay keys.
 */
async function seed(dbFile: string) {
  const store = new SqliteEventStore(dbFile);
  const now = Date.now();
  let n = 0;
  const accept = async (idempotencyKey?: string, replayKey?: string) => {
    const at = now - 60_000 + n++ * 10;
    return (
      await store.accept({
        endpoint: ENDPOINT,
        action: 'system-event',
        idempotencyKey,
        replayKey,
        receivedAt: at,
        envelope: (id) => JSON.stringify({ id, n }),
        // Received headers on every other event (the rest as stored before schema 3: none).
        ...(n % 2 === 0 && { headers: JSON.stringify({ 'x-n': String(n), 'x-webhook-secret': '[redacted]' }) }),
      })
    ).id;
  };
  const fail = (id: string, attempt: number, status: number | null, error: string | null, nextAttemptAt: number) =>
    store.recordAttempt(
      id,
      {
        attempt,
        at: now - 50_000 + attempt,
        status,
        error,
        durationMs: 7,
        responseSnippet: status === null ? null : `busy ${status}`,
      },
      { status: 'queued', nextAttemptAt },
    );
  try {
    const queued = [await accept('q-0'), await accept('q-1'), await accept(undefined, 'sig-q-2')];
    await fail(queued[1]!, 1, 503, null, now - 1_000);
    await fail(queued[2]!, 1, null, 'ECONNREFUSED', now - 2_000);
    await fail(queued[2]!, 2, 500, null, now - 500);
    const delivered = [await accept('d-0'), await accept(undefined, 'sig-d-1')];
    await fail(delivered[0]!, 1, 503, null, now - 40_000);
    await store.recordAttempt(
      delivered[0]!,
      { attempt: 2, at: now - 30_000, status: 200, error: null, durationMs: 12 },
      { status: 'delivered' },
    );
    await store.recordAttempt(
      delivered[1]!,
      { attempt: 1, at: now - 30_000, status: 204, error: null, durationMs: 3 },
      { status: 'delivered' },
    );
    const dead = [await accept('x-0'), await accept()];
    for (const id of dead) {
      await fail(id, 1, 502, null, now - 45_000);
      await store.recordAttempt(
        id,
        { attempt: 2, at: now - 20_000, status: 410, error: null, durationMs: 5 },
        { status: 'dead' },
      );
    }
    return { queued, delivered, dead, all: [...queued, ...delivered, ...dead] };
  } finally {
    await store.close();
  }
}

async function hasSchema(url: string): Promise<boolean> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query("SELECT to_regclass('events') IS NOT NULL AS there")).rows[0].there;
  } finally {
    await client.end();
  }
}

describe('gatehouse storage copy: SQLite into PostgreSQL', { skip, timeout: 180_000 }, () => {
  it('copies events with their attempts and keys exactly; a server on postgres delivers the queued ones and dedupes delivery ids seen before', async (t) => {
    const target = await startTarget();
    t.after(() => target.close());
    const { dbFile, configFile, raw } = sqliteSetup(target.url);
    const seeded = await seed(dbFile);
    const url = await pgc().createDatabase();

    const copy = await runCli(['storage', 'copy', '--to', url, '--config', configFile, '--json']);
    assert.equal(copy.code, 0, copy.stderr);
    const report = JSON.parse(copy.stdout);
    const { from, to, schemaVersion, ...counts } = report;
    assert.equal(from, dbFile);
    assert.equal(to, url);
    assert.ok(schemaVersion >= 1, `schema version ${schemaVersion}`);
    assert.deepEqual(counts, {
      events: 7,
      byStatus: { queued: 3, delivered: 2, dead: 2 },
      attempts: 10,
      idempotencyKeys: 4,
      replayKeys: 2,
      gmail: { accounts: 0, seenIds: 0 },
      channels: { grants: 0, devices: 0, pairings: 0, outbox: 0, oauthRequests: 0 },
    });

    // Every row as it was: status, attempt counts, next attempt, last error, delivered time, keys, attempts.
    const source = new SqliteEventStore(dbFile, { mustExist: true });
    const copied = await PostgresEventStore.open(storage(url));
    try {
      for (const id of seeded.all) assert.deepEqual(await copied.get(id), await source.get(id), id);
      // Headers and response snippets came along (and nulls stayed null).
      const [withHeaders, without] = [await copied.get(seeded.queued[1]!), await copied.get(seeded.queued[0]!)];
      assert.equal(withHeaders?.headers, JSON.stringify({ 'x-n': '2', 'x-webhook-secret': '[redacted]' }));
      assert.equal(without?.headers, null);
      assert.deepEqual(
        withHeaders?.attempts.map((a) => a.responseSnippet),
        ['busy 503'],
      );
      assert.equal((await copied.list({ limit: 100 })).length, seeded.all.length);
      // Replay keys came along: the same signed request is still a duplicate.
      const replay = await copied.accept({
        endpoint: ENDPOINT,
        action: 'system-event',
        idempotencyKey: 'new-id',
        replayKey: 'sig-d-1',
        receivedAt: Date.now(),
        envelope: (id) => JSON.stringify({ id }),
      });
      assert.deepEqual(replay, { id: seeded.delivered[1], duplicate: true });
    } finally {
      await source.close();
      await copied.close();
    }

    // `storage status` on postgres shows what the SQLite store had.
    const pgConfigFile = configFile.replace(/\.json5$/, '.pg.json5');
    writeFileSync(
      pgConfigFile,
      JSON.stringify({ ...raw, storage: { driver: 'postgres', url: '${TEST_DATABASE_URL}' } }),
    );
    const status = await runCli(['storage', 'status', '--config', pgConfigFile, '--json'], {
      env: { TEST_DATABASE_URL: url },
    });
    assert.equal(status.code, 0, status.stderr);
    assert.deepEqual(JSON.parse(status.stdout).counts, { queued: 3, delivered: 2, dead: 2 });

    // A server on postgres delivers the queued events (and only those), and a delivery id accepted before the copy is a duplicate.
    const gatehouse = await startTestGatehouse({ ...raw, storage: { driver: 'postgres', url } });
    try {
      await waitFor(() => seeded.queued.every((id) => target.ids.includes(id)), {
        timeoutMs: 15_000,
        what: 'the queued events delivered',
      });
      const reply = await request(gatehouse.webhooks!.url, ENDPOINT, {
        method: 'POST',
        body: '{"v":2}',
        headers: { 'content-type': 'application/json', 'x-webhook-secret': SECRET, 'idempotency-key': 'd-0' },
      });
      assert.equal(reply.status, 200, reply.body);
      assert.deepEqual(JSON.parse(reply.body), { id: seeded.delivered[0], status: 'duplicate' });
      const store = await PostgresEventStore.open(storage(url));
      try {
        await waitFor(async () => (await store.status(Date.now())).counts.delivered === 5, {
          timeoutMs: 15_000,
          what: 'the outcomes committed',
        });
        const retried = await store.get(seeded.queued[2]!);
        assert.deepEqual(
          retried?.attempts.map((a) => [a.attempt, a.status]),
          [
            [1, null],
            [2, 500],
            [3, 200],
          ],
          'attempt numbering goes on from the copied ones',
        );
        assert.deepEqual((await store.status(Date.now())).counts, { queued: 0, delivered: 5, dead: 2 });
      } finally {
        await store.close();
      }
      assert.deepEqual(
        [...target.ids].sort(),
        [...seeded.queued].sort(),
        'each queued event once; delivered and dead ones not again',
      );
    } finally {
      await gatehouse.close();
    }
  });

  it('refuses a target that is not empty, naming what is there, and changes nothing', async () => {
    const { dbFile, configFile } = sqliteSetup();
    await seed(dbFile);
    const url = await pgc().createDatabase();
    const existing = await PostgresEventStore.open(storage(url), { migrate: true });
    try {
      const { id } = await existing.accept({
        endpoint: ENDPOINT,
        action: 'system-event',
        receivedAt: Date.now(),
        envelope: (eventId) => JSON.stringify({ id: eventId }),
      });
      const copy = await runCli(['storage', 'copy', '--to', url, '--config', configFile]);
      assert.equal(copy.code, 1);
      assert.equal(copy.stdout, '');
      assert.match(
        copy.stderr,
        /^gatehouse: the target postgres:\/\/\S+ is not empty \(it holds 1 event\): storage copy only writes into an empty schema\n$/,
      );
      assert.deepEqual(
        (await existing.list({ limit: 100 })).map((e) => e.id),
        [id],
      );
    } finally {
      await existing.close();
    }
  });

  it('refuses while a server holds the SQLite file, before touching the target', async () => {
    const { dbFile, configFile, raw } = sqliteSetup();
    await seed(dbFile);
    const url = await pgc().createDatabase();
    const gatehouse = await startTestGatehouse(raw); // takes the file's writer lock
    try {
      const copy = await runCli(['storage', 'copy', '--to', url, '--config', configFile, '--json']);
      assert.equal(copy.code, 1);
      assert.equal(copy.stdout, '');
      assert.match(
        copy.stderr,
        new RegExp(
          `^gatehouse: \\S+ is in use by a gatehouse server \\(pid ${process.pid}\\): stop it first, so that no event is accepted there once the copy has started\\n$`,
        ),
      );
      assert.equal(await hasSchema(url), false, 'the target was not even migrated');
    } finally {
      await gatehouse.close();
    }
  });

  it('copies Gmail and channel state with the events: the postgres stores answer as the SQLite ones did', async () => {
    const { dbFile, configFile } = sqliteSetup();
    const now = Date.now();
    const events = new SqliteEventStore(dbFile);
    const gmail = new SqliteGmailStore(events);
    await gmail.saveGrant('me@example.com', 'client-id', 'sealed-grant', 'project');
    await gmail.recordWatch('me@example.com', '100', now + 86_400_000, now);
    const email = (id: string) => ({
      messageId: id,
      event: {
        endpoint: 'gmail:me@example.com',
        action: 'message' as const,
        idempotencyKey: id,
        receivedAt: now,
        envelope: (eventId: string) => JSON.stringify({ id: eventId, m: id }),
      },
    });
    assert.equal(await gmail.commitEmails('me@example.com', [email('m-1'), email('m-2')], '120', now), 2);
    const gmailBefore = await gmail.get('me@example.com');
    await events.close();
    const channels = new SqliteChannelStore(dbFile);
    await channels.saveGrant(
      { name: 'tg', kind: 'bot-token', sealed: 'sealed-tg', details: { botId: 7 }, expiresAt: null },
      now,
    );
    const code = (await channels.createPairing('phone', 600_000, now))!;
    const pending = (await channels.createPairing('phone', 600_000, now))!;
    const paired = await channels.pair('phone', code, 'Ana phone', now);
    assert.ok(paired.ok);
    const first = await channels.enqueueForDevice('phone', paired.device.id, 'one', now);
    await channels.enqueueForDevice('phone', paired.device.id, 'two', now);
    assert.deepEqual(
      (await channels.takeOutbox(paired.device.id, 1, now)).map((m) => m.id),
      [first],
    );
    await channels.createOAuthRequest('slack', 'the-state', 600_000, now);
    const devicesBefore = await channels.devices('phone');
    await channels.close();

    const url = await pgc().createDatabase();
    const copy = await runCli(['storage', 'copy', '--to', url, '--config', configFile, '--json']);
    assert.equal(copy.code, 0, copy.stderr);
    const report = JSON.parse(copy.stdout);
    assert.equal(report.events, 2, 'the emails enqueued are events like any other');
    assert.deepEqual(report.gmail, { accounts: 1, seenIds: 2 });
    assert.deepEqual(report.channels, { grants: 1, devices: 1, pairings: 2, outbox: 2, oauthRequests: 1 });

    const eventsPg = await PostgresEventStore.open(storage(url));
    const channelsPg = await PostgresChannelStore.open(storage(url));
    try {
      const gmailPg = new PostgresGmailStore(eventsPg);
      assert.deepEqual(await gmailPg.get('me@example.com'), gmailBefore);
      assert.deepEqual([...(await gmailPg.seen('me@example.com', ['m-1', 'm-2', 'm-3']))].sort(), ['m-1', 'm-2']);
      assert.equal(
        await gmailPg.commitEmails('me@example.com', [email('m-2'), email('m-3')], '130', now),
        1,
        'a remembered message id is not enqueued again',
      );

      assert.deepEqual((await channelsPg.grant('tg'))?.details, { botId: 7 });
      assert.deepEqual(await channelsPg.devices('phone'), devicesBefore);
      assert.deepEqual(
        (await channelsPg.deviceByToken('phone', paired.token, now))?.id,
        paired.device.id,
        'the device token still opens',
      );
      assert.deepEqual(
        (await channelsPg.takeOutbox(paired.device.id, 10, now)).map((m) => m.text),
        ['two'],
        'a message fetched before the copy is not handed over again',
      );
      assert.ok(
        (await channelsPg.enqueueForDevice('phone', paired.device.id, 'three', now)) > first + 1,
        'outbox ids go on after the copied ones',
      );
      assert.deepEqual(await channelsPg.pair('phone', code, 'Again', now), { ok: false, reason: 'used' });
      assert.equal((await channelsPg.pair('phone', pending, 'Tablet', now)).ok, true, 'a pending code still pairs');
      assert.equal(await channelsPg.answerOAuthRequest('slack', 'the-state', 'sealed-answer', now), true);
      assert.equal(await channelsPg.takeOAuthAnswer('the-state', now), 'sealed-answer');
    } finally {
      await channelsPg.close();
      await eventsPg.close();
    }
  });

  it('refuses a target already holding channel state, and copies nothing', async () => {
    const { dbFile, configFile } = sqliteSetup();
    await seed(dbFile);
    const url = await pgc().createDatabase();
    const existing = await PostgresChannelStore.open(storage(url), { migrate: true });
    try {
      await existing.saveGrant(
        { name: 'tg', kind: 'bot-token', sealed: 'x', details: {}, expiresAt: null },
        Date.now(),
      );
      const copy = await runCli(['storage', 'copy', '--to', url, '--config', configFile]);
      assert.equal(copy.code, 1);
      assert.match(
        copy.stderr,
        /^gatehouse: the target postgres:\/\/\S+ is not empty \(it holds 1 channel row\): storage copy only writes into an empty schema\n$/,
      );
      const events = await PostgresEventStore.open(storage(url));
      try {
        assert.equal(
          (await events.list({ limit: 10 })).length,
          0,
          'the events copied before the refusal were rolled back',
        );
      } finally {
        await events.close();
      }
    } finally {
      await existing.close();
    }
  });
});
