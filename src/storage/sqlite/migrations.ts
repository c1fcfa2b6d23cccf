import { latestVersion, type SqliteMigration } from '../migrate.js';

/**
 * The SQLite schema, as numbered migrations (run by src/storage/migrate.ts; the version is the
 * file's PRAGMA user_version). Append only: a released migration is never edited.
 *
 * Version 1 is the schema as it stood before migrations were numbered, when each store created
 * its own tables at open (`CREATE TABLE IF NOT EXISTS`): the events store's, the channel store's
 * and the Gmail store's, the last with the project column files from before it lack. It adopts
 * those files (see migrateSqlite): it only creates what is missing, and changes nothing else.
 */
export const SQLITE_MIGRATIONS: readonly SqliteMigration[] = [
  {
    version: 1,
    name: 'webhook events, attempts, replay keys; channels state; Gmail state',
    adopts: true,
    up: (db) => {
      db.exec(EVENTS_V1);
      db.exec(CHANNELS_V1);
      db.exec(GMAIL_V1);
      // Files written before the project was kept with the grant.
      if (
        !db
          .prepare<[], { name: string }>('PRAGMA table_info(gmail_accounts)')
          .all()
          .some((c) => c.name === 'project')
      ) {
        db.exec('ALTER TABLE gmail_accounts ADD COLUMN project TEXT');
      }
    },
  },
  {
    version: 2,
    name: "the operator's event list, newest first, by status, endpoint or action",
    // The admin API's list and filter retry (src/storage/sqlite/event-queries.ts) walk one of these
    // from the newest row and stop at the page's end: without them a filter on delivered events
    // sorted every one of them (events_due has no receipt order). Built at open on an existing file.
    up: `
CREATE INDEX IF NOT EXISTS events_received ON events (received_at, id);
CREATE INDEX IF NOT EXISTS events_status_received ON events (status, received_at, id);
CREATE INDEX IF NOT EXISTS events_endpoint_received ON events (endpoint, received_at, id);
CREATE INDEX IF NOT EXISTS events_action_received ON events (action, received_at, id);
`,
  },
  {
    version: 3,
    name: 'received headers per event, the start of the answer per attempt',
    // Nullable, no default: rows from before stay as they are (null: not recorded then), and
    // ALTER TABLE … ADD COLUMN rewrites nothing on an existing file.
    up: `
ALTER TABLE events ADD COLUMN headers TEXT;
ALTER TABLE attempts ADD COLUMN response_snippet TEXT;
`,
  },
  {
    version: 4,
    name: 'the trace context each event was received in',
    // Nullable, no default, as version 3: nothing rewritten; events from before have none.
    up: 'ALTER TABLE events ADD COLUMN trace_context TEXT;',
  },
];

/** The user_version a file has once every migration is in (what `gatehouse storage status` reports). */
export const SQLITE_SCHEMA_VERSION = latestVersion(SQLITE_MIGRATIONS);

const EVENTS_V1 = `
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

const CHANNELS_V1 = `
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

const GMAIL_V1 = `
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
