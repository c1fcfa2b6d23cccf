import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, it } from 'node:test';
import Database from 'better-sqlite3';
import { PURGE_CHUNK_SQL, PURGE_RECENT_PAGE_SQL, SqliteEventStore } from '../../src/storage/sqlite/events.js';
import { acquireWriterLock } from '../../src/storage/sqlite/writer-lock.js';
import { UsageError } from '../../src/errors.js';
import { ROOT } from '../helpers/process.js';
import { event, eventStoreContract, T0 } from './store-contract.js';

/** The schema as the version before replay keys created it: such files must still open. */
const PREVIOUS_SCHEMA = `
CREATE TABLE events (
  id              TEXT PRIMARY KEY,
  endpoint        TEXT NOT NULL,
  action          TEXT NOT NULL,
  idempotency_key TEXT,
  received_at     INTEGER NOT NULL,
  envelope        TEXT NOT NULL,
  status          TEXT NOT NULL CHECK (status IN ('queued', 'delivered', 'dead')),
  attempts        INTEGER NOT NULL DEFAULT 0,
  round_attempts  INTEGER NOT NULL DEFAULT 0,
  next_attempt_at INTEGER NOT NULL,
  last_error      TEXT,
  delivered_at    INTEGER
);
CREATE UNIQUE INDEX events_idempotency ON events (endpoint, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_due ON events (status, action, next_attempt_at, id);
CREATE INDEX events_next ON events (status, next_attempt_at, id);
CREATE TABLE attempts (
  event_id    TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
  attempt     INTEGER NOT NULL,
  at          INTEGER NOT NULL,
  status      INTEGER,
  error       TEXT,
  duration_ms INTEGER NOT NULL,
  PRIMARY KEY (event_id, attempt)
);
`;

describe('SqliteEventStore: the EventStore contract', () => {
  let dir: string;
  let file: string;
  const connections: Database.Database[] = [];
  const count = (sql: string, ...params: unknown[]) => {
    const db = new Database(file, { readonly: true });
    connections.push(db);
    return (db.prepare(sql).get(...params) as { n: number }).n;
  };
  eventStoreContract({
    driver: 'sqlite',
    async open() {
      dir = mkdtempSync(path.join(os.tmpdir(), 'gatehouse-store-'));
      file = path.join(dir, 'nested', 'events.db');
      return new SqliteEventStore(file);
    },
    async other() {
      return new SqliteEventStore(file);
    },
    async countReplayKeys() {
      return count('SELECT COUNT(*) AS n FROM event_replay_keys');
    },
    async countAttempts(id) {
      return count('SELECT COUNT(*) AS n FROM attempts WHERE event_id = ?', id);
    },
    async reset() {
      for (const db of connections.splice(0)) db.close();
      rmSync(dir, { recursive: true, force: true });
    },
  });
});

