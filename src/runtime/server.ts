import type { Logger } from 'pino';
import { startAdmin, type GatewayProbe } from '../admin/listener.js';
import type { ListenerUrls } from '../admin/sources.js';
import { buildGatewayApp, type GatewayApp } from '../gateway/app.js';
import { redactUrlCredentials } from '../config/redact.js';
import { isLoopbackHost, type Config, type GmailConfig } from '../config/schema.js';
import { configWarnings } from '../config/warnings.js';
import { FailureLockout, MemoryLockoutStore, type LockoutStore } from '../http/lockout.js';
import { RateLimitState } from '../gateway/rate-limit.js';
import { startRateLimitSync } from '../gateway/rate-limit-sync.js';
import { Deliverer } from '../webhooks/delivery/deliverer.js';
import { channelRoutes } from '../integrations/channels/inbound.js';
import { createChannelSender } from '../integrations/channels/outbound.js';
import { startGrantRefresher } from '../integrations/channels/refresh.js';
import type { ChannelStore } from '../integrations/channels/state.js';
import { closeServer, listen, type Listening } from '../http/listener.js';
import type { TlsPem } from '../http/tls.js';
import { ResourceStack } from './resources.js';
import { lockoutControl } from './lockouts.js';
import { withAcceptGrace } from '../http/accept-grace.js';
import { WebSocketConnections } from '../gateway/websocket.js';
import { enableMetrics } from '../observability/metrics.js';
import { startTracing, stopTracing } from '../observability/tracing.js';
import { gmailPushVerifier, startGmail, type GmailPushRoute, type RunningGmail } from '../integrations/gmail/run.js';
import { HttpError } from '../errors.js';
import { needsSecretKey, secretKeysFromEnv } from '../storage/secrets.js';
import { buildWebhookApp, type IntegrationRoute, type WebhookApp } from '../webhooks/receiver.js';
import { createVerifier } from '../webhooks/verifiers/index.js';
import {
  describeStorage,
  openChannelStore,
  openEventStore,
  openRateLimitStore,
  openSharedLockoutStore,
  storeReadiness,
} from '../storage/open.js';
import type { EventStore } from '../webhooks/store.js';

export interface RunningGatehouse {
  gateway: { url: string };
  /** The webhook receiver, when `webhooks.enabled`. */
  webhooks?: Listening & { store: EventStore; deliverer: Deliverer };
  /** The admin listener (/metrics, /readyz), when `admin` is configured. */
  admin?: { url: string };
  /** Swaps in a new config without dropping in-flight requests (and reads the TLS files again). Listen addresses need a restart. */
  reload(config: Config): Promise<void>;
  /**
   * Drains, then closes; /readyz answers 503 from the first moment (the admin listener closes last).
   * With `acceptGrace` (what SIGTERM does), the listeners first keep accepting for `shutdown.acceptGrace`
   * of the config in force, every answer saying `Connection: close`; `skipGrace` aborted ends that
   * early (a second signal). Then they stop accepting, in-flight requests and WebSockets get `graceMs`
   * (default `shutdown.timeout`) to finish, and the rest is cut.
   */
  close(graceMs?: number, options?: { acceptGrace?: boolean; skipGrace?: AbortSignal }): Promise<void>;
}

