import type pg from 'pg';
import type { NewEvent } from '../contracts/events.js';
import {
  historyIdAfter,
  KeyedQueue,
  SEEN_RETENTION_MS,
  toAccountState,
  type ExportedGmailState,
  type GmailAccountRow,
  type GmailAccountState,
  type GmailStore,
} from '../contracts/gmail.js';
import type { SealedChange } from '../contracts/sealed.js';
import type { PostgresEventStore } from './events.js';
import { NotEmpty } from './channels.js';
import { withClient } from './pool.js';

/** pg_advisory_lock class of "a notification of this mailbox is being processed" (the second key is hashtext(account)). */
const MAILBOX_LOCK_CLASS = 0x67680002;

/**
 * Gmail state in PostgreSQL, on the event store's pool. Several instances may get the same
 * mailbox's notifications (Pub/Sub pushes to any of them):
 * - `exclusively` holds a session advisory lock on the account for the whole notification
 *   (cursor read, Gmail calls, commit): the other instances wait their turn, then find the
 *   cursor moved and usually nothing left to do. A lost connection frees it (Postgres ends the
 *   session), so a dead instance never blocks the mailbox;
 * - commitEmails is one transaction with the events (PostgresEventStore.atomically), and
 *   locks the account row first, so even commits racing outside the lock are serialised: the
 *   seen ids are read again under it and the cursor never moves back.
 */
export class PostgresGmailStore implements GmailStore {
  private readonly pool: pg.Pool;
  private readonly queue = new KeyedQueue();

  constructor(private readonly store: PostgresEventStore) {
    this.pool = store.database;
  }

  async get(account: string): Promise<GmailAccountState | undefined> {
    const { rows } = await this.pool.query<GmailAccountRow>('SELECT * FROM gmail_accounts WHERE account = $1', [
      account,
    ]);
    return rows[0] && toAccountState(rows[0]);
  }

  async saveGrant(account: string, clientId: string, sealedGrant: string, project: string): Promise<void> {
    await this.pool.query(
      `INSERT INTO gmail_accounts (account, client_id, sealed_grant, project) VALUES ($1, $2, $3, $4)
       ON CONFLICT (account) DO UPDATE SET client_id = excluded.client_id, sealed_grant = excluded.sealed_grant, project = excluded.project`,
      [account, clientId, sealedGrant, project],
    );
  }

  async saveProject(account: string, project: string): Promise<void> {
    await this.pool.query('UPDATE gmail_accounts SET project = $2 WHERE account = $1', [account, project]);
  }

  async recordWatch(account: string, historyId: string, expiration: number, now: number): Promise<void> {
    // A renewal that works clears the last error (as a handled notification does).
    await this.pool.query(
      `UPDATE gmail_accounts SET watch_expiration = $2::bigint, watch_renewed_at = $3::bigint, cursor = coalesce(cursor, $4), cursor_at = coalesce(cursor_at, $3::bigint),
              last_error = NULL, last_error_at = NULL
        WHERE account = $1`,
      [account, expiration, now, historyId],
    );
  }

  async recordError(account: string, error: string | null, now: number): Promise<void> {
    await this.pool.query('UPDATE gmail_accounts SET last_error = $2, last_error_at = $3::bigint WHERE account = $1', [
      account,
      error,
      error === null ? null : now,
    ]);
  }

  async seen(account: string, ids: string[]): Promise<Set<string>> {
    if (ids.length === 0) return new Set();
    const { rows } = await this.pool.query<{ message_id: string }>(
      'SELECT message_id FROM gmail_seen WHERE account = $1 AND message_id = ANY($2::text[])',
      [account, ids],
    );
    return new Set(rows.map((r) => r.message_id));
  }

