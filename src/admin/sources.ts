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

/** The lockouts as the admin API lists and lifts them (put together in src/runtime/lockouts.ts). */
export interface LockoutControl {
  /**
   * Every lock in force in this process (on PostgreSQL with those learned from the other
   * instances) and in its gateway workers, as [key, until (ms)], one per key.
   */
  list(now: number): Promise<[string, number][]>;
  /**
   * Lifts `keys` everywhere this instance enforces them and, on a shared store, on every instance.
   * `locks`: those that were in force; `incomplete`: what the lift did not reach (absent: it reached all).
   */
  lift(keys: readonly string[], now: number): Promise<{ locks: [string, number][]; incomplete?: string }>;
}

/** The listeners' URLs, as they listen (a port 0 in the config is the port the system gave). */
export interface ListenerUrls {
  gateway: string;
  /** When `webhooks.enabled`. */
  webhooks?: string;
  admin?: string;
}

/** What the admin listener reads, at scrape or probe time only. */
export interface AdminSources {
  probeGateway(options: { metrics: boolean }): Promise<GatewayProbe>;
  lockoutStore: LockoutStore;
  lockouts: LockoutControl;
  listeners(): ListenerUrls;
  /** The webhook event store, when `webhooks.enabled`. */
  store?: EventStore;
  channelStore?: ChannelStore;
}
