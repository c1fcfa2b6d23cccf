import cluster, { type Worker } from 'node:cluster';
import os from 'node:os';
import type { Logger } from 'pino';
import type { Config } from '../../config/schema.js';
import { UsageError } from '../../errors.js';
import { currentAcceptGrace, graceLeftMs } from '../../http/accept-grace.js';
import { readTlsPem, type TlsPem } from '../../http/tls.js';
import { latestLocks, type LockoutStore } from '../../http/lockout.js';
import type { RunningGateway } from '../server.js';
import { send, type ToPrimary, type ToWorker } from './protocol.js';

const STARTUP_TIMEOUT_MS = 30_000;
const FIRST_RESTART_DELAY_MS = 500;
const MAX_RESTART_DELAY_MS = 30_000;
const STABLE_AFTER_MS = 30_000;
/** A worker that has not answered a scrape, probe or lift in this long is left out of it (metrics) or not ready. */
const PROBE_TIMEOUT_MS = 5_000;

/** The answers a worker gives to a question of the primary's (matched by id). */
type Answer = Extract<ToPrimary, { id: number }>;

/** The number of gateway processes `gateway.workers` asks for ("auto": one per CPU the process may use). */
export function resolveWorkerCount(setting: Config['gateway']['workers']): number {
  return setting === 'auto' ? os.availableParallelism() : setting;
}

/**
 * Primary side: forks `count` workers, answers each one's `ready` with the config, and resolves
 * once all listen. A worker that dies afterwards is replaced (after a growing delay, so a crash
 * loop does not spin); one that fails at startup fails the start.
 */
