import type { NewEvent } from './events.js';
import type { SealedChange } from './sealed.js';

/**
 * The Gmail state contract: what gatehouse keeps per Gmail account, with no SQL in sight. Each
 * driver builds on its engine's event store (src/storage/sqlite/gmail.ts on the SQLite file's
 * connection, src/storage/postgres/gmail.ts on the database's pool), so the emails enqueued and
 * the cursor move commit in one transaction. The same contract tests run against each
 * (test/storage/gmail-contract.ts).
 *
 * Kept: the sealed OAuth grant, the mailbox cursor (Gmail's historyId), the watch, and what the
 * status command shows. Message ids already turned into events are remembered, so a
 * redelivered notification or a resync enqueues nothing twice. Access tokens are not kept: each
 * process redeems the refresh token itself (Google's do not rotate, so instances never race on
 * one).
 */
export interface GmailAccountState {
  account: string;
  clientId: string;
  /** The Google Cloud project setup used with this grant (the topic's); null when stored by an older gatehouse. */
  project: string | null;
  /** `{ clientSecret, refreshToken }` sealed with GATEHOUSE_SECRET_KEY (see src/storage/secrets.ts). */
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

export interface GmailStore {
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
   * forward to `cursor` (never back). Resolves once durable; returns how many were enqueued.
   */
  commitEmails(
    account: string,
    emails: { messageId: string; event: NewEvent }[],
    cursor: string,
    now: number,
  ): Promise<number>;
  /**
   * Runs `work` (one notification: read the cursor, ask Gmail, commit) while no other caller, in
   * this process or (Postgres) any instance on the database, runs work for this account: one
   * mailbox notification is processed at a time. Waits its turn.
   */
  exclusively<T>(account: string, work: () => Promise<T>): Promise<T>;
  /** Every account's sealed grant (`storage reseal`). */
  sealedGrants(): Promise<{ account: string; sealed: string }[]>;
  /** One transaction: each grant replaced only while it is still `from`; returns how many were. */
  replaceSealedGrants(changes: SealedChange[]): Promise<number>;
}

/** Seen ids are kept this long: longer than any resync looks back (see src/integrations/gmail/mailbox.ts). */
export const SEEN_RETENTION_MS = 30 * 24 * 60 * 60 * 1000;

/** Gmail cursors compare as unsigned 64-bit numbers, not as strings. */
export function historyIdAfter(a: string, b: string | null): boolean {
  return b === null || BigInt(a) > BigInt(b);
}

/** A `gmail_accounts` row as both drivers store it (times in ms). */
export interface GmailAccountRow {
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

/** A `gmail_seen` row. */
export interface GmailSeenRow {
  account: string;
  message_id: string;
  event_id: string;
  seen_at: number;
}

/** Every Gmail row, as `gatehouse storage copy` moves them. */
export interface ExportedGmailState {
  accounts: GmailAccountRow[];
  seen: GmailSeenRow[];
}

export function toAccountState(row: GmailAccountRow): GmailAccountState {
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

/**
 * One caller at a time per key, in this process: each `run` starts once the previous one for its
 * key has settled. (Both drivers use it; Postgres adds a database lock for other instances.)
 */
export class KeyedQueue {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(key: string, work: () => Promise<T>): Promise<T> {
    const previous = this.tails.get(key) ?? Promise.resolve();
    const result = previous.then(() => work());
    const tail = result.catch(() => undefined);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return result;
  }
}
