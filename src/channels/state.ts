import { createHash, randomBytes, randomInt } from 'node:crypto';
import type Database from 'better-sqlite3';
import { hasTable, openDatabase } from '../sqlite.js';

/**
 * What channels keep in storage (the `storage.path` SQLite file, its own connection so the CLI,
 * the receiver and every gateway worker can use it at once):
 * - the grant a login won (tokens sealed with GATEHOUSE_SECRET_KEY; see src/secrets.ts) and
 *   public details (bot name, guild, team), with the last event and the last error for `status`;
 * - for `qr` channels: pairing codes and devices (both stored as SHA-256 only: the code and the
 *   device token are shown once) and each device's outbox.
 */
export interface ChannelGrant {
  name: string;
  kind: string;
  sealed: string;
  details: Record<string, unknown>;
  connectedAt: number;
  expiresAt: number | null;
  lastEventAt: number | null;
  lastError: string | null;
  lastErrorAt: number | null;
}

export interface Device {
  id: string;
  channel: string;
  name: string;
  createdAt: number;
  revokedAt: number | null;
  lastSeenAt: number | null;
}

export interface OutboxMessage {
  id: number;
  text: string;
  createdAt: number;
}

export type PairingOutcome =
  | { ok: true; device: Device; token: string }
  | { ok: false; reason: 'unknown' | 'expired' | 'used' };

const SCHEMA = `
CREATE TABLE IF NOT EXISTS channel_grants (
  name          TEXT PRIMARY KEY,
  kind          TEXT NOT NULL,
  sealed        TEXT NOT NULL,
  details       TEXT NOT NULL,
  connected_at  INTEGER NOT NULL,
  expires_at    INTEGER,
  last_event_at INTEGER,
  last_error    TEXT,
  last_error_at INTEGER
);
CREATE TABLE IF NOT EXISTS channel_devices (
  id           TEXT PRIMARY KEY,
  channel      TEXT NOT NULL,
  name         TEXT NOT NULL,
  token_hash   TEXT NOT NULL UNIQUE,
  created_at   INTEGER NOT NULL,
  revoked_at   INTEGER,
  last_seen_at INTEGER
);
CREATE TABLE IF NOT EXISTS channel_pairings (
  code_hash  TEXT PRIMARY KEY,
  channel    TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL,
  used_at    INTEGER,
  device_id  TEXT
);
CREATE TABLE IF NOT EXISTS channel_outbox (
  id         INTEGER PRIMARY KEY AUTOINCREMENT,
  channel    TEXT NOT NULL,
  device_id  TEXT NOT NULL,
  text       TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  fetched_at INTEGER
);
CREATE INDEX IF NOT EXISTS channel_outbox_pending ON channel_outbox (device_id, fetched_at, id);
CREATE TABLE IF NOT EXISTS channel_oauth_requests (
  state_hash TEXT PRIMARY KEY,
  channel    TEXT NOT NULL,
  expires_at INTEGER NOT NULL,
  answer     TEXT
);
`;

/** Crockford-style: no 0/O, 1/I/L, U: a code read off a screen is typed back right. */
export const PAIRING_ALPHABET = '23456789ABCDEFGHJKMNPQRSTVWXYZ';
export const PAIRING_CODE_LENGTH = 8;
export const MAX_PENDING_PAIRINGS = 3;
const DEVICE_TOKEN_PREFIX = 'ghd_';

const sha256 = (text: string) => createHash('sha256').update(text, 'utf8').digest('hex');

export function newPairingCode(): string {
  let code = '';
  for (let i = 0; i < PAIRING_CODE_LENGTH; i++) code += PAIRING_ALPHABET[randomInt(PAIRING_ALPHABET.length)];
  return code;
}

/**
 * "Last event" and "last seen" are for `status`, not for decisions: written at most this often per
 * channel or device, since each write is a synchronous fsync on the receiver's event loop.
 */
const ACTIVITY_WRITE_INTERVAL_MS = 60_000;

export class ChannelStore {
  private readonly db: Database.Database;
  private readonly statements;
  /** channel name or device id → when its activity was last written. */
  private readonly activityWritten = new Map<string, number>();