export async function startGatewayWorkers(
  initial: Config,
  count: number,
  deps: { logger: Logger; lockoutStore: LockoutStore },
): Promise<RunningGateway> {
  const { logger, lockoutStore } = deps;
  let config = initial;
  // The TLS pair in force, read here once: every worker, a replacement too, serves these bytes
  // (one reading the files itself could catch a renewal not reloaded yet, or half-copied).
  let tls = readTls(initial);
  // The config in force is generation `generation`; each worker's is the one it was last sent. A
  // worker that asks for its config while a reload is under way gets the one in force and
  // catches up once the reload is: no worker is left on an older config than the others.
  let generation = 0;
  const sentGeneration = new Map<Worker, number>();
  const serving = new Set<Worker>();
  let stopping = false;
  let restartDelayMs = FIRST_RESTART_DELAY_MS;
  const workers = new Set<Worker>();
  // Structured clone keeps the config exactly (JSON would turn undefined fields into gaps).
  cluster.setupPrimary({ serialization: 'advanced' });

  function fork(): Promise<string> {
    const worker = cluster.fork({ GATEHOUSE_WORKER: '1' });
    workers.add(worker);
    // Its channel failing (EPIPE while it exits) must not end the primary: the exit is handled below.
    worker.on('error', (err) => logger.debug({ err: err.message }, 'gateway worker channel error'));
    return new Promise<string>((resolve, reject) => {
      let listening = false;
      worker.on('message', (message: ToPrimary) => {
        switch (message.type) {
          case 'ready':
            sentGeneration.set(worker, generation);
            send(worker, { type: 'config', config, workers: count, tls });
            break;
          case 'listening':
            listening = true;
            serving.add(worker);
            if (sentGeneration.get(worker)! < generation) void catchUp(worker);
            // A new worker (a replacement) learns the lockouts in force: otherwise each one would
            // give a locked-out client another `max` guesses.
            for (const [key, until] of lockoutStore.activeLocks?.(Date.now()) ?? [])
              send(worker, { type: 'locked', key, until });
            // The restart delay resets only once a worker has stayed up a while (no crash loop at 500 ms).
            setTimeout(() => {
              if (!worker.isDead()) restartDelayMs = FIRST_RESTART_DELAY_MS;
            }, STABLE_AFTER_MS).unref();
            resolve(message.url);
            break;
          case 'failed':
            // Said as the worker said it (e.g. "gateway.listen … is already in use"): one line, exit 1.
            if (!listening) reject(new UsageError(message.error));
            break;
          case 'failure':
            countFailure(message);
            break;
        }
      });
      worker.on('exit', (code, signal) => {
        workers.delete(worker);
        serving.delete(worker);
        sentGeneration.delete(worker);
        if (!listening) reject(new Error(`gateway worker ${worker.id} exited (${signal ?? code}) before listening`));
        // At start a failure fails the start; later, a worker that died (or a replacement that
        // could not start) is replaced again, after a delay that grows while they keep dying.
        if (stopping || !started) return;
        logger.error(
          { worker: worker.id, pid: worker.process.pid, code, signal, restartInMs: restartDelayMs },
          'gateway worker died: starting a new one',
        );
        const delay = restartDelayMs;
        restartDelayMs = Math.min(restartDelayMs * 2, MAX_RESTART_DELAY_MS);
        setTimeout(() => {
          if (!stopping)
            fork().catch((err: Error) =>
              logger.error({ err: err.message }, 'replacement gateway worker failed to start'),
            );
        }, delay).unref();
      });
    });
  }

  /**
   * Sends a serving worker a config and waits for its answer: resolves once it is in force,
   * rejects with the worker's reason; a worker that exits meanwhile is simply gone (resolves).
   */
  function configure(worker: Worker, next: Config, nextTls: TlsPem | undefined, nextGeneration: number): Promise<void> {
    sentGeneration.set(worker, nextGeneration);
    return new Promise<void>((resolve, reject) => {
      const done = () => {
        worker.off('message', onMessage);
        worker.off('exit', onExit);
      };
      const onMessage = (message: ToPrimary) => {
        if (message.type !== 'configured' && message.type !== 'failed') return;
        done();
        if (message.type === 'configured') resolve();
        else reject(new Error(`gateway worker ${worker.id}: ${message.error}`));
      };
      const onExit = () => {
        done();
        resolve();
      };
      worker.on('message', onMessage);
      worker.once('exit', onExit);
      send(worker, { type: 'config', config: next, workers: count, tls: nextTls });
    });
  }

  /** A worker on another config than the one in force (it asked during a reload, or took a reload the others refused): it gets this one. */
  async function catchUp(worker: Worker): Promise<void> {
    try {
      await withTimeout(configure(worker, config, tls, generation), STARTUP_TIMEOUT_MS, 'no answer');
    } catch (err) {
      // It serves what it had: the next reload tries again; replacing it would only repeat this.
      logger.error(
        { worker: worker.id, err: (err as Error).message },
        'gateway worker did not take the configuration in force',
      );
    }
  }

  // Lockouts already logged, until they end: one line per lockout for the cluster, as one process logs it.
  const loggedLocks = new Map<string, number>();
  function countFailure({ key, now, settings, lockedFor }: Extract<ToPrimary, { type: 'failure' }>): void {
    const triggered = lockoutStore.recordFailure(key, now, settings);
    // Locked now, or already (a worker that had not heard yet): every worker is told.
    const seconds = lockoutStore.refusedFor(key, now, settings);
    if (seconds > 0) for (const worker of workers) send(worker, { type: 'locked', key, until: now + seconds * 1000 });
    // Either the whole count or one worker's share locked the client: said once, by the primary.
    const lockSeconds = triggered || lockedFor;
    if (lockSeconds > 0 && (loggedLocks.get(key) ?? 0) <= now) {
      if (loggedLocks.size >= 10_000) for (const [k, until] of loggedLocks) if (until <= now) loggedLocks.delete(k);
      loggedLocks.set(key, now + lockSeconds * 1000);
      logger.warn(
        { ip: key.slice(key.indexOf(':') + 1), seconds: lockSeconds },
        'client locked out after repeated authentication failures',
      );
    }
  }

  // A shared store (postgres) also learns locks from other instances: every worker is told those too.
  const unsubscribeLocked = lockoutStore.onLocked?.((key, until) => {
    for (const worker of workers) send(worker, { type: 'locked', key, until });
  });
  /** Ids of the primary's questions to workers (probes, lifts, lock lists): each answer carries its question's. */
  let questionIds = 0;
  // ...and lifts: a worker's share may hold the client even where the shared count does not.
  const unsubscribeLifted = lockoutStore.onLifted?.((key) => {
    loggedLocks.delete(key);
    for (const worker of workers) send(worker, { type: 'lift', id: ++questionIds, keys: [key] });
  });
  const unsubscribe = () => {
    unsubscribeLocked?.();
    unsubscribeLifted?.();
  };

  /** Sends `worker` a question and resolves with its answer; undefined when it exits or does not answer in time. */
  function ask<A extends Answer>(worker: Worker, question: (id: number) => ToWorker, type: A['type']) {
    return new Promise<A | undefined>((resolve) => {
      const id = ++questionIds;
      const timer = setTimeout(() => done(undefined), PROBE_TIMEOUT_MS);
      const onMessage = (message: ToPrimary) => {
        if (message.type === type && (message as Answer).id === id) done(message as A);
      };
      const onExit = () => done(undefined);
      function done(answer: A | undefined) {
        clearTimeout(timer);
        worker.off('message', onMessage);
        worker.off('exit', onExit);
        resolve(answer);
      }
      worker.on('message', onMessage);
      worker.once('exit', onExit);
      send(worker, question(id));
    });
  }

  let urls: string[];
  let started = false;
  try {
    urls = await withTimeout(
      Promise.all(Array.from({ length: count }, fork)),
      STARTUP_TIMEOUT_MS,
      'gateway workers did not start',
    );
    started = true;
  } catch (err) {
    stopping = true;
    unsubscribe();
    for (const worker of workers) worker.kill('SIGKILL');
    throw err;
  }
  const url = urls[0]!;
  logger.info({ url, workers: count, pids: [...workers].map((w) => w.process.pid) }, 'gateway workers listening');

  return {
    url,
    /**
     * Hands the new config, and the TLS pair read again, to every serving worker; resolves when
     * all have them in force. Then it is the config in force (what a worker starting later gets),
     * and a worker that started meanwhile on the previous one catches up. Refused by any worker:
     * those that took it go back to the previous one, so the rejection holds for all.
     */
    async reload(next) {
      const nextTls = readTls(next);
      const nextGeneration = generation + 1;
      try {
        await withTimeout(
          Promise.all([...serving].map((worker) => configure(worker, next, nextTls, nextGeneration))),
          STARTUP_TIMEOUT_MS,
          'gateway workers did not take the new configuration',
        );
      } catch (err) {
        for (const worker of serving) if (sentGeneration.get(worker) === nextGeneration) void catchUp(worker);
        throw err;
      }
      config = next;
      tls = nextTls;
      generation = nextGeneration;
      for (const worker of serving) if (sentGeneration.get(worker)! < generation) void catchUp(worker);
    },
    /**
     * Asks every worker (IPC) for its key state and, with `metrics`, its metrics snapshot: one
     * scrape of the primary covers them all. A worker that does not answer in time is not ready,
     * and its metrics are missing from that scrape (never made up).
     */
    async probe({ metrics }) {
      const answers = await Promise.all(
        [...workers].map((worker) =>
          ask<Extract<ToPrimary, { type: 'probed' }>>(worker, (id) => ({ type: 'probe', id, metrics }), 'probed'),
        ),
      );
      return {
        keysLoaded: answers.length > 0 && answers.every((a) => a?.keysLoaded === true),
        certificateNotAfter: earliest(answers.map((a) => a?.certificateNotAfter)),
        snapshots: answers.flatMap((a) => (a?.metrics ? [a.metrics] : [])),
      };
    },
    workerLockouts: {
      /** The locks each worker enforces (its share's too), one entry per key with the latest end. */
      async list() {
        const answers = await Promise.all(
          [...workers].map((worker) =>
            ask<Extract<ToPrimary, { type: 'lockouts' }>>(worker, (id) => ({ type: 'lockouts', id }), 'lockouts'),
          ),
        );
        return latestLocks(answers.flatMap((a) => a?.locks ?? []));
      },
      /**
       * Lifts `keys` in every worker (the primary's count is the store's, lifted by the caller):
       * the locks that were in force there, and how many live workers did not answer in time.
       */
      async lift(keys) {
        for (const key of keys) loggedLocks.delete(key); // a new lockout is logged again
        const asked = [...workers];
        const answers = await Promise.all(
          asked.map((worker) =>
            ask<Extract<ToPrimary, { type: 'lifted' }>>(
              worker,
              (id) => ({ type: 'lift', id, keys: [...keys] }),
              'lifted',
            ),
          ),
        );
        return {
          locks: latestLocks(answers.flatMap((a) => a?.locks ?? [])),
          // One that exited meanwhile enforces nothing; its replacement learns the store's locks only.
          unanswered: answers.filter((a, i) => a === undefined && !asked[i]!.isDead()).length,
        };
      },
    },
    /**
     * Asks every worker to drain and waits for them to exit: within a close's accept grace they keep
     * accepting for what is left of it (told when it is skipped), then in-flight requests get `graceMs`.
     */
    async close(graceMs) {
      stopping = true;
      unsubscribe();
      const grace = currentAcceptGrace();
      const acceptGraceMs = graceLeftMs(grace);
      const exits = [...workers].map(
        (worker) =>
          new Promise<void>((resolve) => {
            if (worker.isDead()) return resolve();
            worker.once('exit', () => resolve());
            send(worker, { type: 'shutdown', graceMs, acceptGraceMs });
          }),
      );
      const endGrace = () => workers.forEach((w) => send(w, { type: 'endAcceptGrace' }));
      grace?.skip?.addEventListener('abort', endGrace, { once: true });
      const timer = setTimeout(() => workers.forEach((w) => w.kill('SIGKILL')), acceptGraceMs + graceMs + 5_000);
      await Promise.all(exits);
      clearTimeout(timer);
      grace?.skip?.removeEventListener('abort', endGrace);
    },
  };
}

async function withTimeout<T>(promise: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${message} within ${ms / 1000} s`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** gateway.tls's pair, read (undefined without TLS); a UsageError when it cannot be. */
function readTls(config: Config): TlsPem | undefined {
  return config.gateway.tls ? readTlsPem('gateway.listen', config.gateway.tls) : undefined;
}

/** The earliest of the times given (undefined when none is). */
function earliest(times: (number | undefined)[]): number | undefined {
  const known = times.filter((t): t is number => t !== undefined);
  return known.length > 0 ? Math.min(...known) : undefined;
}
