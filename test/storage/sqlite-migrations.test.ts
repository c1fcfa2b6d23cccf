import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import Database from 'better-sqlite3';
import { latestVersion, migrateSqlite, type SqliteMigration } from '../../src/storage/migrate.js';
import { SqliteChannelStore } from '../../src/storage/sqlite/channels.js';
import { SqliteEventStore } from '../../src/storage/sqlite/events.js';
import { SqliteGmailStore } from '../../src/storage/sqlite/gmail.js';
import { SQLITE_MIGRATIONS, SQLITE_SCHEMA_VERSION } from '../../src/storage/sqlite/migrations.js';

// Upgrades of SQLite files that builds before the numbered migrations made: each store created
// its own tables at open with the statements below (verbatim from src/storage/sqlite/{events,
// channels,gmail}.ts as they were), and the events store set user_version 1. Such a file opens
// unchanged, with every row; one missing a part gains it; a newer one is refused.

const EVENTS_BEFORE = `
CREATE TABLE IF NOT EXISTS events (
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
CREATE UNIQUE INDEX IF NOT EXISTS events_idempotency ON events (endpoint, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS events_due ON events (status, action, next_attempt_at, id);
CREATE INDEX IF NOT EXISTS events_next ON events (status, next_attempt_at, id);
-- purgeDelivered's chunks find what is old enough here: without it each one (and the last,
-- empty one) read every delivered event while holding the write lock the server's accepts wait
-- for (measured at 1,000,000: up to 460 ms a chunk; now 5 ms, p99 18 ms). Built at open on an
-- existing file, once (0.9 s at 1,000,000).
CREATE INDEX IF NOT EXISTS events_delivered ON events (delivered_at) WHERE status = 'delivered';
CREATE TABLE IF NOT EXISTS attempts (
  event_id    TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
  attempt     INTEGER NOT NULL,
  at          INTEGER NOT NULL,
  status      INTEGER,
  error       TEXT,
  duration_ms INTEGER NOT NULL,
  PRIMARY KEY (event_id, attempt)
);
-- Replay keys (see NewEvent.replayKey): one row per signed event, gone with its event (purge).
-- A table of its own rather than a column, so a file from an earlier version gains it here
-- without an ALTER.
CREATE TABLE IF NOT EXISTS event_replay_keys (
  endpoint   TEXT NOT NULL,
  replay_key TEXT NOT NULL,
  event_id   TEXT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
  PRIMARY KEY (endpoint, replay_key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS event_replay_keys_event ON event_replay_keys (event_id);
-- /readyz's write (probeWrite): one row, rewritten at each probe. A statement that changes no row
-- writes nothing to SQLite, so it passed on a file the OS refused every write to.
CREATE TABLE IF NOT EXISTS store_probe (id INTEGER PRIMARY KEY CHECK (id = 1), at INTEGER NOT NULL);
`;

const CHANNELS_BEFORE = `
CREATE TABLE IF NOT EXISTS channel_grants (
  name          TEXT PRIMARY KEY,
  kind          TEXT NOT NULL,
  sealed        TEXT NOT NULL,
  details       TEXT NOT NULL,
  connected_at  INTEGER NOT NULL,
  expires_at    INTEGER,
  last_event_at INTEGER,
  last_error    TEXT,
  last_error_at INTEGER
);
CREATE TABLE IF NOT EXISTS channel_devices (
  id           TEXT PRIMARY KEY,
  channel      TEXT NOT NULL,
  name         TEXT NOT NULL,
  token_hash   TEXT NOT NULL UNIQUE,
  created_at   INTEGER NOT NULL,
  revoked_at   INTEGER,
  last_seen_at INTEGER
);
CREATE TABLE IF NOT EXISTS channel_pairings (
  code_hash  TEXT PRIMARY KEY,
  channel    TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  used_at    INTEGER,
  device_id  TEXT
);
CREATE TABLE IF NOT EXISTS channel_outbox (
  id         INTEGER PRIMARY KEY AUTOINCREMENT,
  channel    TEXT NOT NULL,
  device_id  TEXT NOT NULL,
  text       TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  fetched_at INTEGER
);
CREATE INDEX IF NOT EXISTS channel_outbox_pending ON channel_outbox (device_id, fetched_at, id);
CREATE TABLE IF NOT EXISTS channel_oauth_requests (
  state_hash TEXT PRIMARY KEY,
  channel    TEXT NOT NULL,
  expires_at INTEGER NOT NULL,
  answer     TEXT
);
`;

