import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import Database from 'better-sqlite3';
import { UsageError } from '../../errors.js';
import { assertSafeSqliteBuild } from './database.js';

/** The file's writer lock is held by another process (a server, or a `storage copy` under way): `holder` is its pid, when known. */
export class WriterLockBusyError extends UsageError {
  constructor(
    readonly file: string,
    readonly holder: number | undefined,
  ) {
    super(
      `storage.path ${file} is in use by another gatehouse server (${holder ? `pid ${holder}` : 'pid unknown'}): one server per SQLite file. ` +
        'Stop that one first, or run several instances on storage.driver "postgres".',
    );
  }
}

/** A held single-writer lock on an SQLite store; `release` is idempotent. */
export interface WriterLock {
  release(): void;
}

/**
 * Makes this process the one server writing `file` (one server per SQLite file: its leases live
 * in that server's memory). The lock is an exclusive SQLite lock on `<file>.server-lock`, held by
 * the operating system for as long as this process lives, so a server killed with -9 leaves
 * nothing stale behind and a restarted one, whatever its pid, gets it at once. `<file>.server-pid`
 * beside it names the holder for the message a second server gets. The CLI takes no lock: it
 * works beside a running server.
 */
export function acquireWriterLock(file: string): WriterLock {
  assertSafeSqliteBuild();
  mkdirSync(path.dirname(file), { recursive: true });
  const pidFile = `${file}.server-pid`;
  const lock = new Database(`${file}.server-lock`);
  try {
    lock.pragma('busy_timeout = 0');
    // EXCLUSIVE locking mode keeps the lock of the first write transaction until the connection closes.
    lock.pragma('locking_mode = EXCLUSIVE');
    lock.exec('BEGIN EXCLUSIVE; CREATE TABLE IF NOT EXISTS held (pid INTEGER); COMMIT;');
  } catch (err) {
    lock.close();
    if ((err as { code?: string }).code !== 'SQLITE_BUSY') throw err;
    throw new WriterLockBusyError(file, readHolder(pidFile));
  }
  writeFileSync(pidFile, `${process.pid}\n`);
  let released = false;
  return {
    release() {
      if (released) return;
      released = true;
      if (readHolder(pidFile) === process.pid) rmSync(pidFile, { force: true });
      // The lock file itself stays: removing it while another process opens it would let two hold "it".
      lock.close();
    },
  };
}

function readHolder(pidFile: string): number | undefined {
  try {
    const pid = Number(readFileSync(pidFile, 'utf8').trim());
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}
