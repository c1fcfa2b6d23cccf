import type pg from 'pg';
import type { Logger } from 'pino';
import type { PostgresStorageConfig } from '../../config/schema.js';
import { UsageError } from '../../errors.js';
import {
  latestVersion,
  migratePostgres,
  newerSchemaMessage,
  type MigrationResult,
  type PostgresMigration,
} from '../migrate.js';
import { createPool, describeUrl, poolConfig, reportingLostConnections, withClient } from './pool.js';
import { GatedPool, schemaGateFor, unreachable } from './schema-gate.js';

/**
 * The Postgres schema, as numbered migrations (run by src/storage/migrate.ts), each recorded in
 * `schema_migrations`. Append only: a released migration is never edited.
 */
export const MIGRATIONS: readonly PostgresMigration[] = [
  {
    version: 1,
    name: 'webhook events, attempts, replay keys, leases',
    sql: `
CREATE TABLE events (
  id              text PRIMARY KEY,
  endpoint        text NOT NULL,
  action          text NOT NULL,
  idempotency_key text,
  received_at     bigint NOT NULL,
  envelope        text NOT NULL,
  status          text NOT NULL CHECK (status IN ('queued', 'delivered', 'dead')),
  attempts        integer NOT NULL DEFAULT 0,
  round_attempts  integer NOT NULL DEFAULT 0,
  next_attempt_at bigint NOT NULL,
  last_error      text,
  delivered_at    bigint,
  -- The lease: until when, under which fencing token, held by which process (see claimDue).
  lease_until     bigint,
  claim_id        uuid,
  lease_owner     text
);
CREATE UNIQUE INDEX events_idempotency ON events (endpoint, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_due ON events (action, next_attempt_at) WHERE status = 'queued';
CREATE INDEX events_next ON events (next_attempt_at) WHERE status = 'queued';
CREATE INDEX events_leased ON events (lease_until) WHERE status = 'queued' AND lease_until IS NOT NULL;
CREATE INDEX events_lease_owner ON events (lease_owner) WHERE lease_owner IS NOT NULL;
CREATE INDEX events_delivered ON events (delivered_at) WHERE status = 'delivered';
CREATE INDEX events_received ON events (received_at DESC, id DESC);
CREATE TABLE attempts (
  event_id    text NOT NULL REFERENCES events (id) ON DELETE CASCADE,
  attempt     integer NOT NULL,
  at          bigint NOT NULL,
  status      integer,
  error       text,
  duration_ms integer NOT NULL,
  PRIMARY KEY (event_id, attempt)
);
CREATE TABLE event_replay_keys (
  endpoint   text NOT NULL,
  replay_key text NOT NULL,
  event_id   text NOT NULL REFERENCES events (id) ON DELETE CASCADE,
  PRIMARY KEY (endpoint, replay_key)
);
CREATE INDEX event_replay_keys_event ON event_replay_keys (event_id);
`,
  },
  {
    version: 2,
    name: 'failure lockout shared by instances',
    sql: `
-- One row per client key (gateway:<ip>, webhooks:<ip>, IPv6 per /64): see src/storage/postgres/lockout.ts.
CREATE TABLE lockouts (
  key            text PRIMARY KEY,
  failures       bigint[] NOT NULL DEFAULT '{}', -- times (ms) of the failures in the window, oldest first
  reserved       integer NOT NULL DEFAULT 0,      -- checks in flight holding a place in the count
  reserved_until bigint NOT NULL DEFAULT 0,       -- past it, those places are forgotten (their instance died)
  locked_until   bigint NOT NULL DEFAULT 0,
  expires_at     bigint NOT NULL                  -- past it the row says nothing: deleted by any instance
);
CREATE INDEX lockouts_locked ON lockouts (locked_until) WHERE locked_until > 0;
CREATE INDEX lockouts_expires ON lockouts (expires_at);
`,
  },
  {
    version: 3,
    name: 'Gmail and channels state',
    sql: `
-- The SQLite driver's tables, column for column (src/storage/sqlite/gmail.ts, channels.ts); times in ms.
CREATE TABLE gmail_accounts (
  account              text PRIMARY KEY,
  client_id            text NOT NULL,
  project              text,
  sealed_grant         text NOT NULL,
  cursor               text,
  cursor_at            bigint,
  watch_expiration     bigint,
  watch_renewed_at     bigint,
  last_notification_at bigint,
  last_error           text,
  last_error_at        bigint,
  emails_enqueued      bigint NOT NULL DEFAULT 0
);
-- No foreign key to events: a seen id outlives its event (purged once delivered).
CREATE TABLE gmail_seen (
  account    text NOT NULL,
  message_id text NOT NULL,
  event_id   text NOT NULL,
  seen_at    bigint NOT NULL,
  PRIMARY KEY (account, message_id)
);
CREATE INDEX gmail_seen_age ON gmail_seen (account, seen_at);
CREATE TABLE channel_grants (
  name          text PRIMARY KEY,
  kind          text NOT NULL,
  sealed        text NOT NULL,
  details       text NOT NULL,
  connected_at  bigint NOT NULL,
  expires_at    bigint,
  last_event_at bigint,
  last_error    text,
  last_error_at bigint
);
CREATE TABLE channel_devices (
  id           text PRIMARY KEY,
  channel      text NOT NULL,
  name         text NOT NULL,
  token_hash   text NOT NULL UNIQUE,
  created_at   bigint NOT NULL,
  revoked_at   bigint,
  last_seen_at bigint
);
CREATE INDEX channel_devices_channel ON channel_devices (channel, created_at);
CREATE TABLE channel_pairings (
  code_hash  text PRIMARY KEY,
  channel    text NOT NULL,
  created_at bigint NOT NULL,
  expires_at bigint NOT NULL,
  used_at    bigint,
  device_id  text
);
CREATE INDEX channel_pairings_pending ON channel_pairings (channel, expires_at) WHERE used_at IS NULL;
CREATE TABLE channel_outbox (
  id         bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  channel    text NOT NULL,
  device_id  text NOT NULL,
  text       text NOT NULL,
  created_at bigint NOT NULL,
  fetched_at bigint
);
CREATE INDEX channel_outbox_pending ON channel_outbox (device_id, id) WHERE fetched_at IS NULL;
CREATE TABLE channel_oauth_requests (
  state_hash text PRIMARY KEY,
  channel    text NOT NULL,
  expires_at bigint NOT NULL,
  answer     text
);
`,
  },
  {
    version: 4,
    name: 'rate-limit buckets shared by instances',
    sql: `
-- One row per (limit, client) bucket: see src/storage/postgres/rate-limits.ts. \`bucket\` is a digest
-- of the limit's definition and the client key (no raw key or address is stored).
CREATE TABLE rate_limit_buckets (
  bucket        text PRIMARY KEY,
  tokens        double precision NOT NULL,  -- the level at \`at\` (below zero: a debt the refill pays back)
  at            bigint NOT NULL,            -- ms; the latest time any instance synced it at
  capacity      double precision NOT NULL,
  refill_per_ms double precision NOT NULL,
  spent         double precision NOT NULL,  -- the last sync's spend (what EXCLUDED carries in)
  full_at       bigint NOT NULL             -- ms; from then on the row equals a missing one: deleted
);
CREATE INDEX rate_limit_buckets_full ON rate_limit_buckets (full_at);
`,
  },
  {
    version: 5,
    name: 'claims read only claimable rows',
    // A claim walks events_free in its ORDER BY and stops at its LIMIT: no sort of the whole
    // backlog (which the planner chose for events_due when its statistics were behind: 17 ms a
    // claim at 20,000 queued) and no leased rows to step over (another instance's accepts, leased
    // to it on insert). Leased rows, expired or not, are found through events_leased. events_next
    // goes too: with statistics the planner walked it for claims, stepping over every leased row.
    concurrently: [
      "CREATE INDEX CONCURRENTLY IF NOT EXISTS events_free ON events (action, next_attempt_at, id) WHERE status = 'queued' AND lease_until IS NULL",
      'DROP INDEX CONCURRENTLY IF EXISTS events_due',
      'DROP INDEX CONCURRENTLY IF EXISTS events_next',
    ],
  },
  {
    version: 6,
    name: 'dead events counted without reading the rest',
    // /metrics counts queued and dead events at every scrape (queueStats): queued ones through
    // events_free and events_leased, dead ones through this (few rows, written only when an event
    // dies). Before, each scrape read the whole table: 450 ms at 1,000,000 events.
    concurrently: ["CREATE INDEX CONCURRENTLY IF NOT EXISTS events_dead ON events (action) WHERE status = 'dead'"],
  },
  {
    version: 7,
    name: "the operator's event list by status, endpoint or action",
    // The admin API's list and filter retry (events/admin.ts, listSql) walk one of these backwards
    // from the newest row and stop at the page's end (events_received serves the unfiltered list):
    // without them a status or endpoint filter read every event of the status, then sorted.
    concurrently: [
      'CREATE INDEX CONCURRENTLY IF NOT EXISTS events_status_received ON events (status, received_at, id)',
      'CREATE INDEX CONCURRENTLY IF NOT EXISTS events_endpoint_received ON events (endpoint, received_at, id)',
      'CREATE INDEX CONCURRENTLY IF NOT EXISTS events_action_received ON events (action, received_at, id)',
    ],
  },
  {
    version: 8,
    name: 'received headers per event, the start of the answer per attempt',
    // Nullable, no default: a catalog change only (no table rewrite, a brief ACCESS EXCLUSIVE
    // lock); rows from before stay null (not recorded then).
    sql: `
ALTER TABLE events ADD COLUMN headers text;
ALTER TABLE attempts ADD COLUMN response_snippet text;
`,
  },
  {
    version: 9,
    name: 'the trace context each event was received in',
    // Nullable, no default, as version 8: a catalog change only; events from before have none.
    sql: 'ALTER TABLE events ADD COLUMN trace_context text;',
  },
];