const GMAIL_BEFORE = `
CREATE TABLE IF NOT EXISTS gmail_accounts (
  account              TEXT PRIMARY KEY,
  client_id            TEXT NOT NULL,
  project              TEXT,
  sealed_grant         TEXT NOT NULL,
  cursor               TEXT,
  cursor_at            INTEGER,
  watch_expiration     INTEGER,
  watch_renewed_at     INTEGER,
  last_notification_at INTEGER,
  last_error           TEXT,
  last_error_at        INTEGER,
  emails_enqueued      INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS gmail_seen (
  account    TEXT NOT NULL,
  message_id TEXT NOT NULL,
  event_id   TEXT NOT NULL,
  seen_at    INTEGER NOT NULL,
  PRIMARY KEY (account, message_id)
);
`;

/** What builds before gmail_accounts.project, event_replay_keys, store_probe and events_delivered created. */
const OLDER_BUILD = `
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
CREATE TABLE gmail_accounts (
  account              TEXT PRIMARY KEY,
  client_id            TEXT NOT NULL,
  sealed_grant         TEXT NOT NULL,
  cursor               TEXT,
  cursor_at            INTEGER,
  watch_expiration     INTEGER,
  watch_renewed_at     INTEGER,
  last_notification_at INTEGER,
  last_error           TEXT,
  last_error_at        INTEGER,
  emails_enqueued      INTEGER NOT NULL DEFAULT 0
);
`;

const T = 1_700_000_000_000;

/** Rows in every table the statements above make (those a file has). */
function fill(db: Database.Database): void {
  const has = (table: string) => tables(db).includes(table);
  if (!has('events')) return fillChannels(db);
  const event = db.prepare(
    'INSERT INTO events (id, endpoint, action, idempotency_key, received_at, envelope, status, attempts, round_attempts, next_attempt_at, last_error, delivered_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
  );
  event.run('e1', 'github', 'message', 'd-1', T, '{"n":1}', 'queued', 0, 0, T, null, null);
  event.run('e2', 'github', 'message', 'd-2', T + 1, '{"n":2}', 'delivered', 1, 1, 0, null, T + 10);
  event.run('e3', 'stripe', 'message', null, T + 2, '{"n":3}', 'dead', 3, 3, 0, 'HTTP 500', null);
  db.prepare('INSERT INTO attempts (event_id, attempt, at, status, error, duration_ms) VALUES (?, ?, ?, ?, ?, ?)').run(
    'e2',
    1,
    T + 5,
    200,
    null,
    5,
  );
  db.prepare('INSERT INTO attempts (event_id, attempt, at, status, error, duration_ms) VALUES (?, ?, ?, ?, ?, ?)').run(
    'e3',
    3,
    T + 6,
    500,
    'HTTP 500',
    7,
  );
  if (has('event_replay_keys'))
    db.prepare('INSERT INTO event_replay_keys (endpoint, replay_key, event_id) VALUES (?, ?, ?)').run(
      'github',
      'sig-1',
      'e1',
    );
  if (has('store_probe')) db.prepare('INSERT INTO store_probe (id, at) VALUES (1, ?)').run(T);
  if (has('gmail_accounts')) {
    db.prepare(
      'INSERT INTO gmail_accounts (account, client_id, sealed_grant, cursor, emails_enqueued) VALUES (?, ?, ?, ?, ?)',
    ).run('a@example.com', 'client', 'sealed', '42', 3);
  }
  if (has('gmail_seen'))
    db.prepare('INSERT INTO gmail_seen (account, message_id, event_id, seen_at) VALUES (?, ?, ?, ?)').run(
      'a@example.com',
      'm1',
      'e1',
      T,
    );
  if (has('channel_grants')) fillChannels(db);
}