  constructor(file: string, options: { mustExist?: boolean } = {}) {
    this.db = openDatabase(file, options);
    this.db.exec(SCHEMA);
    const db = this.db;
    this.statements = {
      grant: db.prepare<[string], Record<string, any>>('SELECT * FROM channel_grants WHERE name = ?'),
      grants: db.prepare<[], Record<string, any>>('SELECT * FROM channel_grants ORDER BY name'),
      saveGrant: db.prepare('INSERT INTO channel_grants (name, kind, sealed, details, connected_at, expires_at) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET kind = excluded.kind, sealed = excluded.sealed, details = excluded.details, connected_at = excluded.connected_at, expires_at = excluded.expires_at, last_error = NULL, last_error_at = NULL'),
      refreshGrant: db.prepare('UPDATE channel_grants SET sealed = ?, expires_at = ?, last_error = NULL, last_error_at = NULL WHERE name = ?'),
      deleteGrant: db.prepare('DELETE FROM channel_grants WHERE name = ?'),
      noteEvent: db.prepare('UPDATE channel_grants SET last_event_at = ? WHERE name = ?'),
      noteError: db.prepare('UPDATE channel_grants SET last_error = ?, last_error_at = ? WHERE name = ?'),
      pendingPairings: db.prepare<[string, number], { n: number }>('SELECT count(*) AS n FROM channel_pairings WHERE channel = ? AND used_at IS NULL AND expires_at > ?'),
      addPairing: db.prepare('INSERT INTO channel_pairings (code_hash, channel, created_at, expires_at) VALUES (?, ?, ?, ?)'),
      pairing: db.prepare<[string], { channel: string; expires_at: number; used_at: number | null; device_id: string | null }>('SELECT * FROM channel_pairings WHERE code_hash = ?'),
      usePairing: db.prepare('UPDATE channel_pairings SET used_at = ?, device_id = ? WHERE code_hash = ? AND used_at IS NULL'),
      addDevice: db.prepare('INSERT INTO channel_devices (id, channel, name, token_hash, created_at) VALUES (?, ?, ?, ?, ?)'),
      deviceByToken: db.prepare<[string], Record<string, any>>('SELECT * FROM channel_devices WHERE token_hash = ?'),
      device: db.prepare<[string], Record<string, any>>('SELECT * FROM channel_devices WHERE id = ?'),
      devices: db.prepare<[string], Record<string, any>>('SELECT * FROM channel_devices WHERE channel = ? ORDER BY created_at'),
      seen: db.prepare('UPDATE channel_devices SET last_seen_at = ? WHERE id = ?'),
      revoke: db.prepare('UPDATE channel_devices SET revoked_at = ? WHERE channel = ? AND (id = ? OR name = ?) AND revoked_at IS NULL'),
      revokeAll: db.prepare('UPDATE channel_devices SET revoked_at = ? WHERE channel = ? AND revoked_at IS NULL'),
      enqueue: db.prepare('INSERT INTO channel_outbox (channel, device_id, text, created_at) VALUES (?, ?, ?, ?)'),
      pending: db.prepare<[string, number], { id: number; text: string; created_at: number }>('SELECT id, text, created_at FROM channel_outbox WHERE device_id = ? AND fetched_at IS NULL ORDER BY id LIMIT ?'),
      fetched: db.prepare('UPDATE channel_outbox SET fetched_at = ? WHERE id = ?'),
      addOAuthRequest: db.prepare('INSERT INTO channel_oauth_requests (state_hash, channel, expires_at) VALUES (?, ?, ?)'),
      answerOAuthRequest: db.prepare('UPDATE channel_oauth_requests SET answer = ? WHERE state_hash = ? AND channel = ? AND answer IS NULL AND expires_at > ?'),
      oauthAnswer: db.prepare<[string], { answer: string | null; expires_at: number }>('SELECT answer, expires_at FROM channel_oauth_requests WHERE state_hash = ?'),
      dropOAuthRequest: db.prepare('DELETE FROM channel_oauth_requests WHERE state_hash = ? OR expires_at < ?'),
    };
  }

  grant(name: string): ChannelGrant | undefined {
    const row = this.statements.grant.get(name);
    return row && toGrant(row);
  }