export const POSTGRES_SCHEMA_VERSION = latestVersion(MIGRATIONS);

/** The version recorded in the database: 0 when gatehouse's schema is not there at all. */
export async function schemaVersion(pool: pg.Pool): Promise<number> {
  const { rows } = await pool.query<{ version: number | null }>(
    "SELECT CASE WHEN to_regclass('schema_migrations') IS NULL THEN 0 END AS version",
  );
  if (rows[0]!.version === 0) return 0;
  const found = await pool.query<{ version: number | null }>('SELECT max(version) AS version FROM schema_migrations');
  return found.rows[0]!.version ?? 0;
}

/**
 * Brings the schema to POSTGRES_SCHEMA_VERSION (see migratePostgres: instances starting together
 * take turns). Refuses a database migrated by a newer gatehouse (its schema may not be what this
 * code writes).
 */
export async function migrate(pool: pg.Pool, logger?: Pick<Logger, 'warn'>): Promise<MigrationResult> {
  return withClient(pool, (client) => migratePostgres(client, MIGRATIONS, logger));
}

/**
 * A pool on a database whose schema is current: migrated first (`migrate`: a server, `storage
 * migrate`), or else checked, refusing with what to run when the schema is missing, behind (the
 * tables a part needs may not be there) or newer than this gatehouse. Closed again on refusal;
 * a database that cannot be reached is refused in one line.
 *
 * `waitForDatabase` (a server with `storage.requireAtStart` false): the pool is returned after the
 * first check whatever its outcome, behind this process's SchemaGate, which repeats the check in
 * the background until it passes.
 */
