import type pg from 'pg';
import type { Logger } from 'pino';
import type { PostgresStorageConfig } from '../../config/schema.js';
import {
  ActivityThrottle,
  looksLikeDeviceToken,
  MAX_PENDING_PAIRINGS,
  newDevice,
  newPairingCode,
  pairingCodeHash,
  pairingRefusal,
  secretHash,
  toDevice,
  toGrant,
  type ChannelDeviceRow,
  type ChannelGrant,
  type ChannelGrantRow,
  type ChannelPairingRow,
  type ChannelStore,
  type Device,
  type ExportedChannelState,
  type NewChannelGrant,
  type OutboxMessage,
  type PairingOutcome,
} from '../contracts/channels.js';
import type { SealedChange } from '../contracts/sealed.js';
import { openMigratedPool } from './migrations.js';
import { inTransaction } from './pool.js';

/** pg_advisory_xact_lock class of "pending pairings of a channel" (the second key is hashtext(channel)). */
const PAIRING_LOCK_CLASS = 0x67680001;

/**
 * Channel state in PostgreSQL, shared by every instance:
 * - a pairing code is used once: its row is locked (FOR UPDATE) while the device is created;
 *   "at most 3 pending" holds under a per-channel transaction lock;
 * - the outbox hands each message over once: fetched rows are claimed with FOR UPDATE SKIP
 *   LOCKED and marked in the same statement, so two instances never return the same message;
 * - an OAuth answer is written once (only over none) and taken once (DELETE … RETURNING);
 * - a grant refresh holds the grant's row lock (SELECT … FOR UPDATE) while the platform is
 *   asked: the other instances wait, then find it refreshed.
 */
export class PostgresChannelStore implements ChannelStore {
  private readonly activity = new ActivityThrottle();

  private constructor(private readonly pool: pg.Pool) {}

  /** Connects; migrates (a server) or checks the schema has the channel tables (the CLI). */
  static async open(
    storage: PostgresStorageConfig,
    options: { migrate?: boolean; logger?: Pick<Logger, 'warn' | 'info' | 'error'>; waitForDatabase?: boolean } = {},
  ): Promise<PostgresChannelStore> {
    return new PostgresChannelStore(await openMigratedPool(storage, options));
  }

  async grant(name: string): Promise<ChannelGrant | undefined> {
    const { rows } = await this.pool.query<ChannelGrantRow>('SELECT * FROM channel_grants WHERE name = $1', [name]);
    return rows[0] && toGrant(rows[0]);
  }

  async grants(): Promise<ChannelGrant[]> {
    const { rows } = await this.pool.query<ChannelGrantRow>('SELECT * FROM channel_grants ORDER BY name');
    return rows.map(toGrant);
  }

  async saveGrant(grant: NewChannelGrant, now: number): Promise<void> {
    await this.pool.query(
      `INSERT INTO channel_grants (name, kind, sealed, details, connected_at, expires_at) VALUES ($1, $2, $3, $4, $5::bigint, $6::bigint)
       ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, sealed = excluded.sealed, details = excluded.details, connected_at = excluded.connected_at,
         expires_at = excluded.expires_at, last_error = NULL, last_error_at = NULL`,
      [grant.name, grant.kind, grant.sealed, JSON.stringify(grant.details), now, grant.expiresAt],
    );
  }

  async refreshGrant(
    name: string,
    due: (grant: ChannelGrant) => boolean,
    refresh: (grant: ChannelGrant) => Promise<{ sealed: string; expiresAt: number | null }>,
  ): Promise<{ refreshed: boolean; grant: ChannelGrant | undefined }> {
    return inTransaction(this.pool, async (client) => {
      // Held until COMMIT, across the platform's answer: Discord rotates refresh tokens, so a
      // second instance redeeming the same one would fail (and could lose the grant).
      const { rows } = await client.query<ChannelGrantRow>('SELECT * FROM channel_grants WHERE name = $1 FOR UPDATE', [
        name,
      ]);
      const current = rows[0] && toGrant(rows[0]);
      if (!current || !due(current)) return { refreshed: false, grant: current };
      const next = await refresh(current);
      const updated = await client.query<ChannelGrantRow>(
        'UPDATE channel_grants SET sealed = $2, expires_at = $3::bigint, last_error = NULL, last_error_at = NULL WHERE name = $1 RETURNING *',
        [name, next.sealed, next.expiresAt],
      );
      return { refreshed: true, grant: toGrant(updated.rows[0]!) };
    });
  }

