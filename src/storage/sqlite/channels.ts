import type Database from 'better-sqlite3';
import { hasTable, openDatabase } from './database.js';
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
  type ChannelOAuthRequestRow,
  type ChannelOutboxRow,
  type ChannelPairingRow,
  type ChannelStore,
  type Device,
  type ExportedChannelState,
  type NewChannelGrant,
  type OutboxMessage,
  type PairingOutcome,
} from '../contracts/channels.js';
import type { SealedChange } from '../contracts/sealed.js';

/**
 * Channel state in the `storage.path` SQLite file, on a connection of its own, so the CLI, the
 * receiver and every gateway worker can use it at once (WAL; writes wait for the file's lock).
 * Synchronous underneath: each method's work is done when its promise is made.
 */
export class SqliteChannelStore implements ChannelStore {
  private readonly db: Database.Database;
  private readonly statements;
  private readonly activity = new ActivityThrottle();

  constructor(file: string, options: { mustExist?: boolean } = {}) {
    this.db = openDatabase(file, options);
    const db = this.db;
    this.statements = {
      grant: db.prepare<[string], ChannelGrantRow>('SELECT * FROM channel_grants WHERE name = ?'),
      grants: db.prepare<[], ChannelGrantRow>('SELECT * FROM channel_grants ORDER BY name'),
      saveGrant: db.prepare(
        'INSERT INTO channel_grants (name, kind, sealed, details, connected_at, expires_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, sealed = excluded.sealed, details = excluded.details, connected_at = excluded.connected_at, expires_at = excluded.expires_at, last_error = NULL, last_error_at = NULL',
      ),
      replaceSealed: db.prepare('UPDATE channel_grants SET sealed = ? WHERE name = ? AND sealed = ?'),
      // Only over the grant the refresh started from: a login stored meanwhile wins (it sets
      // connected_at). Not compared on `sealed`: a `storage reseal` meanwhile changes only that,
      // and the refresh's new tokens (Discord rotates the refresh token) must not be thrown away.
      refreshGrant: db.prepare(
        'UPDATE channel_grants SET sealed = ?, expires_at = ?, last_error = NULL, last_error_at = NULL WHERE name = ? AND connected_at = ? AND expires_at IS ?',
      ),
      deleteGrant: db.prepare('DELETE FROM channel_grants WHERE name = ?'),
      noteEvent: db.prepare('UPDATE channel_grants SET last_event_at = ? WHERE name = ?'),
      noteError: db.prepare('UPDATE channel_grants SET last_error = ?, last_error_at = ? WHERE name = ?'),
      pendingPairings: db.prepare<[string, number], { n: number }>(
        'SELECT count(*) AS n FROM channel_pairings WHERE channel = ? AND used_at IS NULL AND expires_at > ?',
      ),
      addPairing: db.prepare(
        'INSERT INTO channel_pairings (code_hash, channel, created_at, expires_at) VALUES (?, ?, ?, ?)',
      ),
      pairing: db.prepare<[string], ChannelPairingRow>('SELECT * FROM channel_pairings WHERE code_hash = ?'),
      usePairing: db.prepare(
        'UPDATE channel_pairings SET used_at = ?, device_id = ? WHERE code_hash = ? AND used_at IS NULL',
      ),
      addDevice: db.prepare(
        'INSERT INTO channel_devices (id, channel, name, token_hash, created_at) VALUES (?, ?, ?, ?, ?)',
      ),
      deviceByToken: db.prepare<[string], ChannelDeviceRow>('SELECT * FROM channel_devices WHERE token_hash = ?'),
      device: db.prepare<[string], ChannelDeviceRow>('SELECT * FROM channel_devices WHERE id = ?'),
      devices: db.prepare<[string], ChannelDeviceRow>(
        'SELECT * FROM channel_devices WHERE channel = ? ORDER BY created_at',
      ),
      seen: db.prepare('UPDATE channel_devices SET last_seen_at = ? WHERE id = ?'),
      revoke: db.prepare(
        'UPDATE channel_devices SET revoked_at = ? WHERE channel = ? AND (id = ? OR name = ?) AND revoked_at IS NULL',
      ),
      revokeAll: db.prepare('UPDATE channel_devices SET revoked_at = ? WHERE channel = ? AND revoked_at IS NULL'),
      enqueue: db.prepare('INSERT INTO channel_outbox (channel, device_id, text, created_at) VALUES (?, ?, ?, ?)'),
      pending: db.prepare<[string, number], { id: number; text: string; created_at: number }>(
        'SELECT id, text, created_at FROM channel_outbox WHERE device_id = ? AND fetched_at IS NULL ORDER BY id LIMIT ?',
      ),
      fetched: db.prepare('UPDATE channel_outbox SET fetched_at = ? WHERE id = ?'),
      addOAuthRequest: db.prepare(
        'INSERT INTO channel_oauth_requests (state_hash, channel, expires_at) VALUES (?, ?, ?)',
      ),
      answerOAuthRequest: db.prepare(
        'UPDATE channel_oauth_requests SET answer = ? WHERE state_hash = ? AND channel = ? AND answer IS NULL AND expires_at > ?',
      ),
      takeOAuthAnswer: db.prepare<[string], { answer: string }>(
        'DELETE FROM channel_oauth_requests WHERE state_hash = ? AND answer IS NOT NULL RETURNING answer',
      ),
      dropExpiredOAuthRequests: db.prepare('DELETE FROM channel_oauth_requests WHERE expires_at < ?'),
    };
  }