  async commitEmails(
    account: string,
    emails: { messageId: string; event: NewEvent }[],
    cursor: string,
    now: number,
  ): Promise<number> {
    return this.store.atomically(async ({ client, accept }) => {
      const {
        rows: [current],
      } = await client.query<{ cursor: string | null }>(
        'SELECT cursor FROM gmail_accounts WHERE account = $1 FOR UPDATE',
        [account],
      );
      // Checked again under the row lock: the seen() read before it may be stale.
      const ids = emails.map((e) => e.messageId);
      const { rows: seenRows } =
        ids.length > 0
          ? await client.query<{ message_id: string }>(
              'SELECT message_id FROM gmail_seen WHERE account = $1 AND message_id = ANY($2::text[])',
              [account, ids],
            )
          : { rows: [] };
      const seen = new Set(seenRows.map((r) => r.message_id));
      const fresh = emails.filter((e, i) => !seen.has(e.messageId) && ids.indexOf(e.messageId) === i);
      const results = await accept(fresh.map((e) => e.event));
      if (fresh.length > 0) {
        await client.query(
          'INSERT INTO gmail_seen (account, message_id, event_id, seen_at) SELECT $1, * FROM unnest($2::text[], $3::text[], $4::bigint[])',
          [account, fresh.map((e) => e.messageId), results.map((r) => r.id), fresh.map(() => now)],
        );
      }
      const enqueued = results.filter((r) => !r.duplicate).length;
      const next = current && !historyIdAfter(cursor, current.cursor) ? current.cursor : cursor;
      await client.query(
        `UPDATE gmail_accounts SET cursor = $2, cursor_at = $3::bigint, last_notification_at = $3::bigint, last_error = NULL, emails_enqueued = emails_enqueued + $4
          WHERE account = $1`,
        [account, next, now, enqueued],
      );
      await client.query('DELETE FROM gmail_seen WHERE account = $1 AND seen_at < $2::bigint', [
        account,
        now - SEEN_RETENTION_MS,
      ]);
      return enqueued;
    });
  }

  exclusively<T>(account: string, work: () => Promise<T>): Promise<T> {
    // This process's callers queue in memory; only the head of the queue holds a connection for the lock.
    return this.queue.run(account, () =>
      withClient(this.pool, async (client) => {
        await client.query('SELECT pg_advisory_lock($1, hashtext($2))', [MAILBOX_LOCK_CLASS, account]);
        try {
          return await work();
        } finally {
          await client
            .query('SELECT pg_advisory_unlock($1, hashtext($2))', [MAILBOX_LOCK_CLASS, account])
            .catch((err: Error) => {
              // Code-less, so withClient destroys the connection: one back in the pool must never still hold the lock.
              throw new Error(`could not release the mailbox lock: ${err.message}`);
            });
        }
      }),
    );
  }

  async sealedGrants(): Promise<{ account: string; sealed: string }[]> {
    return (
      await this.pool.query<{ account: string; sealed: string }>(
        'SELECT account, sealed_grant AS sealed FROM gmail_accounts ORDER BY account',
      )
    ).rows;
  }

  async replaceSealedGrants(changes: SealedChange[]): Promise<number> {
    return this.store.atomically(async ({ client }) => {
      let replaced = 0;
      for (const c of changes)
        replaced +=
          (
            await client.query('UPDATE gmail_accounts SET sealed_grant = $2 WHERE account = $1 AND sealed_grant = $3', [
              c.key,
              c.to,
              c.from,
            ])
          ).rowCount ?? 0;
      return replaced;
    });
  }
}

/**
 * `gatehouse storage copy`'s write side for Gmail, inside the copy's transaction (`client`):
 * refuses when the Gmail tables hold a row, then writes every row as exported.
 */
export async function importGmailState(client: pg.PoolClient, state: ExportedGmailState): Promise<void> {
  await client.query('LOCK TABLE gmail_accounts, gmail_seen IN EXCLUSIVE MODE');
  const {
    rows: [n],
  } = await client.query<{ n: number }>(
    'SELECT (SELECT count(*) FROM gmail_accounts) + (SELECT count(*) FROM gmail_seen) AS n',
  );
  if (n!.n > 0) throw new NotEmpty(`${n!.n} Gmail row${n!.n === 1 ? '' : 's'}`);
  const { accounts: a, seen } = state;
  if (a.length) {
    await client.query(
      `INSERT INTO gmail_accounts (account, client_id, project, sealed_grant, cursor, cursor_at, watch_expiration, watch_renewed_at, last_notification_at, last_error, last_error_at, emails_enqueued)
       SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::text[], $11::bigint[], $12::bigint[])`,
      [
        a.map((r) => r.account),
        a.map((r) => r.client_id),
        a.map((r) => r.project),
        a.map((r) => r.sealed_grant),
        a.map((r) => r.cursor),
        a.map((r) => r.cursor_at),
        a.map((r) => r.watch_expiration),
        a.map((r) => r.watch_renewed_at),
        a.map((r) => r.last_notification_at),
        a.map((r) => r.last_error),
        a.map((r) => r.last_error_at),
        a.map((r) => r.emails_enqueued),
      ],
    );
  }
  if (seen.length) {
    await client.query(
      'INSERT INTO gmail_seen (account, message_id, event_id, seen_at) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[])',
      [
        seen.map((s) => s.account),
        seen.map((s) => s.message_id),
        seen.map((s) => s.event_id),
        seen.map((s) => s.seen_at),
      ],
    );
  }
}