  async forget(name: string, now: number): Promise<void> {
    await inTransaction(this.pool, async (client) => {
      await client.query('DELETE FROM channel_grants WHERE name = $1', [name]);
      await client.query(
        'UPDATE channel_devices SET revoked_at = $2::bigint WHERE channel = $1 AND revoked_at IS NULL',
        [name, now],
      );
    });
  }

  async noteEvent(name: string, now: number): Promise<void> {
    if (this.activity.due(`channel:${name}`, now))
      await this.pool.query('UPDATE channel_grants SET last_event_at = $2::bigint WHERE name = $1', [name, now]);
  }

  async noteError(name: string, error: string, now: number): Promise<void> {
    await this.pool.query('UPDATE channel_grants SET last_error = $2, last_error_at = $3::bigint WHERE name = $1', [
      name,
      error,
      now,
    ]);
  }

  async createPairing(
    channel: string,
    ttlMs: number,
    now: number,
    max = MAX_PENDING_PAIRINGS,
  ): Promise<string | undefined> {
    return inTransaction(this.pool, async (client) => {
      // A count cannot be row-locked: logins on several hosts take turns on the channel instead.
      await client.query('SELECT pg_advisory_xact_lock($1, hashtext($2))', [PAIRING_LOCK_CLASS, channel]);
      const { rows } = await client.query<{ n: number }>(
        'SELECT count(*)::int AS n FROM channel_pairings WHERE channel = $1 AND used_at IS NULL AND expires_at > $2::bigint',
        [channel, now],
      );
      if (rows[0]!.n >= max) return undefined;
      const code = newPairingCode();
      await client.query(
        'INSERT INTO channel_pairings (code_hash, channel, created_at, expires_at) VALUES ($1, $2, $3::bigint, $4::bigint)',
        [pairingCodeHash(code), channel, now, now + ttlMs],
      );
      return code;
    });
  }

  async pairingStatus(code: string): Promise<{ expiresAt: number; device?: Device } | undefined> {
    const { rows } = await this.pool.query<ChannelPairingRow & { device: ChannelDeviceRow | null }>(
      `SELECT p.*, CASE WHEN d.id IS NULL THEN NULL ELSE row_to_json(d) END AS device
         FROM channel_pairings p LEFT JOIN channel_devices d ON d.id = p.device_id
        WHERE p.code_hash = $1`,
      [pairingCodeHash(code)],
    );
    const row = rows[0];
    if (!row) return undefined;
    return { expiresAt: row.expires_at, device: row.device ? toDevice(row.device) : undefined };
  }

  async pair(channel: string, code: string, deviceName: string, now: number): Promise<PairingOutcome> {
    return inTransaction(this.pool, async (client): Promise<PairingOutcome> => {
      const codeHash = pairingCodeHash(code);
      // Two instances given the same code: the second waits here, then reads it used.
      const { rows } = await client.query<ChannelPairingRow>(
        'SELECT * FROM channel_pairings WHERE code_hash = $1 FOR UPDATE',
        [codeHash],
      );
      const refused = pairingRefusal(rows[0], channel, now);
      if (refused) return { ok: false, reason: refused };
      const { device, token, tokenHash } = newDevice(channel, deviceName, now);
      await client.query(
        'INSERT INTO channel_devices (id, channel, name, token_hash, created_at) VALUES ($1, $2, $3, $4, $5::bigint)',
        [device.id, channel, deviceName, tokenHash, now],
      );
      await client.query('UPDATE channel_pairings SET used_at = $2::bigint, device_id = $3 WHERE code_hash = $1', [
        codeHash,
        now,
        device.id,
      ]);
      return { ok: true, device, token };
    });
  }

