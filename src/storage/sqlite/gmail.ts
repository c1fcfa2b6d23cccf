import { existsSync } from 'node:fs';
import Database from 'better-sqlite3';
import { hasTable } from './database.js';
import type { AcceptResult, NewEvent } from '../contracts/events.js';
import {
  historyIdAfter,
  KeyedQueue,
  SEEN_RETENTION_MS,
  toAccountState,
  type ExportedGmailState,
  type GmailAccountRow,
  type GmailAccountState,
  type GmailSeenRow,
  type GmailStore,
} from '../contracts/gmail.js';
import type { SealedChange } from '../contracts/sealed.js';
import type { SqliteEventStore } from './events.js';

/**
 * Gmail state in the event store's SQLite file, on its connection: commitEmails is one of the
 * event store's group commits (see SqliteEventStore.atomically). One server per file, so
 * `exclusively` needs only this process's queue.
 */
export class SqliteGmailStore implements GmailStore {
  private readonly statements;
  private readonly queue = new KeyedQueue();

  constructor(private readonly store: SqliteEventStore) {
    const db: Database.Database = store.database; // migrated when the event store opened it (src/storage/sqlite/migrations.ts)
    this.statements = {
      get: db.prepare<[string], GmailAccountRow>('SELECT * FROM gmail_accounts WHERE account = ?'),
      saveGrant: db.prepare(
        'INSERT INTO gmail_accounts (account, client_id, sealed_grant, project) VALUES (?, ?, ?, ?) ON CONFLICT (account) DO UPDATE SET client_id = excluded.client_id, sealed_grant = excluded.sealed_grant, project = excluded.project',
      ),
      saveProject: db.prepare('UPDATE gmail_accounts SET project = ? WHERE account = ?'),
      // A renewal that works clears the last error (as a handled notification does).
      watch: db.prepare(
        'UPDATE gmail_accounts SET watch_expiration = ?, watch_renewed_at = ?, cursor = coalesce(cursor, ?), cursor_at = coalesce(cursor_at, ?), last_error = NULL, last_error_at = NULL WHERE account = ?',
      ),
      error: db.prepare('UPDATE gmail_accounts SET last_error = ?, last_error_at = ? WHERE account = ?'),
      seen: db.prepare<[string, string], { message_id: string }>(
        'SELECT message_id FROM gmail_seen WHERE account = ? AND message_id = ?',
      ),
      remember: db.prepare('INSERT INTO gmail_seen (account, message_id, event_id, seen_at) VALUES (?, ?, ?, ?)'),
      forgetOld: db.prepare('DELETE FROM gmail_seen WHERE account = ? AND seen_at < ?'),
      sealedGrants: db.prepare<[], { account: string; sealed: string }>(
        'SELECT account, sealed_grant AS sealed FROM gmail_accounts ORDER BY account',
      ),
      replaceSealed: db.prepare('UPDATE gmail_accounts SET sealed_grant = ? WHERE account = ? AND sealed_grant = ?'),
      advance: db.prepare(
        'UPDATE gmail_accounts SET cursor = ?, cursor_at = ?, last_notification_at = ?, last_error = NULL, emails_enqueued = emails_enqueued + ? WHERE account = ?',
      ),
    };
  }

  async get(account: string): Promise<GmailAccountState | undefined> {
    const row = this.statements.get.get(account);
    return row && toAccountState(row);
  }

  async saveGrant(account: string, clientId: string, sealedGrant: string, project: string): Promise<void> {
    await this.store.atomically(() => this.statements.saveGrant.run(account, clientId, sealedGrant, project));
  }

  async saveProject(account: string, project: string): Promise<void> {
    await this.store.atomically(() => this.statements.saveProject.run(project, account));
  }

  async recordWatch(account: string, historyId: string, expiration: number, now: number): Promise<void> {
    await this.store.atomically(() => this.statements.watch.run(expiration, now, historyId, now, account));
  }

  async recordError(account: string, error: string | null, now: number): Promise<void> {
    await this.store.atomically(() => this.statements.error.run(error, error === null ? null : now, account));
  }

  async seen(account: string, ids: string[]): Promise<Set<string>> {
    return new Set(ids.filter((id) => this.statements.seen.get(account, id) !== undefined));
  }

  async commitEmails(
    account: string,
    emails: { messageId: string; event: NewEvent }[],
    cursor: string,
    now: number,
  ): Promise<number> {
    return this.store.atomically(({ accept }) => {
      let enqueued = 0;
      for (const { messageId, event } of emails) {
        // Checked again inside the transaction: the seen() read before it may be stale.
        if (this.statements.seen.get(account, messageId)) continue;
        const result: AcceptResult = accept(event);
        this.statements.remember.run(account, messageId, result.id, now);
        if (!result.duplicate) enqueued++;
      }
      const current = this.statements.get.get(account);
      const next = current && !historyIdAfter(cursor, current.cursor) ? current.cursor : cursor;
      this.statements.advance.run(next, now, now, enqueued, account);
      this.statements.forgetOld.run(account, now - SEEN_RETENTION_MS);
      return enqueued;
    });
  }

  exclusively<T>(account: string, work: () => Promise<T>): Promise<T> {
    return this.queue.run(account, work);
  }

  async sealedGrants(): Promise<{ account: string; sealed: string }[]> {
    return this.statements.sealedGrants.all();
  }

  async replaceSealedGrants(changes: SealedChange[]): Promise<number> {
    return this.store.atomically(() =>
      changes.reduce((n, c) => n + this.statements.replaceSealed.run(c.to, c.key, c.from).changes, 0),
    );
  }
}

/**
 * The project stored with an account's grant, read without creating or changing anything (setup
 * reads it before it opens the store, and --dry-run never opens it): undefined when the file,
 * the table or the row is not there.
 */
export function peekSqliteStoredProject(file: string, account: string): string | undefined {
  if (!existsSync(file)) return undefined;
  let db: Database.Database | undefined;
  try {
    db = new Database(file, { readonly: true, fileMustExist: true });
    const columns = db.prepare<[], { name: string }>('PRAGMA table_info(gmail_accounts)').all();
    if (!columns.some((c) => c.name === 'project')) return undefined;
    return (
      db
        .prepare<[string], { project: string | null }>('SELECT project FROM gmail_accounts WHERE account = ?')
        .get(account)?.project ?? undefined
    );
  } catch {
    return undefined; // not a store this can read: as if nothing were kept (opening it for real says why)
  } finally {
    db?.close();
  }
}

/**
 * Every Gmail row an SQLite file holds (none when its tables are not there), for `gatehouse
 * storage copy`. Reads only, creates nothing; a file from before the project column reads it as null.
 */
export function exportGmailState(db: Database.Database): ExportedGmailState {
  if (!hasTable(db, 'gmail_accounts')) return { accounts: [], seen: [] };
  const hasProject = db
    .prepare<[], { name: string }>('PRAGMA table_info(gmail_accounts)')
    .all()
    .some((c) => c.name === 'project');
  const accounts = db
    .prepare<[], GmailAccountRow>(
      `SELECT *${hasProject ? '' : ', NULL AS project'} FROM gmail_accounts ORDER BY account`,
    )
    .all();
  const seen = hasTable(db, 'gmail_seen')
    ? db.prepare<[], GmailSeenRow>('SELECT * FROM gmail_seen ORDER BY account, message_id').all()
    : [];
  return { accounts, seen };
}