/** Starts the listeners for a validated config: the /api/ edge, and the webhook receiver when enabled. */
export async function startGatehouse(
  initial: Config,
  options: {
    logger: Logger;
    lockoutStore?: LockoutStore;
    /** default: the one `storage` names (src/storage/open.ts) */
    eventStore?: EventStore;
    /** default: the /api/ edge in this process (see workers/ for the cluster) */
    startGateway?: GatewayStarter;
  },
): Promise<RunningGatehouse> {
  const { logger } = options;
  let config = initial;
  // Before any app is built: they bind their instruments when built (src/observability/metrics.ts).
  if (config.admin) enableMetrics();
  const resources = new ResourceStack();
  const { gateway, webhooks, admin } = await resources.open(async () => {
    // Before any app is built (they ask for it once), and closed last: the final spans are flushed.
    await startTracing(config.observability.tracing, logger);
    resources.defer(() => stopTracing());
    // On postgres every instance shares the lockout (counted there, checked here in memory).
    const sharedLockout =
      options.lockoutStore === undefined ? await openSharedLockoutStore(config.storage, { logger }) : undefined;
    if (sharedLockout) resources.defer(() => sharedLockout.close());
    const lockoutStore = options.lockoutStore ?? sharedLockout ?? new MemoryLockoutStore();
    // What can refuse the webhook side's start comes before any listener, so a refused start has
    // listened on nothing: a key missing for sealed tokens, a SQLite file another server holds.
    let ownStore: EventStore | undefined;
    let ownStoreHandedOver = false;
    if (config.webhooks.enabled && options.eventStore === undefined) {
      if (needsSecretKey(config)) secretKeysFromEnv();
      const store = await openEventStore(config.storage, { role: 'server', logger });
      ownStore = store;
      resources.defer(() => (ownStoreHandedOver ? undefined : store.close()));
    }
    const gateway = await (options.startGateway ?? startGateway)(config, { logger, lockoutStore });
    const receiver: { webhooks?: RunningWebhooks } = {};
    // The two listeners drain side by side, before the admin listener closes (see close() below).
    resources.defer(
      async (graceMs) => void (await Promise.all([gateway.close(graceMs), receiver.webhooks?.close(graceMs)])),
    );
    ownStoreHandedOver = ownStore !== undefined; // startWebhooks closes it from here on, whatever happens
    const webhooks = await startWebhooks(config, logger, lockoutStore, options.eventStore ?? ownStore);
    receiver.webhooks = webhooks;
    const listeners: ListenerUrls = { gateway: gateway.url, webhooks: webhooks?.listening.url }; // admin: once it listens
    const admin = config.admin
      ? await startAdmin(
          config,
          {
            probeGateway: gateway.probe,
            lockoutStore,
            lockouts: lockoutControl(lockoutStore, gateway),
            listeners: () => listeners,
            store: webhooks?.listening.store,
            channelStore: webhooks?.channelStore,
          },
          logger,
        )
      : undefined;
    listeners.admin = admin?.url;
    return { gateway, webhooks, admin };
  });

  return {
    gateway: { url: gateway.url },
    webhooks: webhooks?.listening,
    admin: admin && { url: admin.url },
    async reload(next) {
      warnAboutRestartOnlyChanges(logger, config, next);
      await gateway.reload(next);
      webhooks?.reload(next);
      admin?.reload(next);
      config = next;
      logger.info('configuration reloaded');
    },
    async close(graceMs = config.shutdown.timeout, { acceptGrace = false, skipGrace } = {}) {
      // /readyz turns 503 at once and the admin listener closes last: a load balancer sees the drain.
      admin?.startDraining();
      const grace = { ms: acceptGrace ? config.shutdown.acceptGrace : 0, skip: skipGrace };
      try {
        await withAcceptGrace(grace, () => resources.close(graceMs));
      } finally {
        await admin?.close(1_000);
      }
    },
  };
}

export function warnAboutRestartOnlyChanges(logger: Logger, config: Config, next: Config): void {
  for (const [what, before, after] of [
    ['gateway.listen', config.gateway.listen, next.gateway.listen],
    ['gateway.tls (whether it is configured)', config.gateway.tls !== undefined, next.gateway.tls !== undefined],
    ['gateway.limits', config.gateway.limits, next.gateway.limits],
    ['webhooks.limits', config.webhooks.limits, next.webhooks.limits],
    ['gateway.workers', config.gateway.workers, next.gateway.workers],
    ['webhooks.enabled', config.webhooks.enabled, next.webhooks.enabled],
    ['admin (whether it is configured)', config.admin !== undefined, next.admin !== undefined],
    ['admin.listen', config.admin?.listen, next.admin?.listen],
    ['admin.limits', config.admin?.limits, next.admin?.limits],
    ['webhooks.listen', config.webhooks.listen, next.webhooks.listen],
    ['webhooks.gmail', config.webhooks.gmail, next.webhooks.gmail],
    ['storage', config.storage, next.storage],
    ['observability', config.observability, next.observability],
    // Channel settings reload; the first channel added (or the last removed) needs a restart.
    [
      'channels (whether any are configured)',
      Object.keys(config.channels).length > 0,
      Object.keys(next.channels).length > 0,
    ],
  ] as const) {
    if (JSON.stringify(before) !== JSON.stringify(after))
      logger.warn(`${what} changed: it takes effect at the next restart`);
  }
}

