import {
  AggregatorRegistry,
  collectDefaultMetrics,
  Counter,
  Gauge,
  Registry,
  type MetricObjectWithValues,
  type MetricValue,
} from 'prom-client';
import type { RequestLog } from '../http/request-context.js';

/**
 * gatehouse's Prometheus metrics: one registry per process, a short fixed set of instruments
 * named `gatehouse_<thing>_<unit>`, labelled from configuration and bounded enums only (listener,
 * status code, auth method, error code, configured endpoint path, action), never from request
 * data (key id, subject, IP, path): Kong's and Traefik's rule against unbounded cardinality.
 * Nothing is recorded until `enableMetrics()` (an `admin` listener is configured), so a gateway
 * without one pays nothing. With `gateway.workers` each worker records its own and the primary
 * sums them at scrape time (`renderMetrics`). Every series of a metric carries the same label
 * names, a label that does not apply being "" (as Kong's and Traefik's exporters do; Prometheus
 * stores an empty label as no label).
 */
export const registry = new Registry();

let enabled = false;

/** Starts recording in this process (idempotent): the instruments below, and Node's process metrics. */
export function enableMetrics(): void {
  if (enabled) return;
  enabled = true;
  collectDefaultMetrics({ register: registry });
  // Born at 0, so the first rejected reload is an increase (a counter that appears at 1 is not one to rate()).
  for (const outcome of ['ok', 'rejected']) configReloads.labels(outcome).inc(0);
}

/** Whether this process records (what app builders ask before binding per-request hooks). */
export function metricsEnabled(): boolean {
  return enabled;
}

type Labels = Record<string, string>;

/**
 * The per-request instruments. prom-client's own children validate and hash their labels on
 * every call (measured: ~25 % more CPU per /api/ request with them); these keep plain numbers
 * in cells bound once per label set, and hand prom-client the values when scraped (`get()` is
 * the interface its Registry and AggregatorRegistry read).
 */
class RequestCounter {
  readonly aggregator = 'sum';
  private readonly cells: { labels: Labels; value: number }[] = [];
  constructor(
    readonly name: string,
    readonly help: string,
  ) {
    registry.registerMetric(this as never);
  }

  /** A cell for one label set: increment its `value`. Bind once, keep it. */
  cell(labels: Labels): { value: number } {
    const cell = { labels, value: 0 };
    this.cells.push(cell);
    return cell;
  }

  get() {
    return {
      name: this.name,
      help: this.help,
      type: 'counter',
      aggregator: this.aggregator,
      values: this.cells.map(({ labels, value }) => ({ labels, value })),
    };
  }
}

const BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

class LatencyHistogram {
  readonly aggregator = 'sum';
  private readonly series: { labels: Labels; counts: Float64Array; sum: number; count: number }[] = [];
  constructor(
    readonly name: string,
    readonly help: string,
  ) {
    registry.registerMetric(this as never);
  }

  /** One label set's observer: a bucket search over 14 bounds and three additions, nothing allocated. */
  child(labels: Labels): (seconds: number) => void {
    const series = { labels, counts: new Float64Array(BUCKETS.length), sum: 0, count: 0 };
    this.series.push(series);
    return function observe(seconds) {
      series.sum += seconds;
      series.count++;
      for (let i = 0; i < BUCKETS.length; i++) {
        if (seconds <= BUCKETS[i]!) {
          series.counts[i]!++;
          return;
        }
      }
    };
  }

