import type { LockoutStore } from '../http/lockout.js';
import type { ChannelStore } from '../integrations/channels/state.js';
import type { MetricsSnapshot } from '../observability/metrics.js';
import type { EventStore } from '../storage/contracts/events.js';

/** What the admin listener asks of the /api/ edge (in this process, or of every worker). */
export interface GatewayProbe {
  /** Every verifier has its keys (a JWKS fetched at least once); true without a JWKS. */
  keysLoaded: boolean;
  /** With gateway.tls: when the certificate served expires (ms since the epoch); the earliest across workers. */
  certificateNotAfter?: number;
  /** With `metrics`: the snapshots of the other processes serving /api/ (none in-process). */
  snapshots: MetricsSnapshot[];
}

/** What the admin listener reads, at scrape or probe time only. */
export interface AdminSources {
  probeGateway(options: { metrics: boolean }): Promise<GatewayProbe>;
  lockoutStore: LockoutStore;
  /** The webhook event store, when `webhooks.enabled`. */
  store?: EventStore;
  channelStore?: ChannelStore;
}