  grants(): ChannelGrant[] {
    return this.statements.grants.all().map(toGrant);
  }

  saveGrant(grant: { name: string; kind: string; sealed: string; details: Record<string, unknown>; expiresAt: number | null }, now: number): void {
    this.statements.saveGrant.run(grant.name, grant.kind, grant.sealed, JSON.stringify(grant.details), now, grant.expiresAt);
  }

  replaceSealed(name: string, sealed: string, expiresAt: number | null): void {
    this.statements.refreshGrant.run(sealed, expiresAt, name);
  }

  /** logout: the grant goes, and a qr channel's devices are revoked. */
  forget(name: string, now: number): void {
    this.db.transaction(() => {
      this.statements.deleteGrant.run(name);
      this.statements.revokeAll.run(now, name);
    })();
  }

  noteEvent(name: string, now: number): void {
    if (this.activityDue(`channel:${name}`, now)) this.statements.noteEvent.run(now, name);
  }

  private activityDue(key: string, now: number): boolean {
    if (now - (this.activityWritten.get(key) ?? -Infinity) < ACTIVITY_WRITE_INTERVAL_MS) return false;
    this.activityWritten.set(key, now);
    return true;
  }

  noteError(name: string, error: string, now: number): void {
    this.statements.noteError.run(error, now, name);
  }

  /** A new pairing code, or undefined when `max` are already pending. The code is returned once. */
  createPairing(channel: string, ttlMs: number, now: number, max = MAX_PENDING_PAIRINGS): string | undefined {
    // IMMEDIATE (here and below: read, then write): the write lock is taken first. A deferred
    // transaction read under a snapshot another process's commit made stale, and its write then
    // failed "database is locked" at once (busy_timeout does not apply): concurrent logins crashed.
    return this.db.transaction(() => {
      if (this.statements.pendingPairings.get(channel, now)!.n >= max) return undefined;
      const code = newPairingCode();
      this.statements.addPairing.run(sha256(code), channel, now, now + ttlMs);
      return code;
    }).immediate();
  }

  /** The pairing's state, for the waiting CLI: the device once paired. */
  pairingStatus(code: string): { expiresAt: number; device?: Device } | undefined {
    const row = this.statements.pairing.get(sha256(code));
    if (!row) return undefined;
    const device = row.device_id ? this.device(row.device_id) : undefined;
    return { expiresAt: row.expires_at, device };
  }

  /** Uses a code once: a device and its token (shown only now), or why not. */
  pair(channel: string, code: string, deviceName: string, now: number): PairingOutcome {
    return this.db.transaction((): PairingOutcome => {
      const codeHash = sha256(code.toUpperCase());
      const row = this.statements.pairing.get(codeHash);
      if (!row || row.channel !== channel) return { ok: false, reason: 'unknown' };
      if (row.used_at !== null) return { ok: false, reason: 'used' };
      if (row.expires_at <= now) return { ok: false, reason: 'expired' };
      const token = DEVICE_TOKEN_PREFIX + randomBytes(32).toString('base64url');
      const device: Device = { id: `dev_${randomBytes(8).toString('hex')}`, channel, name: deviceName, createdAt: now, revokedAt: null, lastSeenAt: null };
      this.statements.addDevice.run(device.id, channel, deviceName, sha256(token), now);
      this.statements.usePairing.run(now, device.id, codeHash);
      return { ok: true, device, token };
    }).immediate();
  }

  /** The live (not revoked) device a token belongs to, on this channel. */
  deviceByToken(channel: string, token: string, now: number): Device | undefined {
    if (!token.startsWith(DEVICE_TOKEN_PREFIX)) return undefined;
    const row = this.statements.deviceByToken.get(sha256(token));
    if (!row || row.channel !== channel || row.revoked_at !== null) return undefined;
    if (this.activityDue(`device:${row.id}`, now)) this.statements.seen.run(now, row.id);
    return toDevice(row);
  }

  device(id: string): Device | undefined {
    const row = this.statements.device.get(id);
    return row && toDevice(row);
  }

  devices(channel: string): Device[] {
    return this.statements.devices.all(channel).map(toDevice);
  }