/** The /api/ edge as the rest of gatehouse drives it: in this process, or in worker processes. */
export interface RunningGateway {
  url: string;
  /**
   * Puts the new config in force (apps are built, and keys prefetched, before the swap). `tls`:
   * the pair to serve, already read (a gateway worker gets the primary's); else read from the files.
   */
  reload(next: Config, tls?: TlsPem): Promise<void>;
  /** For the admin listener: whether the keys are loaded, and (with `metrics`) the workers' metrics. */
  probe(options: { metrics: boolean }): Promise<GatewayProbe>;
  /**
   * Gateway workers only (the admin API's lockouts): the locks they enforce, their own shares'
   * included, and a lift in every one. In one process the gateway counts in the store itself.
   */
  workerLockouts?: {
    list(): Promise<[string, number][]>;
    lift(keys: readonly string[]): Promise<{ locks: [string, number][]; unanswered: number }>;
  };
  close(graceMs: number): Promise<void>;
}

export type GatewayStarter = (
  config: Config,
  deps: {
    logger: Logger;
    lockoutStore: LockoutStore;
    /** The part of every rate limit this process enforces: 1/N in each of N gateway workers (workers/primary.ts); on Postgres whole buckets, shared. */
    rateLimitShare?: number;
    /** The TLS pair to serve, already read (a gateway worker gets the primary's); else gateway.tls's files are read. */
    tls?: TlsPem;
  },
) => Promise<RunningGateway>;

/** The /api/ edge in this process (with `gateway.workers` > 1, what each worker runs). */
export const startGateway: GatewayStarter = async (initial, options) => {
  const { logger } = options;
  let config = initial;
  const lockout = new FailureLockout(options.lockoutStore, config.gateway.auth.failures, 'gateway');
  const resources = new ResourceStack();
  // Channels' outbound API needs their grants (a connection of its own: workers have one each),
  // opened with the first channel, perhaps at a reload; closed last.
  let channelStore: ChannelStore | undefined;
  resources.defer(() => channelStore?.close());
  const channelsOf = async (c: Config) => {
    if (Object.keys(c.channels).length === 0) return undefined;
    channelStore ??= await openChannelStore(c.storage, { role: 'server', logger });
    return createChannelSender(c, { store: channelStore, secretKeys: secretKeysFromEnv(), logger });
  };
  // Outlives each app: a reload keeps the buckets of the limits it leaves unchanged. Shared on
  // Postgres: then each process (each worker too) holds whole buckets and syncs them itself.
  const rateLimitStore = openRateLimitStore(config.storage);
  const rateLimits = new RateLimitState(rateLimitStore ? 1 : options.rateLimitShare);
  const rateLimitSync = rateLimitStore ? startRateLimitSync(rateLimits, rateLimitStore, { logger }) : undefined;
  if (rateLimitSync) resources.defer(() => rateLimitSync.close());
  // The parser limits are the listener's: fixed at start, whatever a reload says.
  const limits = config.gateway.limits;
  // Outlive each app: a reload checks every open WebSocket against the new config.
  const websockets = new WebSocketConnections();
  let app!: GatewayApp;
  const listening = await resources.open(async () => {
    app = await buildGatewayApp(config, {
      logger,
      lockout,
      rateLimits,
      channels: await channelsOf(config),
      limits,
      websockets,
    });
    resources.defer(() => app.close()); // the app in force then: releases its idle upstream connections
    const tls = config.gateway.tls && (options.tls ?? config.gateway.tls);
    const opened = await listen(
      'gateway.listen',
      config.gateway.listen,
      tls,
      limits,
      (req, res) => app.handle(req, res),
      (req, res, head) => app.upgrade(req, res, head),
    );
    // Open WebSockets are held to the same drain window, then closed (the server waits for them too).
    resources.defer(
      async (graceMs) => void (await Promise.all([closeServer(opened.server, graceMs), websockets.drain(graceMs)])),
    );
    return opened;
  });
  describeGateway(logger, config, app, listening.url, 'gateway listening');
  void warmUp(logger, app);
  return {
    url: listening.url,
    async reload(next, tls) {
      const nextApp = await buildGatewayApp(next, {
        logger,
        lockout,
        rateLimits,
        channels: await channelsOf(next),
        limits,
        websockets,
      });
      await warmUp(logger, nextApp);
      // The TLS pair is read again (or given, the primary's): a renewed certificate at the same paths is served from now on.
      // One that does not load refuses the whole reload (turning TLS on or off needs a restart).
      if (listening.certificate && next.gateway.tls) {
        try {
          listening.certificate.replace(tls ?? next.gateway.tls);
        } catch (err) {
          nextApp.close();
          throw err;
        }
      }
      const previous = app;
      app = nextApp;
      lockout.configure(next.gateway.auth.failures);
      rateLimits.retain(app.rateLimitSignatures);
      config = next;
      previous.close();
      describeGateway(logger, config, app, listening.url, 'gateway configuration now in force');
      // A connection lives no longer than its credential: those the new config refuses are closed now.
      const current = app;
      void websockets
        .recheck((credentials) => current.stillAllowed(credentials))
        .then((closed) => {
          if (closed > 0)
            logger.info({ closed }, 'WebSockets closed: the configuration now in force refuses their credentials');
        });
    },
    probe: async () => ({
      keysLoaded: app.authenticator.jwt?.keysLoaded ?? true,
      certificateNotAfter: listening.certificate?.notAfter,
      snapshots: [],
    }),
    /** The listener drains (up to `graceMs`), then the app, the rate-limit sync and the channel store close. */
    close: (graceMs) => resources.close(graceMs),
  };
};