  async grant(name: string): Promise<ChannelGrant | undefined> {
    const row = this.statements.grant.get(name);
    return row && toGrant(row);
  }

  async grants(): Promise<ChannelGrant[]> {
    return this.statements.grants.all().map(toGrant);
  }

  async saveGrant(grant: NewChannelGrant, now: number): Promise<void> {
    this.statements.saveGrant.run(
      grant.name,
      grant.kind,
      grant.sealed,
      JSON.stringify(grant.details),
      now,
      grant.expiresAt,
    );
  }

  async refreshGrant(
    name: string,
    due: (grant: ChannelGrant) => boolean,
    refresh: (grant: ChannelGrant) => Promise<{ sealed: string; expiresAt: number | null }>,
  ): Promise<{ refreshed: boolean; grant: ChannelGrant | undefined }> {
    // One server per file (its refresher runs one pass at a time): no lock to take beyond the
    // compare-and-set, which keeps a login stored while the platform was being asked.
    const current = await this.grant(name);
    if (!current || !due(current)) return { refreshed: false, grant: current };
    const next = await refresh(current);
    const { changes } = this.statements.refreshGrant.run(
      next.sealed,
      next.expiresAt,
      name,
      current.connectedAt,
      current.expiresAt,
    );
    return { refreshed: changes === 1, grant: await this.grant(name) };
  }

  async forget(name: string, now: number): Promise<void> {
    this.db.transaction(() => {
      this.statements.deleteGrant.run(name);
      this.statements.revokeAll.run(now, name);
    })();
  }

  async noteEvent(name: string, now: number): Promise<void> {
    if (this.activity.due(`channel:${name}`, now)) this.statements.noteEvent.run(now, name);
  }

  async noteError(name: string, error: string, now: number): Promise<void> {
    this.statements.noteError.run(error, now, name);
  }

  async createPairing(
    channel: string,
    ttlMs: number,
    now: number,
    max = MAX_PENDING_PAIRINGS,
  ): Promise<string | undefined> {
    // IMMEDIATE (here and below: read, then write): the write lock is taken first. A deferred
    // transaction read under a snapshot another process's commit made stale, and its write then
    // failed "database is locked" at once (busy_timeout does not apply): concurrent logins crashed.
    return this.db
      .transaction(() => {
        if (this.statements.pendingPairings.get(channel, now)!.n >= max) return undefined;
        const code = newPairingCode();
        this.statements.addPairing.run(pairingCodeHash(code), channel, now, now + ttlMs);
        return code;
      })
      .immediate();
  }

  async pairingStatus(code: string): Promise<{ expiresAt: number; device?: Device } | undefined> {
    const row = this.statements.pairing.get(pairingCodeHash(code));
    if (!row) return undefined;
    const device = row.device_id ? await this.device(row.device_id) : undefined;
    return { expiresAt: row.expires_at, device };
  }

