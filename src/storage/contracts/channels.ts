import { createHash, randomBytes, randomInt } from 'node:crypto';
import type { SealedChange } from './sealed.js';

/**
 * The channels state contract: what logins, the receiver's channel routes, the outbound API and
 * the refresher ask of durable storage, with no SQL in sight. One driver per engine
 * (src/storage/sqlite/channels.ts, src/storage/postgres/channels.ts); the same contract tests run
 * against each (test/storage/channels-contract.ts).
 *
 * What is kept: the grant a login won (tokens sealed with GATEHOUSE_SECRET_KEY; see
 * src/storage/secrets.ts) and public details (bot name, guild, team), with the last event and the last
 * error for `status`; for `qr` channels, pairing codes and devices (both stored as SHA-256 only:
 * the code and the device token are shown once) and each device's outbox; pending `login
 * --public` OAuth requests (keyed by the SHA-256 of their state).
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
  { ok: true; device: Device; token: string } | { ok: false; reason: 'unknown' | 'expired' | 'used' };

/** A grant as a login stores it (the rest of ChannelGrant is kept by the store). */
export type NewChannelGrant = Pick<ChannelGrant, 'name' | 'kind' | 'sealed' | 'details' | 'expiresAt'>;

/**
 * Durable channel state. Every method resolves once what it wrote is committed; on a shared
 * database (Postgres) each "once" below holds across every instance.
 */
export interface ChannelStore {
  grant(name: string): Promise<ChannelGrant | undefined>;
  grants(): Promise<ChannelGrant[]>;
  /** Stores (or replaces) a login's grant; clears the last error. */
  saveGrant(grant: NewChannelGrant, now: number): Promise<void>;
  /**
   * Refreshes a grant while no one else can: the grant is read under a lock held until the new one
   * is stored (Postgres: SELECT … FOR UPDATE), and `refresh` runs only if `due` still says so (an
   * instance that waited finds the grant another refreshed, and returns it unrefreshed). A throw
   * from `refresh` stores nothing and is passed on. A grant replaced meanwhile by a login is kept.
   */
  refreshGrant(
    name: string,
    due: (grant: ChannelGrant) => boolean,
    refresh: (grant: ChannelGrant) => Promise<{ sealed: string; expiresAt: number | null }>,
  ): Promise<{ refreshed: boolean; grant: ChannelGrant | undefined }>;
  /** logout: the grant goes, and a qr channel's devices are revoked. */
  forget(name: string, now: number): Promise<void>;
  /** "Last event", for `status`: written at most once a minute per channel (see ActivityThrottle). */
  noteEvent(name: string, now: number): Promise<void>;
  noteError(name: string, error: string, now: number): Promise<void>;
  /** A new pairing code, or undefined when `max` are already pending on this channel. The code is returned once. */
  createPairing(channel: string, ttlMs: number, now: number, max?: number): Promise<string | undefined>;
  /** The pairing's state, for the waiting CLI: the device once paired. */
  pairingStatus(code: string): Promise<{ expiresAt: number; device?: Device } | undefined>;
  /** Uses a code once (whichever instance is asked): a device and its token (shown only now), or why not. */
  pair(channel: string, code: string, deviceName: string, now: number): Promise<PairingOutcome>;
  /** The live (not revoked) device a token belongs to, on this channel; notes it seen (throttled). */
  deviceByToken(channel: string, token: string, now: number): Promise<Device | undefined>;
  device(id: string): Promise<Device | undefined>;
  devices(channel: string): Promise<Device[]>;
  /** Revokes by id or name; returns how many devices it revoked. */
  revoke(channel: string, idOrName: string, now: number): Promise<number>;
  /** Queues a message for a device; its outbox id. */
  enqueueForDevice(channel: string, deviceId: string, text: string, now: number): Promise<number>;
  /** Up to `limit` of the device's pending messages, oldest first, marked fetched: each is handed over once. */
  takeOutbox(deviceId: string, limit: number, now: number): Promise<OutboxMessage[]>;
  /**
   * `login --public`: the CLI waits for the platform's redirect to reach a running server's
   * callback route. The request is keyed by the SHA-256 of its `state`.
   */
  createOAuthRequest(channel: string, state: string, ttlMs: number, now: number): Promise<void>;
  /** The callback: false when no pending, unanswered request of this channel has this state (forged, replayed, expired). */
  answerOAuthRequest(channel: string, state: string, sealedAnswer: string, now: number): Promise<boolean>;
  /** The sealed answer once the callback came, taken once (the request is gone after), else undefined. */
  takeOAuthAnswer(state: string, now: number): Promise<string | undefined>;
  /** One transaction: each channel's sealed grant replaced only while it is still `from` (`storage reseal`); returns how many were. */
  replaceSealedGrants(changes: SealedChange[]): Promise<number>;
  close(): Promise<void>;
}

