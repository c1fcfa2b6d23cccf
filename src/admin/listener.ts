import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { describeChannel } from '../integrations/channels/status.js';
import { DELIVERY_STATUSES, type EventStore } from '../storage/contracts/events.js';
import type { AdminConfig, Config } from '../config/schema.js';
import { HttpError } from '../errors.js';
import { adminApi } from './api.js';
import { AdminFailureThrottle } from './failure-throttle.js';
import { webConsole } from './console/console.js';
import type { AdminSources } from './sources.js';
import { admitRequest, answerHealthy, respondWithError, type RequestLog } from '../http/request-context.js';
import type { GmailStore } from '../integrations/gmail/state.js';
import { closeServer, listen } from '../http/listener.js';
import { openGmailStore } from '../storage/open.js';
import { METRICS_CONTENT_TYPE, recordBuildInfo, renderMetrics, scrapeGauges } from '../observability/metrics.js';
import { POSTGRES_SCHEMA_VERSION } from '../storage/postgres/migrations.js';
import { SQLITE_SCHEMA_VERSION } from '../storage/sqlite/migrations.js';
import { VERSION } from '../version.js';
import { StateChangeLog } from '../observability/log.js';

export type { AdminSources, GatewayProbe } from './sources.js';

export interface RunningAdmin {
  url: string;
  /** From now on /readyz answers 503 (`draining`): called first thing on SIGTERM. */
  startDraining(): void;
  /** The token and the gauges' config follow a reload; the listen address and limits need a restart. */
  reload(next: Config): void;
  close(graceMs: number): Promise<void>;
}

/** How long /readyz waits for the store's write probe before calling it failed. */
const STORE_PROBE_TIMEOUT_MS = 2_000;
const ROUTES = new Set(['/metrics', '/readyz', '/healthz']);

/**
 * The operator's listener (`admin`): GET/HEAD on three paths, and the admin API.
 * - `/metrics`: Prometheus text, summed over the gateway workers; `Authorization: Bearer <token>`
 *   when `admin.token` is set (compared in constant time, 401 otherwise).
 * - `/readyz`: 200 only when the store takes writes, the JWKS (if any) is loaded and the process
 *   is not draining; 503 naming the failing checks otherwise. No token: load balancers probe it.
 * - `/healthz`: liveness (200 while the process answers), as on the other listeners.
 * - `/admin/api/`: the admin API (src/admin/api.ts), only with `admin.token` set, and given as the
 *   Bearer token or as a console session (its cookie; a change also needs its CSRF token).
 * - `/console/`: the web console's files and sign-in (src/admin/console/console.ts).
 * Everything else is 404, other methods 405; every parser limit is set (`admin.limits`).
 */