describe('SqliteEventStore: the file', () => {
  let dir: string;
  let file: string;
  let store: SqliteEventStore;
  const opened: { close(): unknown }[] = [];

  /** A second connection to the same file, as another process (the CLI) would have. */
  function otherConnection(): Database.Database {
    const db = new Database(file, { readonly: true });
    opened.push(db);
    return db;
  }

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'gatehouse-store-'));
    file = path.join(dir, 'nested', 'events.db');
    store = new SqliteEventStore(file);
  });

  afterEach(async () => {
    for (const db of opened.splice(0)) db.close();
    await store.close().catch(() => {});
    rmSync(dir, { recursive: true, force: true });
  });

  it('sets WAL journal mode, synchronous=FULL and foreign keys', () => {
    assert.equal(otherConnection().pragma('journal_mode', { simple: true }), 'wal');
    // synchronous is per connection: read the store's own (private) connection.
    const own = (store as unknown as { db: Database.Database }).db;
    assert.ok(own instanceof Database, 'the store keeps its connection in `db`');
    assert.equal(own.pragma('synchronous', { simple: true }), 2, 'FULL');
    assert.equal(own.pragma('foreign_keys', { simple: true }), 1);
  });

  it('a file written by the previous version (no replay-key table) opens with its events, and gains replay keys', async () => {
    await store.close();
    const legacyFile = path.join(dir, 'legacy.db');
    const legacy = new Database(legacyFile);
    legacy.exec(PREVIOUS_SCHEMA);
    legacy
      .prepare(
        "INSERT INTO events (id, endpoint, action, idempotency_key, received_at, envelope, status, next_attempt_at) VALUES ('evt_legacy', '/webhook/github', 'message', 'gh-old', ?, '{}', 'queued', ?)",
      )
      .run(T0, T0);
    legacy.close();

    store = new SqliteEventStore(legacyFile);
    assert.equal((await store.get('evt_legacy'))?.event.idempotencyKey, 'gh-old');
    assert.deepEqual(await store.accept(event({ idempotencyKey: 'gh-old', receivedAt: T0 + 1 })), {
      id: 'evt_legacy',
      duplicate: true,
    });
    const signed = await store.accept(event({ idempotencyKey: 'gh-new', replayKey: 'sig' }));
    assert.deepEqual(await store.accept(event({ idempotencyKey: 'gh-newer', replayKey: 'sig' })), {
      id: signed.id,
      duplicate: true,
    });
    await store.close();
    store = new SqliteEventStore(legacyFile); // and opens again, now with the table
    assert.deepEqual(await store.accept(event({ replayKey: 'sig' })), { id: signed.id, duplicate: true });
  });

  it('delivered events are counted in steps along the index, exactly (ties in next attempt time, several actions)', async () => {
    await store.close();
    store = new SqliteEventStore(file, { deliveredCountStep: 2 });
    const deliver = async (action: 'message' | 'agent', receivedAt: number) => {
      const { id } = await store.accept(event({ action, receivedAt }));
      await store.recordAttempt(
        id,
        { attempt: 1, at: receivedAt, status: 200, error: null, durationMs: 1 },
        { status: 'delivered' },
      );
    };
    for (const at of [T0, T0, T0, T0 + 1, T0 + 2]) await deliver('message', at); // 5: two full steps, then the rest
    for (const at of [T0, T0 + 1]) await deliver('agent', at); // 2: one full step, then nothing left
    await store.accept(event({ receivedAt: T0 }));
    const counts = Object.fromEntries(
      (await store.queueStats(T0)).counts.map((c) => [`${c.action}/${c.status}`, c.events]),
    );
    assert.deepEqual(counts, { 'message/queued': 1, 'message/delivered': 5, 'agent/delivered': 2 });
  });

  it('retry --dead and --queued change every event, 500 at a time (found by review: one UPDATE of a copied million held the write lock for seconds)', async () => {
    const own = (store as unknown as { db: Database.Database }).db;
    const insert = own.prepare(
      "INSERT INTO events (id, endpoint, action, received_at, envelope, status, next_attempt_at, attempts, round_attempts) VALUES (?, '/webhook/a', 'message', ?, '{}', ?, ?, 3, 3)",
    );
    own.transaction(() => {
      for (let i = 0; i < 1_201; i++) insert.run(`evt_w${i}`, T0, 'queued', T0 + 3_600_000); // waiting out a backoff
      for (let i = 0; i < 1_001; i++) insert.run(`evt_d${i}`, T0, 'dead', T0);
      insert.run('evt_due', T0, 'queued', T0); // already due: not waiting
    })();
    const statements = (store as unknown as { statements: Record<string, Database.Statement> }).statements;
    const runs: Record<string, number> = {};
    for (const name of ['requeueWaiting', 'requeueDead']) {
      const statement = statements[name]!;
      statements[name] = {
        run: (...args: unknown[]) => ((runs[name] = (runs[name] ?? 0) + 1), statement.run(...(args as []))),
      } as unknown as Database.Statement;
    }
    assert.equal(await store.requeueWaiting(T0 + 1_000), 1_201);
    assert.equal(await store.requeueDead(T0 + 1_000), 1_001);
    assert.deepEqual(runs, { requeueWaiting: 4, requeueDead: 4 }, 'three chunks and the empty one that ends it');
    const left = own
      .prepare(
        'SELECT status, next_attempt_at AS at, round_attempts AS round, COUNT(*) AS n FROM events GROUP BY 1, 2, 3 ORDER BY n',
      )
      .all();
    assert.deepEqual(left, [
      { status: 'queued', at: T0, round: 3, n: 1 },
      { status: 'queued', at: T0 + 1_000, round: 0, n: 2_202 },
    ]);
  });

  it('a purge chunk finds old delivered events through events_delivered, not by reading every delivered one', () => {
    // Found by review: each chunk (and the last, empty one) walked events_next under the write lock: 460 ms at 1,000,000.
    const plan = otherConnection()
      .prepare(`EXPLAIN QUERY PLAN ${PURGE_CHUNK_SQL}`)
      .all(T0)
      .map((row) => (row as { detail: string }).detail);
    assert.ok(
      plan.some((step) => /USING COVERING INDEX events_delivered \(delivered_at<\?\)/.test(step)),
      plan.join(' | '),
    );
    // Inside the delivery-id window: a page from where the last ended, on the same index, in its order (no sort).
    const recent = otherConnection()
      .prepare(`EXPLAIN QUERY PLAN ${PURGE_RECENT_PAGE_SQL}`)
      .all({ before: T0, at: T0, row: 0 })
      .map((row) => (row as { detail: string }).detail);
    assert.ok(
      recent.some((step) => /USING COVERING INDEX events_delivered \(delivered_at>\? AND delivered_at<\?\)/.test(step)),
      recent.join(' | '),
    );
    assert.ok(!recent.some((step) => /TEMP B-TREE/.test(step)), recent.join(' | '));
  });

  describe('single writer', () => {
    it("a second server store on the same file is refused, naming the holder's pid; plain (CLI) stores still open", async () => {
      const server = new SqliteEventStore(file, { singleWriter: true });
      opened.push({ close: () => server.close() });
      assert.throws(
        () => new SqliteEventStore(file, { singleWriter: true }),
        (err: unknown) => {
          assert.ok(err instanceof UsageError);
          assert.match(err.message, new RegExp(`in use by another gatehouse server \\(pid ${process.pid}\\)`));
          return true;
        },
      );
      const cli = new SqliteEventStore(file, { mustExist: true });
      assert.deepEqual(await cli.list({}), []);
      await cli.close();
      await server.close();
      const next = new SqliteEventStore(file, { singleWriter: true }); // released by close()
      await next.close();
    });

    it('another process is refused while this one holds the file, and gets it once this one is gone', () => {
      const lock = acquireWriterLock(file);
      assert.equal(readFileSync(`${file}.server-pid`, 'utf8').trim(), String(process.pid));
      const attempt = () =>
        spawnSync(
          process.execPath,
          [
            '--import',
            'tsx',
            '-e',
            `import('./src/storage/sqlite/writer-lock.ts').then((m) => { m.acquireWriterLock(${JSON.stringify(file)}).release(); console.log('acquired'); }).catch((e) => { console.error(e.message); process.exit(3); })`,
          ],
          { cwd: ROOT, encoding: 'utf8' },
        );
      const refused = attempt();
      assert.equal(refused.status, 3, refused.stderr);
      assert.match(refused.stderr, new RegExp(`pid ${process.pid}`));
      lock.release();
      const granted = attempt();
      assert.equal(granted.status, 0, granted.stderr);
      assert.match(granted.stdout, /acquired/);
    });
  });
});
