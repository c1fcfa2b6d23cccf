import { existsSync } from 'node:fs';
import Database from 'better-sqlite3';
import { hasTable } from '../../sqlite.js';
import type { AcceptResult, NewEvent, SqliteEventStore } from '../../webhooks/store.js';

/**
 * What gatehouse keeps per Gmail account: the sealed OAuth grant, the mailbox cursor (Gmail's
 * historyId), the watch, and what the status command shows. Message ids already turned into
 * events are remembered, so a redelivered notification or a resync enqueues nothing twice.
 *
 * Behind an interface like the event store; the SQLite one shares the event store's file so
 * the emails enqueued and the cursor move commit in one transaction.
 */
export interface GmailAccountState {
  account: string;
  clientId: string;
  /** The Google Cloud project setup used with this grant (the topic's); null when stored by an older gatehouse. */
  project: string | null;
  /** `{ clientSecret, refreshToken }` sealed with GATEHOUSE_SECRET_KEY (see src/secrets.ts). */
  sealedGrant: string;
  /** Gmail historyId (a decimal string: uint64) up to which the mailbox has been read. */
  cursor: string | null;
  cursorAt: number | null;
  watchExpiration: number | null;
  watchRenewedAt: number | null;
  lastNotificationAt: number | null;
  lastError: string | null;
  lastErrorAt: number | null;
  emailsEnqueued: number;
}

export interface GmailState {
  get(account: string): Promise<GmailAccountState | undefined>;
  /** Stores (or replaces) the grant and the project it is used with; the cursor and counters stay. */
  saveGrant(account: string, clientId: string, sealedGrant: string, project: string): Promise<void>;
  /** The project the stored grant is used with, when setup ran with another one. */
  saveProject(account: string, project: string): Promise<void>;
  /** After users.watch: the expiration, and the cursor when there was none yet (never moved back). */
  recordWatch(account: string, historyId: string, expiration: number, now: number): Promise<void>;
  recordError(account: string, error: string | null, now: number): Promise<void>;
  /** Ids among `ids` already enqueued for this account. */
  seen(account: string, ids: string[]): Promise<Set<string>>;
  /**
   * One transaction: enqueues each email not seen before, remembers their ids, moves the cursor
   * forward to `cursor`. Resolves once durable; returns how many were enqueued.
   */
  commitEmails(account: string, emails: { messageId: string; event: NewEvent }[], cursor: string, now: number): Promise<number>;
}