function fillChannels(db: Database.Database): void {
  db.prepare('INSERT INTO channel_grants (name, kind, sealed, details, connected_at) VALUES (?, ?, ?, ?, ?)').run(
    'tg',
    'telegram',
    'sealed',
    '{}',
    T,
  );
  db.prepare('INSERT INTO channel_devices (id, channel, name, token_hash, created_at) VALUES (?, ?, ?, ?, ?)').run(
    'd1',
    'tg',
    'phone',
    'hash',
    T,
  );
  db.prepare('INSERT INTO channel_pairings (code_hash, channel, created_at, expires_at) VALUES (?, ?, ?, ?)').run(
    'code',
    'tg',
    T,
    T + 60_000,
  );
  db.prepare('INSERT INTO channel_outbox (channel, device_id, text, created_at) VALUES (?, ?, ?, ?)').run(
    'tg',
    'd1',
    'hello',
    T,
  );
  db.prepare('INSERT INTO channel_oauth_requests (state_hash, channel, expires_at) VALUES (?, ?, ?)').run(
    'state',
    'tg',
    T + 60_000,
  );
}

function tables(db: Database.Database): string[] {
  return db
    .prepare<[], { name: string }>(
      "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name",
    )
    .all()
    .map((r) => r.name);
}

/** Every schema object's name and SQL, as the file holds them. */
function schemaOf(db: Database.Database): { type: string; name: string; sql: string | null }[] {
  return db
    .prepare<[], { type: string; name: string; sql: string | null }>(
      "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY type, name",
    )
    .all();
}

/** Columns later migrations add (versions 3 and 4): null in a row from before, so left out of rowsOf where null. */
const ADDED_LATER = ['headers', 'response_snippet', 'trace_context'];

/** Every row of every table, by table (columns added later left out where they are null). */
function rowsOf(db: Database.Database): Record<string, unknown[]> {
  const sorted = (rows: unknown[]) =>
    rows
      .map((r) =>
        Object.fromEntries(
          Object.entries(r as Record<string, unknown>).filter(([k, v]) => !(ADDED_LATER.includes(k) && v === null)),
        ),
      )
      .map((r) => [JSON.stringify(r), r] as const)
      .sort(([a], [b]) => (a < b ? -1 : 1))
      .map(([, r]) => r);
  return Object.fromEntries(tables(db).map((table) => [table, sorted(db.prepare(`SELECT * FROM ${table}`).all())]));
}

function withFile<T>(file: string, read: (db: Database.Database) => T): T {
  const db = new Database(file);
  try {
    return read(db);
  } finally {
    db.close();
  }
}

