import cluster from 'node:cluster';
import { statSync, unwatchFile, watchFile, type Stats } from 'node:fs';
import type { Command } from 'commander';
import type { Logger } from 'pino';
import { environmentWithFiles } from '../config/env-file.js';
import { environmentVariableBehind, loadConfig } from '../config/load.js';
import type { Config } from '../config/schema.js';
import { ConfigError, UsageError } from '../errors.js';
import { createLogger } from '../observability/log.js';
import { countConfigReload } from '../observability/metrics.js';
import { startGatehouse } from '../runtime/server.js';
import { resolveWorkerCount, startGatewayWorkers } from '../runtime/workers/primary.js';
import { runGatewayWorker } from '../runtime/workers/worker.js';
import { PREVIOUS_SECRET_KEYS_VARIABLE, SECRET_KEY_VARIABLE } from '../storage/secrets.js';
import { configFileOption, envFileOption } from './config.js';

/** How long a changed config file must hold still before it is reloaded (see reloadOnceStill). */
const CONFIG_SETTLE_MS = 500;

/**
 * What closing gets after the drain (acceptGrace, then timeout for requests and timeout again for
 * delivery attempts): the stores' last writes and their connections. Past it the process exits
 * whatever is pending (a stalled PostgreSQL held one 30 s and more: a query's timeout, then a pool
 * waiting for its connections), as a supervisor's kill would, but saying so first.
 */
export const SHUTDOWN_CLOSE_MS = 3_000;

/**
 * `gatehouse start`: listen until SIGTERM/SIGINT (drain). SIGHUP, or a change to the config file
 * (polled once a second; `--no-watch` turns that off), reloads it, reading the `--env-file`s again.
 */
export function registerStartCommand(program: Command): void {
  program
    .command('start')
    .description('start the gateway (and the webhook receiver when enabled)')
    .addOption(configFileOption())
    .addOption(envFileOption(', read again at every reload'))
    .option('--no-watch', 'reload on SIGHUP only, not when the config file changes')
    .action(async (options: { config: string; envFile: string[]; watch: boolean }) => {
      if (cluster.isWorker) return runGatewayWorker(); // forked by the primary below (gateway.workers > 1)
      // A SIGHUP before the listeners are up (a `systemctl reload` during a restart, a certbot hook)
      // would end the process (Node's default): it is kept, and the reload made once started.
      let reloadAsked = false;
      const askedDuringStart = () => {
        reloadAsked = true;
      };
      process.on('SIGHUP', askedDuringStart);
      const env = environmentWithFiles(options.envFile);
      adoptStartOnlyVariables(env);
      const { config, file } = loadConfig(options.config, env);
      const logger = createLogger({ level: config.log.level, format: config.log.format });
      logger.info({ config: file, pid: process.pid }, `gatehouse starting (pid ${process.pid})`);
      const workers = resolveWorkerCount(config.gateway.workers);
      const running = await startGatehouse(config, {
        logger,
        startGateway: workers > 1 ? (c, deps) => startGatewayWorkers(c, workers, deps) : undefined,
      }).catch((err: unknown) => {
        throw withPortVariable(err, config);
      });
      // The pid is in the text too: pretty (terminal) output drops the pid field, and the README says to signal it.
      logger.info({ config: file, pid: process.pid }, `gatehouse started (pid ${process.pid})`);

      let shutdownSettings = config.shutdown;
      let reloading = Promise.resolve();
      const reload = () => {
        reloading = reloading.then(async () => {
          try {
            const env = environmentWithFiles(options.envFile);
            const next = loadConfig(file, env).config;
            warnAboutStartOnlyChanges(logger, env, config, next);
            await running.reload(next);
            shutdownSettings = next.shutdown;
            countConfigReload('ok');
          } catch (err) {
            countConfigReload('rejected');
            // A UsageError is one line already (an env file's problem names its file and line).
            const problems =
              err instanceof ConfigError ? err.problems : [err instanceof Error ? err.message : String(err)];
            logger.error({ problems }, 'reload rejected: the previous configuration stays in force');
          }
        });
      };
      process.off('SIGHUP', askedDuringStart);
      process.on('SIGHUP', reload);
      if (reloadAsked) {
        logger.info('SIGHUP came during the start: reloading now');
        reload();
      }
      // Polling (not fs.watch): it survives editors and deploy tools that replace the file.
      // A file rewritten in place changes in steps (emptied, then written): the reload waits until it
      // has held still for CONFIG_SETTLE_MS, so it never reads a half-written file (a poll between
      // the two steps logged a rejected reload, and a SIGHUP right after found its answer taken).
      let settling: NodeJS.Timeout | undefined;
      const reloadOnceStill = (seen: Stats) => {
        let current: Stats;
        try {
          current = statSync(file);
        } catch {
          return; // gone for now: watchFile reports it again once it is back
        }
        if (current.mtimeMs !== seen.mtimeMs || current.size !== seen.size) {
          settling = setTimeout(reloadOnceStill, CONFIG_SETTLE_MS, current);
          return;
        }
        logger.info('config file changed: reloading');
        reload();
      };
      const onFileChange = (now: Stats, before: Stats) => {
        if (now.mtimeMs === before.mtimeMs && now.size === before.size) return;
        clearTimeout(settling);
        settling = setTimeout(reloadOnceStill, CONFIG_SETTLE_MS, now);
      };
      if (options.watch) watchFile(file, { interval: 1_000, persistent: false }, onFileChange);

      await new Promise<void>((resolve) => {
        // The first signal drains (shutdown.acceptGrace, then shutdown.timeout); a second ends the accept
        // grace at once (in-flight requests still finish); a third stops the process (Node's default).
        const skipGrace = new AbortController();
        let stopping = false;
        const stop = (signal: string) => {
          if (stopping) {
            logger.info({ signal }, 'second signal: no longer accepting; in-flight requests still finish');
            skipGrace.abort();
            process.off('SIGTERM', stop);
            process.off('SIGINT', stop);
            return;
          }
          stopping = true;
          logger.info(
            { signal },
            'shutting down: /readyz fails, still accepting for shutdown.acceptGrace, then draining',
          );
          process.off('SIGHUP', reload);
          unwatchFile(file, onFileChange);
          clearTimeout(settling);
          exitAtShutdownDeadline(logger, shutdownSettings);
          void running.close(undefined, { acceptGrace: true, skipGrace: skipGrace.signal }).then(resolve);
        };
        process.on('SIGTERM', stop);
        process.on('SIGINT', stop);
      });
      logger.info('stopped');
      logger.flush?.();
    });
}