export type RunningWebhooks = NonNullable<Awaited<ReturnType<typeof startWebhooks>>>;

/**
 * The receiver's listener, its store and its deliverer (undefined when `webhooks.enabled` is
 * false); reload swaps endpoints, targets and delivery settings. On SQLite, one process per
 * file (the store's single writer); on Postgres, any number of instances share the queue.
 */
export async function startWebhooks(
  config: Config,
  logger: Logger,
  lockoutStore: LockoutStore,
  injectedStore?: EventStore,
) {
  if (!config.webhooks.enabled) {
    logger.info('webhook receiver off (webhooks.enabled is false)');
    return undefined;
  }
  const hasChannels = Object.keys(config.channels).length > 0;
  const resources = new ResourceStack();
  return resources.open(async () => {
    // The store is this function's from the call on (an injected one too): closed on every failure below.
    if (injectedStore) resources.defer(() => injectedStore.close());
    // No key, no start (said with how to make one), before storage is opened.
    const secretKeys = needsSecretKey(config) ? secretKeysFromEnv() : undefined;
    const store = injectedStore ?? (await openEventStore(config.storage, { role: 'server', logger }));
    if (!injectedStore) resources.defer(() => store.close());
    const lockout = new FailureLockout(lockoutStore, config.gateway.auth.failures, 'webhooks');
    const deliverer = new Deliverer(store, config.webhooks, logger);
    resources.defer((graceMs) => deliverer.stop(graceMs));
    const onAccepted = () => deliverer.notify();
    const channelStore = hasChannels ? await openChannelStore(config.storage, { role: 'server', logger }) : undefined;
    if (channelStore) resources.defer(() => channelStore.close());
    // The Gmail route is fixed at start (webhooks.gmail changes need a restart); channel routes follow reloads.
    const gmailConfig = config.webhooks.gmail;
    let gmail: RunningGmail | undefined;
    let gmailRoutes: IntegrationRoute[] = [];
    let closing = false;
    resources.defer(() => gmail?.close());
    const startGmailHere = async (gmailConfig: GmailConfig) => {
      gmail = await startGmail(gmailConfig, { store, logger, onAccepted, secretKeys: secretKeys! });
      gmailRoutes = gmailPushRoutes(gmailConfig, gmail.push);
    };
    const readiness = storeReadiness(store);
    if (gmailConfig && readiness.ready) await startGmailHere(gmailConfig);
    // Started without the database, Gmail waits for it (Pub/Sub's pushes get 503 meanwhile); so does the deliverer.
    else if (gmailConfig) gmailRoutes = gmailPushRoutes(gmailConfig, undefined);
    const startOnceReached = async () => {
      await readiness.whenReady();
      for (let failures = 0; !closing; failures++) {
        try {
          await deliverer.start();
          break;
        } catch (err) {
          // The database went away again between the schema check and this: asked again shortly.
          if (failures === 0) logger.warn({ err: (err as Error).message }, 'deliveries wait for the database');
          await new Promise((resolve) => setTimeout(resolve, 2_000).unref());
        }
      }
      if (closing || !gmailConfig) return;
      try {
        await startGmailHere(gmailConfig);
        if (closing) return void (await gmail?.close());
        app = build(current);
        logger.info('Gmail started: the database is reached');
      } catch (err) {
        logger.error({ problem: (err as Error).message }, 'Gmail could not start; it stays off until a restart');
      }
    };
    const refresher = channelStore
      ? startGrantRefresher(config, { store: channelStore, secretKeys: secretKeys!, logger })
      : undefined;
    if (refresher) resources.defer(() => refresher.close());
    const limits = config.webhooks.limits; // the listener's, fixed at start
    const build = (c: Config): WebhookApp => {
      const channels = channelStore
        ? channelRoutes(c, { store: channelStore, secretKeys: secretKeys!, logger })
        : { routes: [], prefixRoutes: [] };
      return buildWebhookApp(c, {
        logger,
        lockout,
        store,
        onAccepted,
        limits,
        routes: [...gmailRoutes, ...channels.routes],
        prefixRoutes: channels.prefixRoutes,
      });
    };
    let current = config;
    let app = build(config);
    // Nothing half-started may keep the process alive (a port in use must exit 1, not hang).
    const listening = await listen('webhooks.listen', config.webhooks.listen, undefined, limits, (req, res) =>
      app.handle(req, res),
    );
    resources.defer((graceMs) => closeServer(listening.server, graceMs));
    resources.defer(() => void (closing = true)); // first: what waits for the database starts nothing now
    if (readiness.ready) await deliverer.start();
    else void startOnceReached();
    logger.info(
      {
        url: listening.url,
        endpoints: [
          ...config.webhooks.endpoints.map((e) => `${e.path} (${e.verify.type}) -> ${e.action}`),
          ...gmailRoutes.map((r) => `${r.path} (${r.verifyType}) -> ${r.action}`),
          ...Object.entries(config.channels).map(
            ([name, c]) => `/webhook/channels/${name} (channel ${c.kind}) -> ${c.action}`,
          ),
        ],
        storage: `${config.storage.driver} ${describeStorage(config.storage)}`,
      },
      'webhook receiver listening',
    );
    return {
      listening: { ...listening, store, deliverer },
      channelStore,
      reload(next: Config) {
        current = next;
        app = build(next);
        refresher?.reconfigure(next);
        lockout.configure(next.gateway.auth.failures);
        deliverer.reconfigure(next.webhooks);
      },
      /** The listener drains first; then the refresher, Gmail, the channel store, the deliverer (up to `graceMs`) and the store. */
      close: (graceMs: number) => resources.close(graceMs),
    };
  });
}

