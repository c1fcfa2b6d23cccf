import cluster from 'node:cluster';
import type { Logger } from 'pino';
import { withAcceptGrace } from '../../http/accept-grace.js';
import { MemoryLockoutStore, type LockoutSettings, type LockoutStore } from '../../http/lockout.js';
import { createLogger } from '../../observability/log.js';
import { enableMetrics, metricsSnapshot } from '../../observability/metrics.js';
import { startTracing, stopTracing } from '../../observability/tracing.js';
import { startGateway, type RunningGateway } from '../server.js';
import type { ToPrimary, ToWorker } from './protocol.js';

/**
 * Worker side (the process cluster.fork started): asks the primary for the config, serves /api/
 * with it, applies the configs and lockouts the primary sends, drains on `shutdown`.
 */
export async function runGatewayWorker(): Promise<void> {
  const toPrimary = (message: ToPrimary) => process.send!(message);
  // This worker's view: its own failures against its share of `max`, and the primary's locks.
  const locks = new MemoryLockoutStore();
  let workerCount = 1; // from the primary's first config message, before any request
  let fullSettings: LockoutSettings | undefined;
  let shareSettings: LockoutSettings | undefined;
  const share = (settings: LockoutSettings): LockoutSettings => {
    if (settings !== fullSettings) {
      fullSettings = settings;
      shareSettings = { ...settings, max: Math.max(1, Math.floor(settings.max / workerCount)) };
    }
    return shareSettings!;
  };
  const lockoutStore: LockoutStore = {
    refusedFor: (key, now, settings) => locks.refusedFor(key, now, share(settings)),
    room: (key, now, settings) => locks.room(key, now, share(settings)),
    recordFailure(key, now, settings) {
      const lockedFor = locks.recordFailure(key, now, share(settings));
      toPrimary({ type: 'failure', key, now, settings, lockedFor });
      // 0: the primary logs the lockout (once for the cluster, not once per worker's share).
      return 0;
    },
  };
  // Signals go to the primary, which drains the workers in order; a terminal's Ctrl-C reaches
  // the whole process group, and the default action would drop this worker's in-flight requests.
  process.on('SIGINT', () => {});
  process.on('SIGTERM', () => {});

  let logger: Logger | undefined;
  let running: RunningGateway | undefined;
  let configuring = Promise.resolve();
  const skipAcceptGrace = new AbortController();
  await new Promise<void>((resolve) => {
    let stopped = false;
    const stop = async (graceMs: number, acceptGraceMs = 0) => {
      if (stopped) return;
      stopped = true;
      // The listener keeps accepting through the primary's accept grace, then drains (src/http/accept-grace.ts).
      await withAcceptGrace({ ms: acceptGraceMs, skip: skipAcceptGrace.signal }, async () => running?.close(graceMs));
      await stopTracing();
      logger?.flush();
      resolve();
    };
    // The primary is gone (crashed or killed): nothing will reload or stop this worker, so stop now.
    process.once('disconnect', () => void stop(1_000));
    process.on('message', (message: ToWorker) => {
      switch (message.type) {
        case 'config':
          workerCount = message.workers;
          configuring = configuring.then(async () => {
            try {
              if (!running) {
                // Before the app is built, which binds its instruments (src/observability/metrics.ts).
                if (message.config.admin) enableMetrics();
                logger = createLogger({
                  level: message.config.log.level,
                  format: message.config.log.format,
                  bindings: { worker: cluster.worker!.id },
                });
                await startTracing(message.config.observability.tracing, logger);
                running = await startGateway(message.config, {
                  logger,
                  lockoutStore,
                  rateLimitShare: 1 / workerCount,
                  tls: message.tls,
                });
                toPrimary({ type: 'listening', url: running.url });
              } else {
                await running.reload(message.config, message.tls);
                toPrimary({ type: 'configured' });
              }
            } catch (err) {
              toPrimary({ type: 'failed', error: err instanceof Error ? err.message : String(err) });
              if (!running) process.exit(1);
            }
          });
          break;
        case 'locked':
          locks.lockUntil(message.key, message.until);
          break;
        case 'lift':
          // The lock and this worker's own count of the client: its share may have locked it alone.
          void locks.lift(message.keys, Date.now()).then((lifted) => {
            toPrimary({ type: 'lifted', id: message.id, locks: lifted });
          });
          break;
        case 'lockouts':
          toPrimary({ type: 'lockouts', id: message.id, locks: locks.activeLocks(Date.now()) });
          break;
        case 'shutdown':
          void configuring.then(() => stop(message.graceMs, message.acceptGraceMs));
          break;
        case 'endAcceptGrace':
          skipAcceptGrace.abort();
          break;
        case 'probe':
          void (async () => {
            const probe = await running?.probe({ metrics: false });
            toPrimary({
              type: 'probed',
              id: message.id,
              keysLoaded: probe?.keysLoaded ?? false,
              certificateNotAfter: probe?.certificateNotAfter,
              metrics: message.metrics ? await metricsSnapshot() : undefined,
            });
          })();
          break;
      }
    });
    toPrimary({ type: 'ready' });
  });
  process.disconnect?.();
}