  /** Revokes by id or name; returns how many devices it revoked. */
  revoke(channel: string, idOrName: string, now: number): number {
    return this.statements.revoke.run(now, channel, idOrName, idOrName).changes;
  }

  enqueueForDevice(channel: string, deviceId: string, text: string, now: number): number {
    return Number(this.statements.enqueue.run(channel, deviceId, text, now).lastInsertRowid);
  }

  /** The device's pending messages, marked fetched (handed over once). */
  takeOutbox(deviceId: string, limit: number, now: number): OutboxMessage[] {
    return this.db.transaction(() => {
      const rows = this.statements.pending.all(deviceId, limit);
      for (const row of rows) this.statements.fetched.run(now, row.id);
      return rows.map((r) => ({ id: r.id, text: r.text, createdAt: r.created_at }));
    }).immediate();
  }

  /**
   * `login --public`: the CLI waits for the platform's redirect to reach the running server's
   * callback route. The request is keyed by the SHA-256 of its `state`; the answer (the query
   * string, sealed by the caller) is taken once.
   */
  createOAuthRequest(channel: string, state: string, ttlMs: number, now: number): void {
    this.statements.addOAuthRequest.run(sha256(state), channel, now + ttlMs);
  }

  /** The callback: false when no pending request of this channel has this state (forged, replayed, expired). */
  answerOAuthRequest(channel: string, state: string, sealedAnswer: string, now: number): boolean {
    return this.statements.answerOAuthRequest.run(sealedAnswer, sha256(state), channel, now).changes === 1;
  }

  /** The sealed answer once the callback came (and the request is gone), else undefined. */
  takeOAuthAnswer(state: string, now: number): string | undefined {
    const row = this.statements.oauthAnswer.get(sha256(state));
    if (!row?.answer) return undefined;
    this.statements.dropOAuthRequest.run(sha256(state), now);
    return row.answer;
  }

  close(): void {
    this.db.close();
  }
}

function toGrant(row: Record<string, any>): ChannelGrant {
  return {
    name: row.name,
    kind: row.kind,
    sealed: row.sealed,
    details: JSON.parse(row.details),
    connectedAt: row.connected_at,
    expiresAt: row.expires_at,
    lastEventAt: row.last_event_at,
    lastError: row.last_error,
    lastErrorAt: row.last_error_at,
  };
}

function toDevice(row: Record<string, any>): Device {
  return { id: row.id, channel: row.channel, name: row.name, createdAt: row.created_at, revokedAt: row.revoked_at, lastSeenAt: row.last_seen_at };
}

/**
 * The channel state an SQLite store holds that is still in use, in words (`["1 channel login", …]`);
 * empty when none. Revoked devices, fetched outbox messages, and used or expired pairing codes and
 * login requests are history, not state, and are not counted. Reads only, creates nothing. For
 * `gatehouse storage copy`, which cannot move this to postgres yet and so refuses rather than
 * leave it behind.
 */
export function describeChannelState(db: Database.Database, now: number): string[] {
  const checks: [table: string, sql: string, params: number[], one: string, many: string][] = [
    ['channel_grants', 'SELECT count(*) AS n FROM channel_grants', [], 'channel login', 'channel logins'],
    ['channel_devices', 'SELECT count(*) AS n FROM channel_devices WHERE revoked_at IS NULL', [], 'paired device', 'paired devices'],
    ['channel_outbox', 'SELECT count(*) AS n FROM channel_outbox WHERE fetched_at IS NULL', [], 'message waiting for a device', 'messages waiting for a device'],
    ['channel_pairings', 'SELECT count(*) AS n FROM channel_pairings WHERE used_at IS NULL AND expires_at > ?', [now], 'pending pairing code', 'pending pairing codes'],
    ['channel_oauth_requests', 'SELECT count(*) AS n FROM channel_oauth_requests WHERE expires_at > ?', [now], 'channel login under way', 'channel logins under way'],
  ];
  const found: string[] = [];
  for (const [table, sql, params, one, many] of checks) {
    if (!hasTable(db, table)) continue;
    const { n } = db.prepare<number[], { n: number }>(sql).get(...params)!;
    if (n > 0) found.push(`${n} ${n === 1 ? one : many}`);
  }
  return found;
}