/** Crockford-style: no 0/O, 1/I/L, U: a code read off a screen is typed back right. */
export const PAIRING_ALPHABET = '23456789ABCDEFGHJKMNPQRSTVWXYZ';
export const PAIRING_CODE_LENGTH = 8;
export const MAX_PENDING_PAIRINGS = 3;
const DEVICE_TOKEN_PREFIX = 'ghd_';

/** How codes, device tokens and OAuth states are stored: their SHA-256 only. */
export function secretHash(text: string): string {
  return createHash('sha256').update(text, 'utf8').digest('hex');
}

export function newPairingCode(): string {
  let code = '';
  for (let i = 0; i < PAIRING_CODE_LENGTH; i++) code += PAIRING_ALPHABET[randomInt(PAIRING_ALPHABET.length)];
  return code;
}

/** A pairing code as stored: upper-cased (typed back in any case), then hashed. */
export function pairingCodeHash(code: string): string {
  return secretHash(code.toUpperCase());
}

/** Whether a pairing row lets `channel` pair now; the refusal otherwise. */
export function pairingRefusal(
  row: { channel: string; expires_at: number; used_at: number | null } | undefined,
  channel: string,
  now: number,
): 'unknown' | 'used' | 'expired' | undefined {
  if (!row || row.channel !== channel) return 'unknown';
  if (row.used_at !== null) return 'used';
  if (row.expires_at <= now) return 'expired';
  return undefined;
}

/** A new device and its token (shown once; stored as `tokenHash`). */
export function newDevice(
  channel: string,
  name: string,
  now: number,
): { device: Device; token: string; tokenHash: string } {
  const token = DEVICE_TOKEN_PREFIX + randomBytes(32).toString('base64url');
  const device: Device = {
    id: `dev_${randomBytes(8).toString('hex')}`,
    channel,
    name,
    createdAt: now,
    revokedAt: null,
    lastSeenAt: null,
  };
  return { device, token, tokenHash: secretHash(token) };
}

/** Whether `token` can be a device token at all (anything else is not looked up). */
export function looksLikeDeviceToken(token: string): boolean {
  return token.startsWith(DEVICE_TOKEN_PREFIX);
}

/**
 * "Last event" and "last seen" are for `status`, not for decisions: written at most this often per
 * channel or device by one process (a write per message would be an fsync, or a round trip, each).
 */
export const ACTIVITY_WRITE_INTERVAL_MS = 60_000;

/** Per process: whether a channel's or device's activity is due to be written again. */
export class ActivityThrottle {
  private readonly written = new Map<string, number>();

  due(key: string, now: number): boolean {
    if (now - (this.written.get(key) ?? -Infinity) < ACTIVITY_WRITE_INTERVAL_MS) return false;
    this.written.set(key, now);
    return true;
  }
}

/** The channel tables' rows, column for column as both drivers store them (times in ms). */
export interface ChannelGrantRow {
  name: string;
  kind: string;
  sealed: string;
  /** JSON text. */
  details: string;
  connected_at: number;
  expires_at: number | null;
  last_event_at: number | null;
  last_error: string | null;
  last_error_at: number | null;
}

export interface ChannelDeviceRow {
  id: string;
  channel: string;
  name: string;
  token_hash: string;
  created_at: number;
  revoked_at: number | null;
  last_seen_at: number | null;
}

export interface ChannelPairingRow {
  code_hash: string;
  channel: string;
  created_at: number;
  expires_at: number;
  used_at: number | null;
  device_id: string | null;
}

export interface ChannelOutboxRow {
  id: number;
  channel: string;
  device_id: string;
  text: string;
  created_at: number;
  fetched_at: number | null;
}

export interface ChannelOAuthRequestRow {
  state_hash: string;
  channel: string;
  expires_at: number;
  answer: string | null;
}

/** Every channel row, as `gatehouse storage copy` moves them (history included: revoked devices, used codes, fetched messages). */
export interface ExportedChannelState {
  grants: ChannelGrantRow[];
  devices: ChannelDeviceRow[];
  pairings: ChannelPairingRow[];
  outbox: ChannelOutboxRow[];
  oauthRequests: ChannelOAuthRequestRow[];
}

export function toGrant(row: ChannelGrantRow): ChannelGrant {
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

export function toDevice(row: ChannelDeviceRow): Device {
  return {
    id: row.id,
    channel: row.channel,
    name: row.name,
    createdAt: row.created_at,
    revokedAt: row.revoked_at,
    lastSeenAt: row.last_seen_at,
  };
}
