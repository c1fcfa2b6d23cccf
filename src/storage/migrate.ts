import type Database from 'better-sqlite3';
import type pg from 'pg';
import type { Logger } from 'pino';
import { UsageError } from '../errors.js';

/**
 * The one migration runner: each engine's schema is a list of numbered migrations (1, 2, 3…,
 * append only: a released migration is never edited), applied in order, each once, and recorded
 * with what it did. Storage a newer gatehouse migrated is refused (its schema may not be what
 * this code writes). The lists live with their drivers (src/storage/sqlite/migrations.ts,
 * src/storage/postgres/migrations.ts); how an engine keeps its version, and how it applies one
 * migration atomically and one process at a time, is below.
 */
export interface Migration {
  readonly version: number;
  readonly name: string;
}

export type StorageEngine = 'sqlite' | 'postgres';

export interface MigrationResult {
  from: number;
  to: number;
  applied: number[];
}

/** The version a list brings storage to: its last. Throws unless the list is numbered 1, 2, 3… (checked once, at load). */
export function latestVersion(migrations: readonly Migration[]): number {
  migrations.forEach((m, i) => {
    if (m.version !== i + 1) throw new Error(`migration ${m.name} is numbered ${m.version}, expected ${i + 1}`);
  });
  return migrations.length;
}

/** The message for storage at `found`, newer than this gatehouse's `known`. */
export function newerSchemaMessage(found: number, known: number): string {
  return `the database schema is at version ${found}, newer than this gatehouse knows (${known}): upgrade gatehouse`;
}

/** The migrations storage at version `from` still needs, in order; refuses storage newer than the list. */
export function pendingMigrations<M extends Migration>(migrations: readonly M[], from: number): M[] {
  const latest = migrations.length;
  if (from > latest) throw new UsageError(newerSchemaMessage(from, latest)); // what to do, not a crash
  return migrations.slice(from);
}

// ─── SQLite: the version in PRAGMA user_version, each migration in one IMMEDIATE transaction ───

/**
 * A SQLite migration: SQL, or a step that reads the file first (a column added only where
 * missing). `adopts`: written to be run again (IF NOT EXISTS…), for the baseline, which takes
 * over files earlier builds made (see migrateSqlite).
 */
export interface SqliteMigration extends Migration {
  readonly up: string | ((db: Database.Database) => void);
  readonly adopts?: boolean;
}

/**
 * Brings a SQLite file to the list's last version. Each migration runs in a transaction of its
 * own with its user_version (BEGIN IMMEDIATE: the file's write lock, waited for as long as its
 * busy_timeout, so two processes opening one file take turns and the second finds nothing left).
 *
 * The baseline (`adopts`) is run again at every open of a file still at its version: builds
 * before the runner created each part's tables when that part first ran (the events store set
 * user_version, the channel and Gmail stores did not), so a file at that version may lack some,
 * and one at 0 may hold them all. Run as those builds did: each statement on its own, only
 * creating what is missing, so opening a complete file writes nothing.
 */
export function migrateSqlite(db: Database.Database, migrations: readonly SqliteMigration[]): MigrationResult {
  const version = (): number => db.pragma('user_version', { simple: true }) as number;
  const from = version();
  const to = migrations.length;
  const applied: number[] = [];
  const adopting = migrations[from - 1];
  if (adopting?.adopts) runStep(db, adopting);
  for (const migration of pendingMigrations(migrations, from)) {
    db.transaction(() => {
      if (version() >= migration.version) return; // another process applied it while this one waited
      runStep(db, migration);
      db.pragma(`user_version = ${migration.version}`);
      applied.push(migration.version);
    }).immediate();
  }
  return { from, to, applied };
}

function runStep(db: Database.Database, migration: SqliteMigration): void {
  if (typeof migration.up === 'string') db.exec(migration.up);
  else migration.up(db);
}

// ─── PostgreSQL: versions in schema_migrations, under an advisory lock ───

/**
 * A PostgreSQL migration.
 * - `sql`: in one transaction, all or nothing.
 * - `concurrently`: statements run one by one outside a transaction, for CREATE/DROP INDEX
 *   CONCURRENTLY, which do not block the instances still serving on the table (a plain CREATE
 *   INDEX holds off every insert for the whole build). Each must be safe to run again (IF [NOT]
 *   EXISTS): a migration stopped half way is run again from its start. An index a failed
 *   concurrent build left invalid is dropped before it is created again.
 */
export type PostgresMigration = Migration & ({ sql: string } | { concurrently: readonly string[] });

