import { mkdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import Database from 'better-sqlite3';
import { UsageError } from '../../errors.js';
import { migrateSqlite } from '../migrate.js';
import { SQLITE_MIGRATIONS } from './migrations.js';

/**
 * Opens gatehouse's SQLite file the one way every part uses it: WAL (readers never block the
 * writer, so the CLI works beside the server), synchronous=FULL (a commit survives power loss),
 * and a 5 s wait for another process's write lock; its schema brought to the latest version
 * (src/storage/sqlite/migrations.ts). `mustExist`: open an existing file only (the CLI), rather
 * than create an empty one at a mistyped path.
 */
export function openDatabase(file: string, options: { mustExist?: boolean } = {}): Database.Database {
  assertSafeSqliteBuild();
  if (!options.mustExist) mkdirSync(path.dirname(file), { recursive: true });
  const db = new Database(file, { fileMustExist: options.mustExist ?? false });
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = FULL');
  db.pragma('foreign_keys = ON');
  db.pragma('busy_timeout = 5000');
  try {
    migrateSqlite(db, SQLITE_MIGRATIONS);
  } catch (err) {
    db.close();
    throw err;
  }
  return db;
}

/** Whether `db` has a table `name` (a part's tables exist only once that part has run on the file). */
export function hasTable(db: Database.Database, name: string): boolean {
  return (
    db
      .prepare<[string], { n: number }>("SELECT count(*) AS n FROM sqlite_master WHERE type = 'table' AND name = ?")
      .get(name)!.n > 0
  );
}

/**
 * Node 24.19 (and 26.4) headers give `node::ObjectWrap` a destructor that calls
 * RemoveEnvironmentCleanupHook, which aborts the process when the garbage collector frees a
 * wrapped object with no JS context entered (nodejs/node#65446): better-sqlite3 12 subclasses
 * ObjectWrap, so a build against those headers aborts on a collected Statement, at exit or under
 * load. better-sqlite3 12 never calls that function itself, so its presence in the addon's
 * imports marks such a build. Refused up front: a clear error at start beats SIGABRT in traffic.
 */
const checkedBuilds = new Map<string, string | null>();
export function assertSafeSqliteBuild(addonPath = sqliteAddonPath()): void {
  if (addonPath === undefined) return;
  let problem = checkedBuilds.get(addonPath);
  if (problem === undefined) checkedBuilds.set(addonPath, (problem = unsafeBuildProblem(addonPath)));
  if (problem) throw new UsageError(problem);
}

/** The problem with the addon at `addonPath`, or null (also when it cannot be read: loading it says why). */
export function unsafeBuildProblem(addonPath: string): string | null {
  let binary: Buffer;
  try {
    binary = readFileSync(addonPath);
  } catch {
    return null;
  }
  if (!binary.includes('RemoveEnvironmentCleanupHook')) return null;
  return (
    `better-sqlite3's native module (${addonPath}) was built against Node.js headers whose node::ObjectWrap aborts the process ` +
    'when a SQLite statement is garbage-collected (Node 24.19 and later; nodejs/node#65446). Rebuild it against Node 24.18.1 headers ' +
    '(README, "Node versions"), run gatehouse on Node 22, or use storage.driver "postgres".'
  );
}

let resolvedAddonPath: string | undefined | null = null;
function sqliteAddonPath(): string | undefined {
  if (resolvedAddonPath !== null) return resolvedAddonPath;
  try {
    resolvedAddonPath = path.join(
      path.dirname(createRequire(import.meta.url).resolve('better-sqlite3/package.json')),
      'build',
      'Release',
      'better_sqlite3.node',
    );
  } catch {
    resolvedAddonPath = undefined;
  }
  return resolvedAddonPath;
}