/** The receiver's route for Gmail's Pub/Sub pushes; while Gmail waits for the database (no `push` yet), answered 503. */
function gmailPushRoutes(config: GmailConfig, push: GmailPushRoute | undefined): IntegrationRoute[] {
  if (config.mode !== 'push' || !config.push) return [];
  const route = push ?? {
    path: config.push.path,
    verify: gmailPushVerifier(config, config.push),
    consume: () => {
      throw new HttpError('store_unavailable', 'Gmail waits for the database', { 'retry-after': '5' });
    },
  };
  return [
    {
      path: route.path,
      action: config.action,
      verifyType: 'gmail push',
      verifier: createVerifier(route.verify),
      consume: route.consume,
      countsFailures: false,
    },
  ];
}

async function warmUp(logger: Logger, app: GatewayApp): Promise<void> {
  const problem = await app.warmUp();
  if (problem) logger.warn({ problem }, 'could not prefetch the JWKS; it will be fetched on the first bearer request');
}

function describeGateway(logger: Logger, config: Config, app: GatewayApp, url: string, message: string): void {
  const { auth, upstream, trustProxy, routes, rateLimits } = config.gateway;
  logger.info(
    {
      url,
      upstream: redactUrlCredentials(upstream.target),
      routes: routes.length
        ? routes.map(
            (r) =>
              `${r.prefix} -> ${redactUrlCredentials(r.upstream.target)}${r.stripPrefix ? ` (strip ${r.stripPrefix})` : ''}`,
          )
        : undefined,
      rules: auth.rules.length || undefined,
      rateLimits: rateLimits.length || undefined,
      auth: auth.enabled ? app.authenticator.methods : 'disabled',
      require: auth.require,
      allowedIPs: auth.allowedIPs ?? 'any',
      trustProxy,
    },
    message,
  );
  if (
    auth.allowInsecure &&
    (!auth.enabled || app.authenticator.methods.length === 0) &&
    !isLoopbackHost(config.gateway.listen.host)
  ) {
    logger.warn(`INSECURE: /api/ on ${url} is open to anyone who can reach it (gateway.auth.allowInsecure is true)`);
  }
  for (const warning of configWarnings(config)) logger.warn(warning);
}
