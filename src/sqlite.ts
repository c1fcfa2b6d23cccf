import { mkdirSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';

/**
 * Opens gatehouse's SQLite file the one way every part uses it: WAL (readers never block the
 * writer, so the CLI works beside the server), synchronous=FULL (a commit survives power loss),
 * and a 5 s wait for another process's write lock. `mustExist`: open an existing file only (the
 * CLI), rather than create an empty one at a mistyped path.
 */
export function openDatabase(file: string, options: { mustExist?: boolean } = {}): Database.Database {
  if (!options.mustExist) mkdirSync(path.dirname(file), { recursive: true });
  const db = new Database(file, { fileMustExist: options.mustExist ?? false });
  db.pragma('journal_mode = WAL');
  db.pragma('synchronous = FULL');
  db.pragma('foreign_keys = ON');
  db.pragma('busy_timeout = 5000');
  return db;
}

/** Whether `db` has a table `name` (a part's tables exist only once that part has run on the file). */
export function hasTable(db: Database.Database, name: string): boolean {
  return db.prepare<[string], { n: number }>("SELECT count(*) AS n FROM sqlite_master WHERE type = 'table' AND name = ?").get(name)!.n > 0;
}