  async deviceByToken(channel: string, token: string, now: number): Promise<Device | undefined> {
    if (!looksLikeDeviceToken(token)) return undefined;
    const { rows } = await this.pool.query<ChannelDeviceRow>('SELECT * FROM channel_devices WHERE token_hash = $1', [
      secretHash(token),
    ]);
    const row = rows[0];
    if (!row || row.channel !== channel || row.revoked_at !== null) return undefined;
    if (this.activity.due(`device:${row.id}`, now))
      await this.pool.query('UPDATE channel_devices SET last_seen_at = $2::bigint WHERE id = $1', [row.id, now]);
    return toDevice(row);
  }

  async device(id: string): Promise<Device | undefined> {
    const { rows } = await this.pool.query<ChannelDeviceRow>('SELECT * FROM channel_devices WHERE id = $1', [id]);
    return rows[0] && toDevice(rows[0]);
  }

  async devices(channel: string): Promise<Device[]> {
    const { rows } = await this.pool.query<ChannelDeviceRow>(
      'SELECT * FROM channel_devices WHERE channel = $1 ORDER BY created_at, id',
      [channel],
    );
    return rows.map(toDevice);
  }

  async revoke(channel: string, idOrName: string, now: number): Promise<number> {
    const { rowCount } = await this.pool.query(
      'UPDATE channel_devices SET revoked_at = $3::bigint WHERE channel = $1 AND (id = $2 OR name = $2) AND revoked_at IS NULL',
      [channel, idOrName, now],
    );
    return rowCount ?? 0;
  }

  async enqueueForDevice(channel: string, deviceId: string, text: string, now: number): Promise<number> {
    const { rows } = await this.pool.query<{ id: number }>(
      'INSERT INTO channel_outbox (channel, device_id, text, created_at) VALUES ($1, $2, $3, $4::bigint) RETURNING id',
      [channel, deviceId, text, now],
    );
    return rows[0]!.id;
  }

  async takeOutbox(deviceId: string, limit: number, now: number): Promise<OutboxMessage[]> {
    // One statement: the rows another instance is taking are skipped, not waited for and taken again.
    const { rows } = await this.pool.query<{ id: number; text: string; created_at: number }>(
      `UPDATE channel_outbox o SET fetched_at = $3::bigint
         FROM (SELECT id FROM channel_outbox WHERE device_id = $1 AND fetched_at IS NULL ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) due
        WHERE o.id = due.id AND o.fetched_at IS NULL
        RETURNING o.id, o.text, o.created_at`,
      [deviceId, limit, now],
    );
    return rows.sort((a, b) => a.id - b.id).map((r) => ({ id: r.id, text: r.text, createdAt: r.created_at }));
  }

  async createOAuthRequest(channel: string, state: string, ttlMs: number, now: number): Promise<void> {
    await this.pool.query(
      'INSERT INTO channel_oauth_requests (state_hash, channel, expires_at) VALUES ($1, $2, $3::bigint)',
      [secretHash(state), channel, now + ttlMs],
    );
  }

  async answerOAuthRequest(channel: string, state: string, sealedAnswer: string, now: number): Promise<boolean> {
    const { rowCount } = await this.pool.query(
      'UPDATE channel_oauth_requests SET answer = $3 WHERE state_hash = $1 AND channel = $2 AND answer IS NULL AND expires_at > $4::bigint',
      [secretHash(state), channel, sealedAnswer, now],
    );
    return rowCount === 1;
  }

  async takeOAuthAnswer(state: string, now: number): Promise<string | undefined> {
    const { rows } = await this.pool.query<{ answer: string }>(
      'DELETE FROM channel_oauth_requests WHERE state_hash = $1 AND answer IS NOT NULL RETURNING answer',
      [secretHash(state)],
    );
    if (rows.length === 0) return undefined;
    await this.pool.query('DELETE FROM channel_oauth_requests WHERE expires_at < $1::bigint', [now]);
    return rows[0]!.answer;
  }