/**
 * The drain's hard deadline (Envoy's drain, Kubernetes' terminationGracePeriod): acceptGrace, then
 * `timeout` twice (requests, then delivery attempts), then SHUTDOWN_CLOSE_MS. A process still
 * running then says what it leaves and exits 1. Nothing accepted is lost: an event whose outcome
 * was not recorded keeps its lease, and any instance delivers it once the lease runs out. The timer
 * is unref'd: a shutdown that finishes in time exits as it would without it.
 */
function exitAtShutdownDeadline(logger: Logger, shutdown: Config['shutdown']): void {
  const deadlineMs = shutdown.acceptGrace + 2 * shutdown.timeout + SHUTDOWN_CLOSE_MS;
  setTimeout(() => {
    logger.error(
      { deadlineMs, handles: process.getActiveResourcesInfo().filter((r) => r !== 'Timeout') },
      'shutdown deadline passed: exiting with closing unfinished; events whose outcome was not recorded keep their leases and are delivered again',
    );
    process.exit(1); // pino writes out what it holds on exit
  }, deadlineMs).unref();
}

/**
 * Variables read from process.env by code that is not handed the environment view, and only at
 * start: the sealing keys (src/storage/secrets.ts; the webhook side and Gmail take them once, and
 * gateway workers inherit process.env when forked). Taken from the env files here, once, so the
 * files can hold them; never at a reload, since a key swapped in some processes and not others
 * could not open what the others sealed (its rotation is a restart: docs/operations/rotation.md).
 */
const START_ONLY_VARIABLES = [SECRET_KEY_VARIABLE, PREVIOUS_SECRET_KEYS_VARIABLE];

function adoptStartOnlyVariables(env: NodeJS.ProcessEnv): void {
  for (const name of START_ONLY_VARIABLES) if (env[name] !== undefined) process.env[name] = env[name];
}

/** Said at a reload: what the env files or the config changed that only a restart applies. */
function warnAboutStartOnlyChanges(logger: Logger, env: NodeJS.ProcessEnv, config: Config, next: Config): void {
  for (const name of START_ONLY_VARIABLES)
    if (env[name] !== process.env[name]) logger.warn(`${name} changed: it takes effect at the next restart`);
  if (config.log.level !== next.log.level || config.log.format !== next.log.format)
    logger.warn('log changed: it takes effect at the next restart');
}

/**
 * "gateway.listen 127.0.0.1:8080 is already in use", for a port written as `${GATEHOUSE_PORT:-8080}`,
 * also says which variable moves it (found by a newcomer: the demo named it for its own ports only).
 * Matched on the text: a gateway worker's failure reaches here as its message.
 */
function withPortVariable(err: unknown, config: Config): unknown {
  const listener =
    err instanceof UsageError ? /^(\w+)\.listen \S+ is already in use$/.exec(err.message)?.[1] : undefined;
  const variable = listener && environmentVariableBehind(config, `${listener}.listen.port`);
  return variable ? new UsageError(`${(err as Error).message} (set ${variable} to another port)`) : err;
}
