import type { Worker } from 'node:cluster';
import type { Config } from '../../config/schema.js';
import type { TlsPem } from '../../http/tls.js';
import type { LockoutSettings } from '../../http/lockout.js';
import type { MetricsSnapshot } from '../../observability/metrics.js';

/**
 * `gateway.workers` > 1: the /api/ edge runs in N node:cluster worker processes sharing the
 * port, while the primary keeps the webhook receiver (the store's single durable writer), the
 * config file and the signals. Workers get their config from the primary, never from the file,
 * so all of them run the same one.
 *
 * The lockout stays one count across the cluster: each worker reports a failure to the primary,
 * which counts them all and tells every worker when a client is locked out. That verdict comes
 * over IPC, after the failures: to bound the guesses without an IPC round trip per request,
 * each worker also enforces its share of the budget, max(1, floor(max / N)) failures per
 * window, with the same slots (lockout.ts), so N workers check at most `max` bad credentials
 * of a client in total (when max ≥ N). The price: a client whose connections all land on one
 * worker is locked out by that worker after its share, sooner than after `max`.
 */

/** Messages from the primary to a worker. */
export type ToWorker =
  /** `tls`: the pair in force (gateway.tls), read by the primary for all of them. */
  | { type: 'config'; config: Config; workers: number; tls?: TlsPem }
  | { type: 'locked'; key: string; until: number }
  /** An operator's lift (the admin API), or one heard from another instance: answered with `lifted`. */
  | { type: 'lift'; id: number; keys: string[] }
  /** The locks this worker enforces (its share's and the primary's): answered with `lockouts`. */
  | { type: 'lockouts'; id: number }
  /** Drain: keep accepting for `acceptGraceMs` (answers say `Connection: close`), then in-flight requests get `graceMs`. */
  | { type: 'shutdown'; graceMs: number; acceptGraceMs: number }
  /** A second signal: the rest of the accept grace is skipped. */
  | { type: 'endAcceptGrace' }
  | { type: 'probe'; id: number; metrics: boolean };

/** Messages from a worker to the primary. */
export type ToPrimary =
  | { type: 'ready' }
  | { type: 'listening'; url: string }
  | { type: 'configured' }
  | { type: 'failed'; error: string }
  /** `lockedFor`: seconds of lockout this failure triggered in the worker's own share (0: none). */
  | { type: 'failure'; key: string; now: number; settings: LockoutSettings; lockedFor: number }
  | { type: 'probed'; id: number; keysLoaded: boolean; certificateNotAfter?: number; metrics?: MetricsSnapshot }
  /** `locks`: [key, until (ms)] of the locks in force there, before the lift (`lifted`) or now (`lockouts`). */
  | { type: 'lifted'; id: number; locks: [string, number][] }
  | { type: 'lockouts'; id: number; locks: [string, number][] };

/** Sends to a worker that is still connected (one exiting is left alone). */
export function send(worker: Worker, message: ToWorker): void {
  // A worker exiting (a drain, a crash) can close its channel while the message is on its way: the
  // write fails with EPIPE, which without a callback is an 'error' event that ends the primary. Its
  // exit is handled where it is awaited; the message is moot.
  if (worker.isConnected()) worker.send(message, undefined, undefined, () => {});
}