  async replaceSealedGrants(changes: SealedChange[]): Promise<number> {
    return inTransaction(this.pool, async (client) => {
      let replaced = 0;
      for (const c of changes)
        replaced +=
          (
            await client.query('UPDATE channel_grants SET sealed = $2 WHERE name = $1 AND sealed = $3', [
              c.key,
              c.to,
              c.from,
            ])
          ).rowCount ?? 0;
      return replaced;
    });
  }

  async close(): Promise<void> {
    await this.pool.end();
  }
}

/**
 * `gatehouse storage copy`'s write side for channels, inside the copy's transaction (`client`):
 * refuses when any channel table holds a row, then writes every row as exported; the outbox's
 * id sequence continues after the copied ids.
 */
export async function importChannelState(client: pg.PoolClient, state: ExportedChannelState): Promise<void> {
  await client.query(
    'LOCK TABLE channel_grants, channel_devices, channel_pairings, channel_outbox, channel_oauth_requests IN EXCLUSIVE MODE',
  );
  const {
    rows: [n],
  } = await client.query<{ n: number }>(
    `SELECT (SELECT count(*) FROM channel_grants) + (SELECT count(*) FROM channel_devices) + (SELECT count(*) FROM channel_pairings)
          + (SELECT count(*) FROM channel_outbox) + (SELECT count(*) FROM channel_oauth_requests) AS n`,
  );
  if (n!.n > 0) throw new NotEmpty(`${n!.n} channel row${n!.n === 1 ? '' : 's'}`);
  const { grants, devices, pairings, outbox, oauthRequests } = state;
  if (grants.length) {
    await client.query(
      `INSERT INTO channel_grants SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::text[], $9::bigint[])`,
      [
        grants.map((g) => g.name),
        grants.map((g) => g.kind),
        grants.map((g) => g.sealed),
        grants.map((g) => g.details),
        grants.map((g) => g.connected_at),
        grants.map((g) => g.expires_at),
        grants.map((g) => g.last_event_at),
        grants.map((g) => g.last_error),
        grants.map((g) => g.last_error_at),
      ],
    );
  }
  if (devices.length) {
    await client.query(
      'INSERT INTO channel_devices SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[])',
      [
        devices.map((d) => d.id),
        devices.map((d) => d.channel),
        devices.map((d) => d.name),
        devices.map((d) => d.token_hash),
        devices.map((d) => d.created_at),
        devices.map((d) => d.revoked_at),
        devices.map((d) => d.last_seen_at),
      ],
    );
  }
  if (pairings.length) {
    await client.query(
      'INSERT INTO channel_pairings SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[])',
      [
        pairings.map((p) => p.code_hash),
        pairings.map((p) => p.channel),
        pairings.map((p) => p.created_at),
        pairings.map((p) => p.expires_at),
        pairings.map((p) => p.used_at),
        pairings.map((p) => p.device_id),
      ],
    );
  }
  if (outbox.length) {
    await client.query(
      'INSERT INTO channel_outbox (id, channel, device_id, text, created_at, fetched_at) SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::bigint[])',
      [
        outbox.map((o) => o.id),
        outbox.map((o) => o.channel),
        outbox.map((o) => o.device_id),
        outbox.map((o) => o.text),
        outbox.map((o) => o.created_at),
        outbox.map((o) => o.fetched_at),
      ],
    );
    await client.query(
      "SELECT setval(pg_get_serial_sequence('channel_outbox', 'id'), (SELECT max(id) FROM channel_outbox))",
    );
  }
  if (oauthRequests.length) {
    await client.query(
      'INSERT INTO channel_oauth_requests SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::text[])',
      [
        oauthRequests.map((r) => r.state_hash),
        oauthRequests.map((r) => r.channel),
        oauthRequests.map((r) => r.expires_at),
        oauthRequests.map((r) => r.answer),
      ],
    );
  }
}

/** The copy's target already holds rows of this kind (`what`, counted in words). */
export class NotEmpty extends Error {
  constructor(readonly what: string) {
    super(`it holds ${what}`);
  }
}