const SCHEMA = `
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

/** Seen ids are kept this long: longer than any resync looks back (see mailbox.ts). */
const SEEN_RETENTION_MS = 30 * 24 * 60 * 60 * 1000;

interface AccountRow {
  account: string;
  client_id: string;
  project: string | null;
  sealed_grant: string;
  cursor: string | null;
  cursor_at: number | null;
  watch_expiration: number | null;
  watch_renewed_at: number | null;
  last_notification_at: number | null;
  last_error: string | null;
  last_error_at: number | null;
  emails_enqueued: number;
}

/** Gmail cursors compare as unsigned 64-bit numbers, not as strings. */
export function historyIdAfter(a: string, b: string | null): boolean {
  return b === null || BigInt(a) > BigInt(b);
}

export class SqliteGmailState implements GmailState {
  private readonly statements;

  constructor(private readonly store: SqliteEventStore) {
    const db: Database.Database = store.database;
    db.exec(SCHEMA);
    // Files written before the project was kept with the grant.
    if (!db.prepare<[], { name: string }>('PRAGMA table_info(gmail_accounts)').all().some((c) => c.name === 'project')) {
      db.exec('ALTER TABLE gmail_accounts ADD COLUMN project TEXT');
    }
    this.statements = {
      get: db.prepare<[string], AccountRow>('SELECT * FROM gmail_accounts WHERE account = ?'),
      saveGrant: db.prepare('INSERT INTO gmail_accounts (account, client_id, sealed_grant, project) VALUES (?, ?, ?, ?) ON CONFLICT (account) DO UPDATE SET client_id = excluded.client_id, sealed_grant = excluded.sealed_grant, project = excluded.project'),
      saveProject: db.prepare('UPDATE gmail_accounts SET project = ? WHERE account = ?'),
      // A renewal that works clears the last error (as a handled notification does).
      watch: db.prepare('UPDATE gmail_accounts SET watch_expiration = ?, watch_renewed_at = ?, cursor = coalesce(cursor, ?), cursor_at = coalesce(cursor_at, ?), last_error = NULL, last_error_at = NULL WHERE account = ?'),
      error: db.prepare('UPDATE gmail_accounts SET last_error = ?, last_error_at = ? WHERE account = ?'),
      seen: db.prepare<[string, string], { message_id: string }>('SELECT message_id FROM gmail_seen WHERE account = ? AND message_id = ?'),
      remember: db.prepare('INSERT INTO gmail_seen (account, message_id, event_id, seen_at) VALUES (?, ?, ?, ?)'),
      forgetOld: db.prepare('DELETE FROM gmail_seen WHERE account = ? AND seen_at < ?'),
      advance: db.prepare('UPDATE gmail_accounts SET cursor = ?, cursor_at = ?, last_notification_at = ?, last_error = NULL, emails_enqueued = emails_enqueued + ? WHERE account = ?'),
    };
  }

  async get(account: string): Promise<GmailAccountState | undefined> {
    const row = this.statements.get.get(account);
    if (!row) return undefined;
    return {
      account: row.account,
      clientId: row.client_id,
      project: row.project,
      sealedGrant: row.sealed_grant,
      cursor: row.cursor,
      cursorAt: row.cursor_at,
      watchExpiration: row.watch_expiration,
      watchRenewedAt: row.watch_renewed_at,
      lastNotificationAt: row.last_notification_at,
      lastError: row.last_error,
      lastErrorAt: row.last_error_at,
      emailsEnqueued: row.emails_enqueued,
    };
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

  async commitEmails(account: string, emails: { messageId: string; event: NewEvent }[], cursor: string, now: number): Promise<number> {
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
}

/**
 * The project stored with an account's grant, read without creating or changing anything (setup
 * reads it before it opens the store, and --dry-run never opens it): undefined when the file,
 * the table or the row is not there.
 */
export function peekStoredProject(file: string, account: string): string | undefined {
  if (!existsSync(file)) return undefined;
  let db: Database.Database | undefined;
  try {
    db = new Database(file, { readonly: true, fileMustExist: true });
    const columns = db.prepare<[], { name: string }>('PRAGMA table_info(gmail_accounts)').all();
    if (!columns.some((c) => c.name === 'project')) return undefined;
    return db.prepare<[string], { project: string | null }>('SELECT project FROM gmail_accounts WHERE account = ?').get(account)?.project ?? undefined;
  } catch {
    return undefined; // not a store this can read: as if nothing were kept (opening it for real says why)
  } finally {
    db?.close();
  }
}

/**
 * The Gmail state an SQLite store holds, in words (`["2 Gmail accounts", …]`); empty when none.
 * Reads only, creates nothing. For `gatehouse storage copy`, which cannot move it to postgres yet
 * and so refuses rather than leave it behind.
 */
export function describeGmailState(db: Database.Database): string[] {
  const count = (sql: string) => db.prepare<[], { n: number }>(sql).get()!.n;
  const found: string[] = [];
  if (hasTable(db, 'gmail_accounts')) {
    const accounts = count('SELECT count(*) AS n FROM gmail_accounts');
    if (accounts > 0) found.push(`${accounts} Gmail account${accounts === 1 ? '' : 's'}`);
  }
  if (hasTable(db, 'gmail_seen')) {
    const seen = count('SELECT count(*) AS n FROM gmail_seen');
    if (seen > 0) found.push(`${seen} remembered Gmail message id${seen === 1 ? '' : 's'}`);
  }
  return found;
}