describe('SQLite schema migrations', () => {
  let dir: string;
  let n = 0;
  const newFile = () => path.join(dir, `store-${++n}.db`);
  /** A file as builds before the runner left it: `sql` run as they ran it, in WAL, at `userVersion`. */
  const fileMadeWith = (sql: string[], userVersion: number) => {
    const file = newFile();
    withFile(file, (db) => {
      db.pragma('journal_mode = WAL');
      for (const part of sql) db.exec(part);
      if (userVersion > 0) db.pragma(`user_version = ${userVersion}`);
      fill(db);
    });
    return file;
  };
  /** Opens `file` as a server does (events, Gmail beside them, channels on their own connection), then closes it. */
  const openAsServer = async (file: string) => {
    const events = new SqliteEventStore(file, { singleWriter: true });
    const gmail = new SqliteGmailStore(events);
    const channels = new SqliteChannelStore(file);
    const found = {
      event: await events.get('e1'),
      account: await gmail.get('a@example.com'),
      grant: await channels.grant('tg'),
      status: await events.status(Date.now()),
    };
    await channels.close();
    await events.close();
    return found;
  };
  /** A new file's schema at the latest version, and at version 1 (the baseline: what builds before the runner made). */
  let fresh: ReturnType<typeof schemaOf>;
  let baseline: ReturnType<typeof schemaOf>;

  before(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-sqlite-migrations-'));
    const file = newFile();
    await new SqliteEventStore(file).close();
    fresh = withFile(file, schemaOf);
    baseline = withFile(newFile(), (db) => {
      migrateSqlite(db, SQLITE_MIGRATIONS.slice(0, 1));
      return schemaOf(db);
    });
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("numbers the SQLite schema from 1, the baseline being version 1 and today's version 4", () => {
    assert.equal(SQLITE_SCHEMA_VERSION, SQLITE_MIGRATIONS.length);
    assert.equal(SQLITE_SCHEMA_VERSION, 4);
    assert.throws(
      () =>
        latestVersion([
          { version: 1, name: 'a' },
          { version: 3, name: 'b' },
        ]),
      /numbered 3, expected 2/,
    );
  });

  it('a new file gets exactly the schema the stores used to create, at user_version 1', () => {
    const before = fileMadeWith([EVENTS_BEFORE, CHANNELS_BEFORE, GMAIL_BEFORE], 1);
    assert.deepEqual(withFile(before, schemaOf), baseline);
  });

  it('a file of the baseline build, every part in it, at user_version 1, opens with every row, gaining only versions 2, 3 and 4', async () => {
    const file = fileMadeWith([EVENTS_BEFORE, CHANNELS_BEFORE, GMAIL_BEFORE], 1);
    const [schema, rows] = withFile(file, (db) => [schemaOf(db), rowsOf(db)] as const);
    const found = await openAsServer(file);
    assert.equal(found.event?.event.envelope, '{"n":1}');
    assert.equal(found.account?.cursor, '42');
    assert.equal(found.grant?.kind, 'telegram');
    assert.equal(found.status.schemaVersion, SQLITE_SCHEMA_VERSION);
    assert.deepEqual(found.status.counts, { queued: 1, delivered: 1, dead: 1 });
    withFile(file, (db) => {
      assert.deepEqual(schema, baseline);
      assert.deepEqual(schemaOf(db), fresh);
      assert.deepEqual(rowsOf(db), rows);
      assert.equal(db.pragma('user_version', { simple: true }), SQLITE_SCHEMA_VERSION);
    });
  });

  it('a file at version 2 opens at the latest version: its events and attempts as they were, headers and response snippets null', async () => {
    const file = newFile();
    withFile(file, (db) => {
      db.pragma('journal_mode = WAL');
      migrateSqlite(db, SQLITE_MIGRATIONS.slice(0, 2));
      fill(db);
    });
    const rows = withFile(file, rowsOf);
    const events = new SqliteEventStore(file, { singleWriter: true });
    try {
      assert.equal(await events.schemaVersion(), SQLITE_SCHEMA_VERSION);
      const old = await events.get('e1');
      assert.equal(old?.event.envelope, '{"n":1}');
      assert.equal(old?.headers, null);
      assert.deepEqual(old?.attempts, []);
      for (const id of ['e2', 'e3']) {
        const found = await events.get(id);
        assert.equal(found?.headers, null, id);
        assert.deepEqual(
          found?.attempts.map((a) => a.responseSnippet),
          [null],
          id,
        );
      }
      // An event accepted after the upgrade keeps both.
      const { id } = await events.accept({
        endpoint: '/w',
        action: 'message',
        receivedAt: Date.now(),
        envelope: () => '{}',
        headers: '{"x":"y"}',
      });
      await events.recordAttempt(
        id,
        { attempt: 1, at: Date.now(), status: 503, error: null, durationMs: 1, responseSnippet: 'busy' },
        { status: 'dead' },
      );
      const fresh = await events.get(id);
      assert.equal(fresh?.headers, '{"x":"y"}');
      assert.equal(fresh?.attempts[0]?.responseSnippet, 'busy');
    } finally {
      await events.close();
    }
    withFile(file, (db) => {
      const after = rowsOf(db);
      for (const [table, before] of Object.entries(rows))
        if (table !== 'events' && table !== 'attempts' && table !== 'store_probe')
          assert.deepEqual(after[table], before, table);
      assert.deepEqual(schemaOf(db), fresh);
    });
  });

  it('a file of the baseline build whose channel and Gmail parts never ran gains their tables, and keeps its rows', async () => {
    const file = fileMadeWith([EVENTS_BEFORE], 1);
    const rows = withFile(file, rowsOf);
    const found = await openAsServer(file);
    assert.equal(found.event?.event.status, 'queued');
    assert.equal(found.account, undefined);
    withFile(file, (db) => {
      assert.deepEqual(schemaOf(db), fresh);
      const after = rowsOf(db);
      for (const [table, before] of Object.entries(rows)) assert.deepEqual(after[table], before, table);
      assert.equal(db.pragma('user_version', { simple: true }), SQLITE_SCHEMA_VERSION);
    });
  });

  it('a file a channel login made first (user_version 0, channel tables only) is brought to the latest version by the channel store', async () => {
    const file = fileMadeWith([CHANNELS_BEFORE], 0);
    const rows = withFile(file, rowsOf);
    const channels = new SqliteChannelStore(file);
    assert.equal((await channels.grant('tg'))?.kind, 'telegram');
    await channels.close();
    withFile(file, (db) => {
      assert.deepEqual(schemaOf(db), fresh);
      assert.equal(db.pragma('user_version', { simple: true }), SQLITE_SCHEMA_VERSION);
      const after = rowsOf(db);
      for (const [table, before] of Object.entries(rows)) assert.deepEqual(after[table], before, table);
    });
  });

  it('a file of an older build at user_version 0, without later tables, the project column or events_delivered, is brought to the latest version with every row', async () => {
    const file = fileMadeWith([OLDER_BUILD], 0);
    const rows = withFile(file, rowsOf);
    const found = await openAsServer(file);
    assert.equal(found.event?.event.envelope, '{"n":1}');
    assert.equal(found.account?.cursor, '42');
    assert.equal(found.account?.project ?? undefined, undefined);
    assert.equal(found.status.schemaVersion, SQLITE_SCHEMA_VERSION);
    withFile(file, (db) => {
      assert.equal(db.pragma('user_version', { simple: true }), SQLITE_SCHEMA_VERSION);
      const names = (s: ReturnType<typeof schemaOf>) => s.map((o) => `${o.type} ${o.name}`);
      assert.deepEqual(names(schemaOf(db)), names(fresh));
      const after = rowsOf(db);
      assert.deepEqual(after.events, rows.events);
      assert.deepEqual(after.attempts, rows.attempts);
      assert.deepEqual(
        after.gmail_accounts,
        (rows.gmail_accounts as object[]).map((r) => ({ ...r, project: null })),
      );
    });
    // And it works as a store: an accept lands beside the rows that were there.
    const events = new SqliteEventStore(file);
    const accepted = await events.accept({
      endpoint: 'github',
      action: 'message',
      idempotencyKey: 'd-3',
      replayKey: 'sig-2',
      receivedAt: T + 100,
      envelope: () => '{"n":4}',
    });
    assert.equal(accepted.duplicate, false);
    assert.equal((await events.list({})).length, 4);
    await events.close();
  });

  it('refuses a file a newer gatehouse migrated, and leaves it as it was', () => {
    const file = fileMadeWith([EVENTS_BEFORE, CHANNELS_BEFORE, GMAIL_BEFORE], SQLITE_SCHEMA_VERSION + 1);
    const rows = withFile(file, rowsOf);
    assert.throws(
      () => new SqliteEventStore(file),
      new RegExp(
        `schema is at version ${SQLITE_SCHEMA_VERSION + 1}, newer than this gatehouse knows \\(${SQLITE_SCHEMA_VERSION}\\): upgrade gatehouse`,
      ),
    );
    assert.throws(() => new SqliteChannelStore(file), /newer than this gatehouse knows/);
    withFile(file, (db) => {
      assert.deepEqual(rowsOf(db), rows);
      assert.equal(db.pragma('user_version', { simple: true }), SQLITE_SCHEMA_VERSION + 1);
    });
  });

  it('applies a later migration once, in one transaction with its version: a failing one leaves the file at the version before', () => {
    const file = fileMadeWith([EVENTS_BEFORE, CHANNELS_BEFORE, GMAIL_BEFORE], 1);
    const rows = withFile(file, rowsOf);
    const failing: SqliteMigration[] = [
      ...SQLITE_MIGRATIONS,
      { version: 5, name: 'fails half way', up: 'CREATE TABLE half (x); INSERT INTO nowhere VALUES (1);' },
    ];
    withFile(file, (db) => {
      assert.throws(() => migrateSqlite(db, failing), /no such table: nowhere/);
      assert.equal(db.pragma('user_version', { simple: true }), 4);
      assert.ok(!tables(db).includes('half'));
    });
    const next: SqliteMigration[] = [
      ...SQLITE_MIGRATIONS,
      { version: 5, name: 'a column', up: 'ALTER TABLE events ADD COLUMN note TEXT' },
    ];
    withFile(file, (db) => {
      assert.deepEqual(migrateSqlite(db, next), { from: 4, to: 5, applied: [5] });
      assert.deepEqual(migrateSqlite(db, next), { from: 5, to: 5, applied: [] });
      assert.equal(db.pragma('user_version', { simple: true }), 5);
      assert.deepEqual(
        (rowsOf(db).events as object[]).map((r) => ({ ...r, note: undefined })),
        (rows.events as object[]).map((r) => ({ ...r, note: undefined })),
      );
    });
  });
});
