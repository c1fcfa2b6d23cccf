import type { ChannelConfig, Config } from '../../config/schema.js';
import { platformOf } from './inbound.js';
import type { ChannelStore } from './state.js';

/** What `channels status` prints and the admin listener's gatehouse_channel_connected reads. */
export interface ChannelStatus {
  name: string;
  kind: string;
  platform: string;
  connected: boolean;
  connectedAt: number | null;
  expiresAt: number | null;
  lastEventAt: number | null;
  lastError: string | null;
  lastErrorAt: number | null;
  details: Record<string, unknown>;
}

/**
 * Every configured channel (or only `only`), in the config's order: what `channels list` and
 * `channels status` print and the admin API's status shows.
 */
export function describeChannels(
  channels: Config['channels'],
  store: ChannelStore,
  only?: string,
): Promise<ChannelStatus[]> {
  return Promise.all(
    Object.entries(channels)
      .filter(([name]) => only === undefined || name === only)
      .map(([name, channel]) => describeChannel(name, channel, store)),
  );
}

/** A qr channel is connected once a device is paired; the others once a login stored a grant. */
export async function describeChannel(
  name: string,
  channel: ChannelConfig,
  store: ChannelStore,
): Promise<ChannelStatus> {
  const grant = await store.grant(name);
  const base = { name, kind: channel.kind, platform: platformOf(channel) };
  if (channel.kind === 'qr') {
    const active = (await store.devices(name)).filter((d) => d.revokedAt === null);
    return {
      ...base,
      connected: active.length > 0,
      connectedAt: active[0]?.createdAt ?? null,
      expiresAt: null,
      lastEventAt: grant?.lastEventAt ?? (Math.max(0, ...active.map((d) => d.lastSeenAt ?? 0)) || null),
      lastError: grant?.lastError ?? null,
      lastErrorAt: grant?.lastErrorAt ?? null,
      details: { devices: active.map((d) => d.name) },
    };
  }
  return {
    ...base,
    connected: grant !== undefined,
    connectedAt: grant?.connectedAt ?? null,
    expiresAt: grant?.expiresAt ?? null,
    lastEventAt: grant?.lastEventAt ?? null,
    lastError: grant?.lastError ?? null,
    lastErrorAt: grant?.lastErrorAt ?? null,
    details: grant?.details ?? {},
  };
}