/** pg_advisory_lock key of gatehouse's migrations (any constant; "gatehous" in ASCII). */
const MIGRATION_LOCK_KEY = '7449363237540164979';
const MIGRATION_LOCK_POLL_MS = 100;
const MIGRATION_LOCK_REPORT_MS = 10_000;
/** The longest a migration statement is waited for on the client side (setTimeout's limit, ~24 days: in effect none). */
const MIGRATION_QUERY_TIMEOUT_MS = 2 ** 31 - 1;

type Queryable = Pick<pg.PoolClient, 'query'>;

/** `client`, its queries without the pool's query_timeout (a per-query 0 would fall back to the pool's). */
function withoutQueryTimeout(client: pg.PoolClient): Queryable {
  return {
    query: ((text: string, values?: unknown[]) =>
      client.query({
        text,
        values,
        query_timeout: MIGRATION_QUERY_TIMEOUT_MS,
      } as pg.QueryConfig)) as pg.PoolClient['query'],
  };
}

/** An index a CREATE INDEX CONCURRENTLY that failed left behind (invalid: never used, still maintained): dropped. */
async function dropIfInvalid(client: Queryable, index: string): Promise<void> {
  const { rows } = await client.query<{ invalid: boolean }>(
    'SELECT NOT indisvalid AS invalid FROM pg_index WHERE indexrelid = to_regclass($1)',
    [index],
  );
  if (rows[0]?.invalid) await client.query(`DROP INDEX CONCURRENTLY IF EXISTS ${index}`);
}

/**
 * Brings a database to the list's last version, on `pooled` (a connection of its own). Under a
 * session advisory lock, so instances starting together take turns: the first applies, the
 * others find nothing left to do.
 */
export async function migratePostgres(
  pooled: pg.PoolClient,
  migrations: readonly PostgresMigration[],
  logger?: Pick<Logger, 'warn'>,
): Promise<MigrationResult> {
  // A migration's statements wait as long as they take: the pool's query_timeout (2 s on the
  // lockout's) would give up on the client side only, while the server went on building under
  // the lock, and fail the start.
  const client = withoutQueryTimeout(pooled);
  // Polled, not waited for in one statement: a session blocked inside pg_advisory_lock holds a
  // snapshot, and CREATE INDEX CONCURRENTLY (in the holder's migration) waits for every older
  // snapshot: the two would deadlock.
  let waitingSince = Date.now();
  while (
    !(
      await client.query<{ locked: boolean }>('SELECT pg_try_advisory_lock($1::bigint) AS locked', [MIGRATION_LOCK_KEY])
    ).rows[0]!.locked
  ) {
    if (Date.now() - waitingSince >= MIGRATION_LOCK_REPORT_MS) {
      waitingSince = Date.now();
      const { rows: holders } = await client.query<{ pid: number; query: string }>(
        `SELECT a.pid, left(a.query, 120) AS query FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
          WHERE l.locktype = 'advisory' AND l.granted AND ((l.classid::bigint << 32) | l.objid::bigint) = $1::bigint`,
        [MIGRATION_LOCK_KEY],
      );
      logger?.warn({ holders }, 'waiting for another gatehouse to finish migrating the schema');
    }
    await new Promise((resolve) => setTimeout(resolve, MIGRATION_LOCK_POLL_MS));
  }
  try {
    await client.query(`CREATE TABLE IF NOT EXISTS schema_migrations (
      version    integer PRIMARY KEY,
      name       text NOT NULL,
      applied_at timestamptz NOT NULL DEFAULT now()
    )`);
    const { rows } = await client.query<{ version: number | null }>(
      'SELECT max(version) AS version FROM schema_migrations',
    );
    const from = rows[0]!.version ?? 0;
    const applied: number[] = [];
    for (const migration of pendingMigrations(migrations, from)) {
      const record = () =>
        client.query('INSERT INTO schema_migrations (version, name) VALUES ($1, $2)', [
          migration.version,
          migration.name,
        ]);
      if ('concurrently' in migration) {
        for (const statement of migration.concurrently) {
          const building = /^CREATE INDEX CONCURRENTLY IF NOT EXISTS (\w+)/.exec(statement)?.[1];
          if (building) await dropIfInvalid(client, building);
          await client.query(statement);
        }
        await record();
      } else {
        await client.query('BEGIN');
        try {
          await client.query(migration.sql);
          await record();
          await client.query('COMMIT');
        } catch (err) {
          await client.query('ROLLBACK').catch(() => {});
          throw err;
        }
      }
      applied.push(migration.version);
    }
    return { from, to: migrations.length, applied };
  } finally {
    await client.query('SELECT pg_advisory_unlock($1::bigint)', [MIGRATION_LOCK_KEY]).catch(() => {});
  }
}