export async function startAdmin(initial: Config, sources: AdminSources, logger: Logger): Promise<RunningAdmin> {
  let config = initial;
  let admin: AdminConfig = initial.admin!;
  let tokenDigest = admin.token === undefined ? undefined : digest(admin.token);
  let draining = false;
  const limits = admin.limits; // the listener's, fixed at start
  // Scrapes and probes come every few seconds: their lines are debug, not info.
  // Refused credentials at info: a token guessed at leaves a trace at the default level (others are debug).
  const log: RequestLog = (fields) =>
    fields.status === 401 || fields.status === 403
      ? logger.info(fields, 'admin request refused')
      : logger.debug(fields, 'admin request');
  const said = new StateChangeLog(logger);
  // Opened at the first scrape that needs it (its constructor runs the schema), then kept.
  let gmailState: GmailStore | undefined;
  const gmailStateOf = (store: EventStore) => (gmailState ??= openGmailStore(store));
  const driver = initial.storage.driver;
  recordBuildInfo({
    version: VERSION,
    node: process.version,
    storage_driver: driver,
    schema: String(driver === 'postgres' ? POSTGRES_SCHEMA_VERSION : SQLITE_SCHEMA_VERSION),
  });

  const throttle = new AdminFailureThrottle();
  /** The token digest each admitted admin API request was checked against (see stillAuthorized). */
  const admittedUnder = new WeakMap<IncomingMessage, Buffer>();
  /** Who made each admitted admin API request, for the log of what it changed. */
  const admittedAs = new WeakMap<IncomingMessage, string>();

  /** The Bearer token, when one is required; wrong ones count towards the address's throttle. */
  function authorized(req: IncomingMessage): boolean {
    if (tokenDigest === undefined) return true;
    const address = req.socket.remoteAddress ?? 'unknown';
    throttle.refuseIfThrottled(address);
    if (bearerMatches(req, tokenDigest)) return true;
    throttle.recordFailure(address);
    return false;
  }

  function bearerMatches(req: IncomingMessage, tokenDigest: Buffer): boolean {
    // Exactly one Authorization line, as on /api/ (Node keeps only the first of several).
    const lines = req.headersDistinct.authorization;
    const header = lines?.length === 1 ? lines[0] : undefined;
    const given = header !== undefined && /^Bearer [\x21-\x7e]+$/i.test(header) ? header.slice(7) : '';
    // Digests of equal length, so the comparison time says nothing about the token (nor its length).
    return timingSafeEqual(digest(given), tokenDigest);
  }

  async function metrics(res: ServerResponse): Promise<void> {
    const [probe] = await Promise.all([
      sources.probeGateway({ metrics: true }),
      refreshGauges(config, sources, gmailStateOf, said),
    ]);
    scrapeGauges.tlsCertificateExpiresIn.reset();
    if (probe.certificateNotAfter !== undefined)
      scrapeGauges.tlsCertificateExpiresIn.set(
        { listener: 'gateway' },
        (probe.certificateNotAfter - Date.now()) / 1000,
      );
    const body = await renderMetrics(probe.snapshots);
    res.writeHead(200, {
      'content-type': METRICS_CONTENT_TYPE,
      'content-length': Buffer.byteLength(body),
      'cache-control': 'no-store',
    });
    res.end(body);
  }

  async function readiness(res: ServerResponse): Promise<void> {
    // While draining the store is being closed: probing it would only add a second failure.
    const [store, keys] = await Promise.all([
      draining ? 'skipped' : storeCheck(sources.store, said),
      sources.probeGateway({ metrics: false }).then(
        (p) => (p.keysLoaded ? 'ok' : 'the JWKS has not been loaded yet'),
        (err: Error) => `the gateway did not answer: ${err.message}`,
      ),
    ]);
    const checks = { store, jwks: keys, draining: draining ? 'the process is shutting down' : 'ok' };
    const failing = Object.entries(checks)
      .filter(([, v]) => v !== 'ok' && v !== 'skipped')
      .map(([k]) => k);
    const body = JSON.stringify({ status: failing.length === 0 ? 'ready' : 'not_ready', failing, checks });
    res.writeHead(failing.length === 0 ? 200 : 503, {
      'content-type': 'application/json; charset=utf-8',
      'content-length': Buffer.byteLength(body),
      'cache-control': 'no-store',
    });
    res.end(body);
  }

  /**
   * Whether the token an admin API request was admitted with is still the token: asked again after
   * a body has arrived (a retry), so a request begun before a rotation and finished after it is
   * refused, not run with the old token.
   */
  function stillAuthorized(req: IncomingMessage): boolean {
    const admitted = admittedUnder.get(req);
    return admitted !== undefined && tokenDigest !== undefined && admitted.equals(tokenDigest);
  }

  const handleAdminApi = adminApi({
    sources,
    config: () => config,
    logger,
    bodyTimeoutMs: limits.requestTimeoutMs,
    stillAuthorized,
    who: (req) => admittedAs.get(req) ?? 'admin token',
  });
  const consoleApp = webConsole({
    tokenDigest: () => tokenDigest,
    digest,
    throttle,
    logger,
    bodyTimeoutMs: limits.requestTimeoutMs,
  });

  /**
   * The admin API's two ways in: an Authorization header is judged alone (Bearer, as /metrics);
   * without one, a console session cookie (the console checks origin and CSRF token).
   */
  function admitToAdminApi(req: IncomingMessage): void {
    // Events, their bodies and retries: never without a token, even on loopback.
    if (tokenDigest === undefined) throw new HttpError('admin_api_disabled', 'admin.token is not set');
    if (req.headers.authorization === undefined && consoleApp.carriesSession(req))
      admittedAs.set(req, `console session ${consoleApp.sessionOf(req).label}`);
    else if (!authorized(req)) throw unauthorized();
    else admittedAs.set(req, 'admin token');
    admittedUnder.set(req, tokenDigest);
  }

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = req.url ?? '';
    const queryAt = url.indexOf('?');
    const path = queryAt === -1 ? url : url.slice(0, queryAt);
    if (path.startsWith('/admin/api/')) {
      admitToAdminApi(req);
      return handleAdminApi(req, res, new URL(url, 'http://admin.invalid'));
    }
    if (path === '/console' || path.startsWith('/console/')) return consoleApp.handleConsole(req, res, path);
    if (!ROUTES.has(path)) throw new HttpError('not_found', `no admin route ${path}`);
    if (req.method !== 'GET' && req.method !== 'HEAD')
      throw new HttpError('method_not_allowed', `${req.method} ${path}`, { allow: 'GET, HEAD' });
    if (path === '/healthz') return answerHealthy(res);
    if (path === '/readyz') return readiness(res);
    if (!authorized(req)) throw unauthorized();
    return metrics(res);
  }

  const listening = await listen('admin.listen', admin.listen, undefined, limits, (req, res) => {
    if (!admitRequest(req, res, log, limits, logger)) return;
    route(req, res).catch((err: unknown) => respondWithError(req, res, err, logger));
  });
  logger.info(
    {
      url: listening.url,
      tokenRequired: tokenDigest !== undefined,
      console: tokenDigest === undefined ? undefined : `${listening.url}/console/`,
    },
    'admin listener on /metrics, /readyz, /healthz',
  );
  return {
    url: listening.url,
    startDraining() {
      draining = true;
    },
    reload(next) {
      if (!next.admin) {
        logger.warn('admin removed from the configuration: the admin listener stays until the next restart');
        return;
      }
      config = next;
      admin = next.admin;
      const before = tokenDigest;
      tokenDigest = admin.token === undefined ? undefined : digest(admin.token);
      // A session stands for the token it was signed in with: a new token (or none) ends them all.
      if (before !== undefined && (tokenDigest === undefined || !tokenDigest.equals(before)))
        consoleApp.endSessions(tokenDigest === undefined ? 'admin.token was removed' : 'admin.token changed');
    },
    close: (graceMs) => closeServer(listening.server, graceMs),
  };
}