  async pair(channel: string, code: string, deviceName: string, now: number): Promise<PairingOutcome> {
    return this.db
      .transaction((): PairingOutcome => {
        const codeHash = pairingCodeHash(code);
        const refused = pairingRefusal(this.statements.pairing.get(codeHash), channel, now);
        if (refused) return { ok: false, reason: refused };
        const { device, token, tokenHash } = newDevice(channel, deviceName, now);
        this.statements.addDevice.run(device.id, channel, deviceName, tokenHash, now);
        this.statements.usePairing.run(now, device.id, codeHash);
        return { ok: true, device, token };
      })
      .immediate();
  }

  async deviceByToken(channel: string, token: string, now: number): Promise<Device | undefined> {
    if (!looksLikeDeviceToken(token)) return undefined;
    const row = this.statements.deviceByToken.get(secretHash(token));
    if (!row || row.channel !== channel || row.revoked_at !== null) return undefined;
    if (this.activity.due(`device:${row.id}`, now)) this.statements.seen.run(now, row.id);
    return toDevice(row);
  }

  async device(id: string): Promise<Device | undefined> {
    const row = this.statements.device.get(id);
    return row && toDevice(row);
  }

  async devices(channel: string): Promise<Device[]> {
    return this.statements.devices.all(channel).map(toDevice);
  }

  async revoke(channel: string, idOrName: string, now: number): Promise<number> {
    return this.statements.revoke.run(now, channel, idOrName, idOrName).changes;
  }

  async enqueueForDevice(channel: string, deviceId: string, text: string, now: number): Promise<number> {
    return Number(this.statements.enqueue.run(channel, deviceId, text, now).lastInsertRowid);
  }

  async takeOutbox(deviceId: string, limit: number, now: number): Promise<OutboxMessage[]> {
    return this.db
      .transaction(() => {
        const rows = this.statements.pending.all(deviceId, limit);
        for (const row of rows) this.statements.fetched.run(now, row.id);
        return rows.map((r) => ({ id: r.id, text: r.text, createdAt: r.created_at }));
      })
      .immediate();
  }

  async createOAuthRequest(channel: string, state: string, ttlMs: number, now: number): Promise<void> {
    this.statements.addOAuthRequest.run(secretHash(state), channel, now + ttlMs);
  }

  async answerOAuthRequest(channel: string, state: string, sealedAnswer: string, now: number): Promise<boolean> {
    return this.statements.answerOAuthRequest.run(sealedAnswer, secretHash(state), channel, now).changes === 1;
  }

  async takeOAuthAnswer(state: string, now: number): Promise<string | undefined> {
    return this.db
      .transaction(() => {
        const taken = this.statements.takeOAuthAnswer.get(secretHash(state));
        if (taken) this.statements.dropExpiredOAuthRequests.run(now);
        return taken?.answer;
      })
      .immediate();
  }

  async replaceSealedGrants(changes: SealedChange[]): Promise<number> {
    return this.db
      .transaction(() =>
        changes.reduce((n, c) => n + this.statements.replaceSealed.run(c.to, c.key, c.from).changes, 0),
      )
      .immediate();
  }

  async close(): Promise<void> {
    this.db.close();
  }
}

type ChannelTable =
  'channel_grants' | 'channel_devices' | 'channel_pairings' | 'channel_outbox' | 'channel_oauth_requests';

/**
 * Every channel row an SQLite file holds (none for a table not there), for `gatehouse storage
 * copy`. Reads only, creates nothing; the caller holds the file's writer lock.
 */
export function exportChannelState(db: Database.Database): ExportedChannelState {
  const all = <T>(table: ChannelTable, order: string): T[] =>
    hasTable(db, table) ? (db.prepare(`SELECT * FROM ${table} ORDER BY ${order}`).all() as T[]) : [];
  return {
    grants: all<ChannelGrantRow>('channel_grants', 'name'),
    devices: all<ChannelDeviceRow>('channel_devices', 'created_at, id'),
    pairings: all<ChannelPairingRow>('channel_pairings', 'created_at, code_hash'),
    outbox: all<ChannelOutboxRow>('channel_outbox', 'id'),
    oauthRequests: all<ChannelOAuthRequestRow>('channel_oauth_requests', 'state_hash'),
  };
}