  get() {
    const values: { labels: Record<string, string | number>; value: number; metricName: string }[] = [];
    for (const { labels, counts, sum, count } of this.series) {
      let cumulative = 0;
      BUCKETS.forEach((le, i) => {
        cumulative += counts[i]!;
        values.push({ labels: { le, ...labels }, value: cumulative, metricName: `${this.name}_bucket` });
      });
      values.push({ labels: { le: '+Inf', ...labels }, value: count, metricName: `${this.name}_bucket` });
      values.push({ labels, value: sum, metricName: `${this.name}_sum` });
      values.push({ labels, value: count, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: 'histogram', aggregator: this.aggregator, values };
  }
}

/**
 * A gauge read from a store when scraped: a series exists only while it is set. (prom-client's
 * Gauge without labels answers 0 after reset(): a lag read as "none" exactly while the store
 * cannot be read.)
 */
class ScrapeGauge {
  readonly aggregator = 'sum';
  private readonly values = new Map<string, { labels: Labels; value: number }>();
  constructor(
    readonly name: string,
    readonly help: string,
  ) {
    registry.registerMetric(this as never);
  }

  set(labels: Labels, value: number): void {
    this.values.set(JSON.stringify(labels), { labels, value });
  }

  /** Removes every series: what is not set again before the scrape is absent from it. */
  reset(): void {
    this.values.clear();
  }

  get() {
    return {
      name: this.name,
      help: this.help,
      type: 'gauge',
      aggregator: this.aggregator,
      values: [...this.values.values()],
    };
  }
}

const STORE_WIDE = ' Store-wide: aggregate across instances with max, not sum.';

const requests = new RequestCounter(
  'gatehouse_http_requests_total',
  'HTTP requests answered, by listener, route (the configured prefix; "" before one is chosen and on the webhook listener), status code, gatehouse error code ("" when the answer is no gatehouse error) and the credential methods that authenticated them (none when not authenticated).',
);

const requestDuration = new LatencyHistogram(
  'gatehouse_request_duration_seconds',
  'Time from the request headers to the end of the answer, by listener.',
);

const upstreamDuration = new LatencyHistogram(
  'gatehouse_upstream_duration_seconds',
  'Time from sending a request upstream to its response headers (or to the upstream error), by route (the configured prefix).',
);
/** One observer per route prefix, bound at its first request. */
const upstreamObservers = new Map<string, (seconds: number) => void>();

const authFailures = new Counter({
  name: 'gatehouse_auth_failures_total',
  help: 'Requests to /api/ refused by authentication, by credential method and error code.',
  labelNames: ['method', 'reason'] as const,
  registers: [registry],
});

const webhooksReceived = new Counter({
  name: 'gatehouse_webhooks_received_total',
  help: 'Requests to configured webhook endpoints, by endpoint path and outcome (accepted, duplicate, answered, or the error code).',
  labelNames: ['endpoint', 'outcome'] as const,
  registers: [registry],
});

const deliveries = new Counter({
  name: 'gatehouse_deliveries_total',
  help: 'Delivery attempts to action targets, by action and outcome (delivered, retry, dead).',
  labelNames: ['action', 'outcome'] as const,
  registers: [registry],
});

const websocketConnections = new Gauge({
  name: 'gatehouse_websocket_connections',
  help: 'Open WebSocket connections through /api/, by route prefix.',
  labelNames: ['route'] as const,
  registers: [registry],
});

const upstreamRetries = new Counter({
  name: 'gatehouse_upstream_retries_total',
  help: 'Requests sent to the upstream a second time, on a new connection, because the reused keep-alive connection failed before any answer (the upstream closed it idle); by route (the configured prefix).',
  labelNames: ['route'] as const,
  registers: [registry],
});

const websocketOutcomes = new Counter({
  name: 'gatehouse_websocket_connections_total',
  help: 'WebSocket upgrades and their ends, by outcome: accepted, refused_<error code>, not_upgraded (the upstream answered without 101), closed (by either side), revoked, expired, idle, lifetime, drained.',
  labelNames: ['outcome'] as const,
  registers: [registry],
});

const jwksFetches = new Counter({
  name: 'gatehouse_jwks_fetches_total',
  help: 'Fetches of the JWKS (gateway.auth.bearer.jwt.jwksUri), by outcome (ok, http_error, unreachable).',
  labelNames: ['outcome'] as const,
  registers: [registry],
});

const configReloads = new Counter({
  name: 'gatehouse_config_reloads_total',
  help: 'Configuration reloads (SIGHUP or file change), by outcome (ok, rejected).',
  labelNames: ['outcome'] as const,
  registers: [registry],
});

const traceSpansDropped = new Counter({
  name: 'gatehouse_trace_spans_dropped_total',
  help: 'Finished spans that never reached the trace collector, by reason: queue_full (observability.tracing.maxQueueSize spans were already waiting or being exported), export_failed (the collector refused them, did not answer in time, or could not be reached).',
  labelNames: ['reason'] as const,
  registers: [registry],
});

const buildInfo = new Gauge({
  name: 'gatehouse_build_info',
  help: 'Always 1: the gatehouse version, the Node.js version, the storage driver configured and the storage schema version this gatehouse uses.',
  labelNames: ['version', 'node', 'storage_driver', 'schema'] as const,
  registers: [registry],
  aggregator: 'max',
});

/** Sets gatehouse_build_info (the process that answers scrapes, once at start). */
export function recordBuildInfo(labels: {
  version: string;
  node: string;
  storage_driver: string;
  schema: string;
}): void {
  if (!enabled) return;
  buildInfo.reset();
  buildInfo.set(labels, 1);
}

/**
 * Gauges the primary sets at scrape time from the stores (src/admin/listener.ts); workers leave
 * them unset. A gauge whose source cannot be read is left out of the scrape, never shown as 0.
 */
export const scrapeGauges = {
  lockoutsActive: new ScrapeGauge(
    'gatehouse_lockouts_active',
    `Clients locked out now after repeated authentication failures (on PostgreSQL, every instance's as far as this one has heard).${STORE_WIDE}`,
  ),
  queueEvents: new ScrapeGauge(
    'gatehouse_queue_events',
    `Webhook events in the store, by action and status (queued, delivered, dead); absent while the store cannot be read.${STORE_WIDE}`,
  ),
  queueOldestDue: new ScrapeGauge(
    'gatehouse_queue_oldest_due_seconds',
    `How long the longest-waiting due event has been due (0 when none is due; absent while the store cannot be read): delivery lag.${STORE_WIDE}`,
  ),
  channelConnected: new ScrapeGauge(
    'gatehouse_channel_connected',
    `Whether each configured channel is connected (1) or not (0); absent while its state cannot be read.${STORE_WIDE}`,
  ),
  tlsCertificateExpiresIn: new ScrapeGauge(
    'gatehouse_tls_certificate_expires_in_seconds',
    'Seconds until the certificate a TLS listener serves expires (negative once expired; the earliest across gateway workers).',
  ),
  gmailWatchExpiresIn: new ScrapeGauge(
    'gatehouse_gmail_watch_expires_in_seconds',
    `Seconds until the Gmail watch expires (negative once expired; absent before the first watch).${STORE_WIDE}`,
  ),
  gmailLastErrorAt: new ScrapeGauge(
    'gatehouse_gmail_last_error_timestamp_seconds',
    `When the Gmail integration last failed (0: no error since the last success).${STORE_WIDE}`,
  ),
  gmailLastNotificationAt: new ScrapeGauge(
    'gatehouse_gmail_last_notification_timestamp_seconds',
    `When Gmail last notified of new mail (0: never).${STORE_WIDE}`,
  ),
};

type CounterChild = { inc(value?: number): void };

/** One auth value's cells: answers without a gatehouse error by status, refusals by code then status. */
interface AuthCells {
  ok: { value: number }[];
  refused: Map<string, { value: number }[]>;
}

/**
 * Wraps a listener's request log so every answered request is also counted and timed. A counter
 * cell is bound once per (route, auth, code, status) seen and the histogram's once per listener:
 * per request, two string compares (two Map lookups when the pair differs from the last request's;
 * one more for a refusal), an array index and two increments (the /api/ hot path; see `npm run
 * bench`, "metrics"). The route is the context's (`ctx.route`, set when the gateway chose one), the
 * code its `errorCode`. Returns `log` unchanged while metrics are off.
 */
export function countRequests(
  listener: 'gateway' | 'webhooks',
  log: RequestLog,
  webhookEndpoints?: ReadonlySet<string>,
): RequestLog {
  if (!enabled) return log;
  // route → auth (one of a few method lists) → cells: no key is built per request.
  const byRoute = new Map<string, Map<string, AuthCells>>();
  const observeDuration = requestDuration.child({ listener });
  // Born at 0, so the first 503 of a store outage is an increase.
  for (const endpoint of webhookEndpoints ?? []) webhooksReceived.labels(endpoint, 'store_unavailable').inc(0);
  // The last (route, auth) pair's cells: traffic mostly repeats it, and comparing two short strings
  // is cheaper than two Map lookups (measured: the step costs what it did before the route label).
  let lastRoute: string | undefined;
  let lastAuth: string | undefined;
  let lastCells: AuthCells | undefined;
  return function countAndLog(fields, ctx) {
    log(fields);
    const status = fields.status as number;
    const auth = (fields.auth as string | undefined) ?? 'none';
    const route = ctx?.route ?? '';
    const code = fields.error as string | undefined;
    let cells: AuthCells | undefined;
    if (route === lastRoute && auth === lastAuth) cells = lastCells!;
    else {
      let byAuth = byRoute.get(route);
      if (byAuth === undefined) {
        byAuth = new Map();
        byRoute.set(route, byAuth);
      }
      cells = byAuth.get(auth);
      if (cells === undefined) {
        cells = { ok: [], refused: new Map() };
        byAuth.set(auth, cells);
      }
      lastRoute = route;
      lastAuth = auth;
      lastCells = cells;
    }
    let byStatus: { value: number }[] | undefined = cells.ok;
    if (code !== undefined) {
      byStatus = cells.refused.get(code);
      if (byStatus === undefined) {
        byStatus = [];
        cells.refused.set(code, byStatus);
      }
    }
    let cell = byStatus[status];
    if (cell === undefined) {
      cell = requests.cell({ listener, route, status: String(status), code: code ?? '', auth });
      byStatus[status] = cell;
    }
    cell.value++;
    observeDuration((fields.ms as number) / 1000);
    if (webhookEndpoints?.has(fields.path as string)) {
      webhooksReceived
        .labels(fields.path as string, (fields.outcome as string | undefined) ?? code ?? `status_${status}`)
        .inc();
    }
  };
}

/** The credential method an /api/ refusal is about, from its catalogue code. */
const AUTH_FAILURE_METHOD: Readonly<Record<string, string>> = {
  invalid_api_key: 'api-key',
  invalid_token: 'bearer',
  invalid_client_certificate: 'client-certificate',
  auth_unavailable: 'bearer',
  missing_credentials: 'none',
  too_many_failures: 'lockout',
};

const authFailureChildren = new Map<string, CounterChild>();

/** Counts an /api/ request refused by authentication (or by the lockout in front of it). */
export function countAuthFailure(code: string): void {
  if (!enabled) return;
  let child = authFailureChildren.get(code);
  if (child === undefined) {
    child = authFailures.labels(AUTH_FAILURE_METHOD[code] ?? 'other', code);
    authFailureChildren.set(code, child);
  }
  child.inc();
}

/** Time to the upstream's answer on `route` (its prefix), from the moment the request was handed to the proxy (ms, performance.now()). */
export function observeUpstream(route: string, startedAt: number): void {
  if (!enabled) return;
  let observe = upstreamObservers.get(route);
  if (observe === undefined) {
    observe = upstreamDuration.child({ route });
    upstreamObservers.set(route, observe);
  }
  observe((performance.now() - startedAt) / 1000);
}

/** A request on `route` sent again on a new connection (src/gateway/proxy.ts, mayResend). */
export function countUpstreamRetry(route: string): void {
  if (enabled) upstreamRetries.labels(route).inc();
}

/** One delivery attempt settled: `delivered`, `retry` (queued again) or `dead`. */
export function countDelivery(action: string, outcome: 'delivered' | 'queued' | 'dead'): void {
  if (enabled) deliveries.labels(action, outcome === 'queued' ? 'retry' : outcome).inc();
}

/** A WebSocket upgrade refused, accepted, not upgraded by the upstream, or an open one ended (and why). */
export function countWebSocket(outcome: string): void {
  if (enabled) websocketOutcomes.labels(outcome).inc();
}

/** One more (1) or one fewer (-1) open WebSocket on `route`. */
export function trackWebSocket(route: string, change: 1 | -1): void {
  if (enabled) websocketConnections.labels(route).inc(change);
}

export function countJwksFetch(outcome: 'ok' | 'http_error' | 'unreachable'): void {
  if (enabled) jwksFetches.labels(outcome).inc();
}

export function countConfigReload(outcome: 'ok' | 'rejected'): void {
  if (enabled) configReloads.labels(outcome).inc();
}

/** Spans tracing let go of without exporting them (src/observability/otel.ts). */
export function countDroppedSpans(reason: 'queue_full' | 'export_failed', spans: number): void {
  if (enabled) traceSpansDropped.labels(reason).inc(spans);
}

/** One process's metrics as prom-client's JSON. */
export type MetricsSnapshot = MetricObjectWithValues<MetricValue<string>>[];

/** This process's metrics as prom-client's JSON: what a worker sends the primary for a scrape. */
export async function metricsSnapshot(): Promise<MetricsSnapshot> {
  return registry.getMetricsAsJSON();
}

/**
 * The Prometheus text for one scrape: this process's metrics, summed with the snapshots other
 * processes (gateway workers) sent, metric by metric and label set by label set (prom-client's
 * aggregator: counters and histograms add up; process metrics keep their own aggregation).
 */
export async function renderMetrics(others: MetricsSnapshot[]): Promise<string> {
  if (others.length === 0) return registry.metrics();
  return AggregatorRegistry.aggregate([await registry.getMetricsAsJSON(), ...others]).metrics();
}

export const METRICS_CONTENT_TYPE = registry.contentType;