export async function openMigratedPool(
  storage: PostgresStorageConfig,
  options: { migrate?: boolean; logger?: Pick<Logger, 'warn' | 'info' | 'error'>; waitForDatabase?: boolean } = {},
): Promise<pg.Pool> {
  const check = (pool: pg.Pool) => checkSchema(pool, storage, options);
  if (options.waitForDatabase) {
    const gate = schemaGateFor(storage, check, options.logger);
    const pool = reportingLostConnections(new GatedPool(poolConfig(storage), gate), options.logger);
    // The first check is waited for: a database that answers is migrated before anything listens, as
    // without the gate; one that does not (refused at once, or CHECK_TIMEOUT_MS) is waited for in the background.
    await gate.enter().catch(() => {});
    return pool;
  }
  const pool = createPool(storage, options.logger);
  try {
    await check(pool);
  } catch (err) {
    await pool.end().catch(() => {});
    throw err instanceof UsageError ? err : unreachable(storage, err);
  }
  return pool;
}

async function checkSchema(
  pool: pg.Pool,
  storage: PostgresStorageConfig,
  options: { migrate?: boolean; logger?: Pick<Logger, 'warn'> },
): Promise<void> {
  if (options.migrate) {
    await migrate(pool, options.logger);
    return;
  }
  const version = await schemaVersion(pool);
  if (version < POSTGRES_SCHEMA_VERSION) {
    throw new UsageError(
      `the database at ${describeUrl(storage.url)} ${version === 0 ? 'has no gatehouse schema' : `has schema version ${version}, older than this gatehouse's ${POSTGRES_SCHEMA_VERSION}`}: run \`gatehouse storage migrate\` (the server also does at start)`,
    );
  }
  if (version > POSTGRES_SCHEMA_VERSION) throw new UsageError(newerSchemaMessage(version, POSTGRES_SCHEMA_VERSION));
}