function unauthorized(): HttpError {
  return new HttpError('invalid_admin_token', 'missing or wrong admin token', {
    'www-authenticate': 'Bearer realm="gatehouse-admin"',
  });
}

function digest(text: string): Buffer {
  return createHash('sha256').update(text).digest();
}

/** 'ok', 'skipped' (no event store: webhooks off), or why the store does not take writes now. */
async function storeCheck(store: EventStore | undefined, said: StateChangeLog): Promise<string> {
  if (!store) return 'skipped';
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      store.probeWrite(),
      new Promise((_, reject) => {
        timer = setTimeout(
          () => reject(new Error(`no answer within ${STORE_PROBE_TIMEOUT_MS} ms`)),
          STORE_PROBE_TIMEOUT_MS,
        );
      }),
    ]);
    said.worked('readiness: the store does not take writes', 'readiness: the store takes writes again');
    return 'ok';
  } catch (err) {
    said.failed('readiness: the store does not take writes', (err as Error).message);
    // The code, not the message: /readyz has no token, and driver messages can name hosts and users.
    return `the store does not take writes (${(err as NodeJS.ErrnoException).code ?? 'error'})`;
  } finally {
    clearTimeout(timer);
  }
}

/** Sets the gauges read from the stores; a store that cannot answer leaves its gauges out of this scrape. */
async function refreshGauges(
  config: Config,
  sources: AdminSources,
  gmailStateOf: (store: EventStore) => GmailStore,
  said: StateChangeLog,
): Promise<void> {
  const now = Date.now();
  const g = scrapeGauges;
  g.lockoutsActive.set({}, sources.lockoutStore.activeLocks?.(now).length ?? 0);
  g.queueEvents.reset();
  g.queueOldestDue.reset();
  if (sources.store) {
    try {
      const stats = await sources.store.queueStats(now);
      // Every configured action shows every status, 0 included: alerts on `dead > 0` need the series.
      // Delivered is left out while it is unknown (the first count after a start still running), never shown as 0.
      const known = stats.deliveredCounted ? DELIVERY_STATUSES : DELIVERY_STATUSES.filter((s) => s !== 'delivered');
      for (const action of Object.keys(config.webhooks.targets))
        for (const status of known) g.queueEvents.set({ action, status }, 0);
      for (const { action, status, events } of stats.counts) g.queueEvents.set({ action, status }, events);
      g.queueOldestDue.set({}, stats.oldestDueAt === undefined ? 0 : Math.max(0, now - stats.oldestDueAt) / 1000);
      said.worked('metrics: the queue could not be read', 'metrics: the queue is read again');
    } catch (err) {
      said.failed('metrics: the queue could not be read', (err as Error).message);
    }
  }
  g.channelConnected.reset();
  if (sources.channelStore) {
    for (const [name, channel] of Object.entries(config.channels)) {
      try {
        g.channelConnected.set(
          { channel: name },
          (await describeChannel(name, channel, sources.channelStore)).connected ? 1 : 0,
        );
        said.worked(
          `metrics: the state of channel ${name} could not be read`,
          `metrics: channel ${name} is read again`,
        );
      } catch (err) {
        said.failed(`metrics: the state of channel ${name} could not be read`, (err as Error).message, {
          channel: name,
        });
      }
    }
  }
  g.gmailWatchExpiresIn.reset();
  g.gmailLastErrorAt.reset();
  g.gmailLastNotificationAt.reset();
  const gmail = config.webhooks.gmail;
  if (gmail && sources.store) {
    let state;
    try {
      state = await gmailStateOf(sources.store).get(gmail.account);
      said.worked('metrics: the Gmail state could not be read', 'metrics: the Gmail state is read again');
    } catch (err) {
      return void said.failed('metrics: the Gmail state could not be read', (err as Error).message);
    }
    const labels = { account: gmail.account };
    if (state?.watchExpiration != null) g.gmailWatchExpiresIn.set(labels, (state.watchExpiration - now) / 1000);
    g.gmailLastErrorAt.set(labels, (state?.lastErrorAt ?? 0) / 1000);
    g.gmailLastNotificationAt.set(labels, (state?.lastNotificationAt ?? 0) / 1000);
  }
}
