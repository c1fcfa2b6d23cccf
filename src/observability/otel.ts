import {
  defaultTextMapGetter,
  diag,
  DiagLogLevel,
  isSpanContextValid,
  ROOT_CONTEXT,
  SpanKind,
  SpanStatusCode,
  trace,
  TraceFlags,
  type Context,
  type Span,
  type SpanContext,
} from '@opentelemetry/api';
import {
  ExportResultCode,
  loggingErrorHandler,
  parseTraceParent,
  setGlobalErrorHandler,
  TraceState,
  W3CTraceContextPropagator,
  type ExportResult,
} from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { defaultResource, resourceFromAttributes } from '@opentelemetry/resources';
import {
  BasicTracerProvider,
  BatchSpanProcessor,
  ParentBasedSampler,
  TraceIdRatioBasedSampler,
  type IdGenerator,
  type ReadableSpan,
  type SpanExporter,
  type SpanProcessor,
} from '@opentelemetry/sdk-trace-base';
import { ATTR_ERROR_TYPE, ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from '@opentelemetry/semantic-conventions';
import type { Agent, IncomingHttpHeaders } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Logger } from 'pino';
import type { TracingConfig } from '../config/schema.js';
import { VERSION } from '../version.js';
import { countDroppedSpans } from './metrics.js';
import { newSpanId, newTraceId, ratioSampler, unsampledTraceparent } from './trace-ids.js';
import type { RunningTracing, SpanAttributes, Tracing } from './tracing.js';

/**
 * The longest attribute value a span keeps: a path is the client's to choose (12 KB ones were
 * exported whole, found by an outside attack), and maxQueueSize spans of them sit in memory.
 */
const ATTRIBUTE_VALUE_LIMIT = 1024;
/** How long one export may take before it counts as failed (below the batch processor's own 30 s). */
const EXPORT_TIMEOUT_MS = 10_000;
/**
 * Past EXPORT_TIMEOUT_MS and this, an export still running is cut (its connection destroyed) and
 * counted failed. The exporter's own timeout is a socket idle timeout: a collector that trickles
 * its answer a byte at a time resets it forever (found by an outside attack), and its spans would
 * stay counted against maxQueueSize, so every later span was dropped.
 */
const EXPORT_DEADLINE_GRACE_MS = 1_000;
/** At most one log line about failing exports this often; the lines in between are counted in the next. */
const EXPORT_PROBLEM_LOG_MS = 60_000;

/** The OTLP/HTTP traces URL for a configured base (`OTEL_EXPORTER_OTLP_ENDPOINT`'s rule: `/v1/traces` appended). */
export function tracesUrl(endpoint: string): string {
  const url = new URL(endpoint);
  if (!url.pathname.endsWith('/v1/traces')) url.pathname = `${url.pathname.replace(/\/+$/, '')}/v1/traces`;
  return url.toString();
}

/**
 * One warning line per EXPORT_PROBLEM_LOG_MS at most, however often the collector fails: a
 * collector that is down must not turn into a log line per batch (or per span).
 */
class ExportProblems {
  private lastAt = -Infinity;
  private unreported = 0;
  constructor(private readonly logger: Logger) {}

  report(problem: string): void {
    const now = performance.now();
    if (now - this.lastAt < EXPORT_PROBLEM_LOG_MS) {
      this.unreported++;
      return;
    }
    this.logger.warn(
      { problem: problem.slice(0, 500), alsoFailedSinceLastLine: this.unreported },
      'trace export failed: spans are dropped (gatehouse_trace_spans_dropped_total); requests are not affected',
    );
    this.lastAt = now;
    this.unreported = 0;
  }
}

/**
 * The bound on spans held for export: finished spans waiting in the batch processor and those in
 * an export still running, together at most `maxQueueSize`; past it a span is dropped and counted.
 * (The batch processor bounds only its waiting queue, and reports its drops through an
 * experimental self-observability meter: counting here, around it, uses only stable interfaces.)
 */
class BoundedSpanProcessor implements SpanProcessor {
  private held = 0;
  constructor(
    private readonly inner: SpanProcessor,
    private readonly maxQueueSize: number,
  ) {}

  onStart(): void {}

  onEnd(span: ReadableSpan): void {
    if ((span.spanContext().traceFlags & TraceFlags.SAMPLED) === 0) return;
    if (this.held >= this.maxQueueSize) {
      countDroppedSpans('queue_full', 1);
      return;
    }
    this.held++;
    this.inner.onEnd(span);
  }

  /** An export finished (either way): its spans are no longer held. */
  released(spans: number): void {
    this.held = Math.max(0, this.held - spans);
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush();
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }
}

/**
 * The exporter's HTTP connections: an agent of ours (through the exporter's agent factory), so an
 * export that overruns its deadline, and at stop every connection, can be destroyed. A collector
 * that hangs or trickles must not keep a stopped process alive.
 */
class ExportConnections {
  private agent: Agent | undefined;
  private stopped = false;

  readonly factory = async (protocol: string): Promise<Agent> => {
    const { Agent } = protocol === 'https:' ? await import('node:https') : await import('node:http');
    const agent = new Agent({ keepAlive: true });
    const connect = agent.createConnection.bind(agent) as Connect;
    // Once stopped, no new connection: the exporter retries a cut export (1 s backoff, within its
    // 10 s), and each retry's hanging request would keep the process alive. An error without a
    // network code is not retried.
    (agent as unknown as { createConnection: Connect }).createConnection = (options, callback) => {
      if (!this.stopped) return connect(options, callback);
      callback(new Error('tracing stopped: no new export connection'));
      return undefined;
    };
    this.agent = agent;
    return agent;
  };

  /** Destroys the connections an export is using (exports run one at a time). */
  cutInUse(): void {
    for (const sockets of Object.values(this.agent?.sockets ?? {}))
      for (const socket of sockets ?? []) socket.destroy();
  }

  /** At stop: every connection destroyed, and no new one made. */
  destroyAll(): void {
    this.stopped = true;
    this.agent?.destroy();
  }
}
type Connect = (options: object, callback: (err: Error | null, socket?: Duplex) => void) => Duplex | undefined;

/** The OTLP exporter, with every outcome released from the bound and every failure counted and reported. */
class AccountedExporter implements SpanExporter {
  processor: BoundedSpanProcessor | undefined;
  constructor(
    private readonly inner: SpanExporter,
    private readonly problems: ExportProblems,
    private readonly connections: ExportConnections,
  ) {}

  export(spans: ReadableSpan[], done: (result: ExportResult) => void): void {
    let settled = false;
    const settle = (result: ExportResult) => {
      if (settled) return;
      settled = true;
      clearTimeout(deadline);
      this.processor?.released(spans.length);
      if (result.code !== ExportResultCode.SUCCESS) {
        countDroppedSpans('export_failed', spans.length);
        this.problems.report(result.error?.message ?? 'export failed');
      }
      done(result);
    };
    const deadline = setTimeout(() => {
      settle({
        code: ExportResultCode.FAILED,
        error: new Error(`export took more than ${EXPORT_TIMEOUT_MS + EXPORT_DEADLINE_GRACE_MS} ms: cut`),
      });
      this.connections.cutInUse();
    }, EXPORT_TIMEOUT_MS + EXPORT_DEADLINE_GRACE_MS);
    deadline.unref();
    this.inner.export(spans, settle);
  }

  shutdown(): Promise<void> {
    return this.inner.shutdown();
  }

  forceFlush(): Promise<void> {
    return this.inner.forceFlush?.() ?? Promise.resolve();
  }
}

/**
 * Ids from ./trace-ids.ts; a root span takes the trace id `Tracing.incoming` already chose (and
 * sampled by), set just before the SDK asks, so the SDK's sampler sees the same id.
 */
class ChosenTraceIdGenerator implements IdGenerator {
  chosen: string | undefined;
  generateTraceId(): string {
    const id = this.chosen ?? newTraceId();
    this.chosen = undefined;
    return id;
  }
  generateSpanId(): string {
    return newSpanId();
  }
}

/** A trusted proxy's `tracestate`, as the SDK's W3C propagator reads it (several headers joined; invalid entries dropped when written). */
function traceStateOf(headers: IncomingHttpHeaders): TraceState | undefined {
  const given = headers.tracestate;
  if (!given) return undefined;
  return new TraceState(Array.isArray(given) ? given.join(',') : given);
}

const KINDS = { client: SpanKind.CLIENT, internal: SpanKind.INTERNAL } as const;

/** Starts the SDK: a tracer provider with no global registration (nothing else in the process is traced) and a bounded batch export over OTLP/HTTP JSON. */
export function startOtel(config: TracingConfig, logger: Logger): RunningTracing {
  const problems = new ExportProblems(logger);
  // The SDK's own complaints (an export error, a dropped batch) go through the same rate limit.
  diag.setLogger(
    {
      error: (message) => problems.report(message),
      warn: (message) => problems.report(message),
      info: () => {},
      debug: () => {},
      verbose: () => {},
    },
    DiagLogLevel.WARN,
  );
  setGlobalErrorHandler((err) => problems.report(err instanceof Error ? err.message : String(err)));

  const connections = new ExportConnections();
  const exporter = new AccountedExporter(
    new OTLPTraceExporter({
      url: tracesUrl(config.endpoint),
      headers: config.headers,
      timeoutMillis: EXPORT_TIMEOUT_MS,
      httpAgentOptions: connections.factory,
    }),
    problems,
    connections,
  );
  const batch = new BatchSpanProcessor(exporter, {
    maxQueueSize: config.maxQueueSize,
    // OTEL_BSP_MAX_EXPORT_BATCH_SIZE still tunes it, as docs/observability.md says (a value given here hid it).
    maxExportBatchSize: Math.min(Number(process.env.OTEL_BSP_MAX_EXPORT_BATCH_SIZE) || 512, config.maxQueueSize),
    exportTimeoutMillis: EXPORT_TIMEOUT_MS * 2,
  });
  const processor = new BoundedSpanProcessor(batch, config.maxQueueSize);
  exporter.processor = processor;
  const ids = new ChosenTraceIdGenerator();
  const provider = new BasicTracerProvider({
    resource: defaultResource().merge(
      resourceFromAttributes({ [ATTR_SERVICE_NAME]: config.serviceName, [ATTR_SERVICE_VERSION]: VERSION }),
    ),
    idGenerator: ids,
    sampler: new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(config.sampleRatio) }),
    spanLimits: { attributeValueLengthLimit: ATTRIBUTE_VALUE_LIMIT },
    spanProcessors: [processor],
  });
  const tracer = provider.getTracer('gatehouse', VERSION);
  const propagator = new W3CTraceContextPropagator();
  const sampledRoot = ratioSampler(config.sampleRatio);
  countDroppedSpans('queue_full', 0);
  countDroppedSpans('export_failed', 0);

  const childOf = (parent: Context, name: string, kind: 'client' | 'internal', attributes?: SpanAttributes) =>
    tracer.startSpan(name, { kind: KINDS[kind], attributes }, parent);

  const tracing: Tracing = {
    incoming(headers, trusted) {
      // As the SDK's W3C propagator reads it (Node joins a repeated traceparent with ", ": that does not parse, a new trace).
      const given = trusted ? headers.traceparent : undefined;
      const parent = given === undefined ? null : parseTraceParent(Array.isArray(given) ? given[0]! : given);
      if (parent !== null) {
        return {
          traceId: parent.traceId,
          sampled: (parent.traceFlags & TraceFlags.SAMPLED) !== 0,
          parent: { spanId: parent.spanId, traceFlags: parent.traceFlags },
        };
      }
      const traceId = newTraceId();
      return { traceId, sampled: sampledRoot(traceId) };
    },
    startServerSpan(incoming, name, headers, startTime, attributes) {
      const options = { kind: SpanKind.SERVER, startTime, attributes };
      const { parent } = incoming;
      if (parent !== undefined) {
        const context = trace.setSpanContext(ROOT_CONTEXT, {
          traceId: incoming.traceId,
          spanId: parent.spanId,
          traceFlags: parent.traceFlags,
          isRemote: true,
          traceState: traceStateOf(headers),
        });
        return tracer.startSpan(name, options, context);
      }
      let links: { context: SpanContext }[] | undefined;
      if (headers.traceparent !== undefined) {
        const client = trace.getSpanContext(propagator.extract(ROOT_CONTEXT, headers, defaultTextMapGetter));
        // The client's ids only: its tracestate is its vendors' data, not ours to export.
        if (client && isSpanContextValid(client))
          links = [
            {
              context: {
                traceId: client.traceId,
                spanId: client.spanId,
                traceFlags: client.traceFlags,
                isRemote: true,
              },
            },
          ];
      }
      ids.chosen = incoming.traceId;
      try {
        return tracer.startSpan(name, { ...options, root: true, links }, ROOT_CONTEXT);
      } finally {
        ids.chosen = undefined;
      }
    },
    unsampledHeaders(incoming, headers) {
      const traceparent = unsampledTraceparent(incoming.traceId, newSpanId());
      // Only a continued trace has a tracestate: an untrusted client's belongs to its own trace.
      const tracestate = incoming.parent === undefined ? undefined : traceStateOf(headers)?.serialize();
      return tracestate ? { traceparent, tracestate } : { traceparent };
    },
    startChildSpan(parent, name, kind, attributes, startTime) {
      return tracer.startSpan(name, { kind: KINDS[kind], attributes, startTime }, trace.setSpan(ROOT_CONTEXT, parent));
    },
    startStoredChildSpan(traceparent, name, kind, attributes) {
      const parent =
        traceparent == null ? ROOT_CONTEXT : propagator.extract(ROOT_CONTEXT, { traceparent }, defaultTextMapGetter);
      return childOf(parent, name, kind, attributes);
    },
    headersFor(span: Span) {
      // The W3C propagator's inject, without the context it needs built around the span.
      const { traceId, spanId, traceFlags, traceState } = span.spanContext();
      const traceparent = `00-${traceId}-${spanId}-${(traceFlags & TraceFlags.SAMPLED) !== 0 ? '01' : '00'}`;
      // A tracestate with no valid member serializes to "": W3C says not to send it empty.
      const tracestate = traceState?.serialize();
      return tracestate ? { traceparent, tracestate } : { traceparent };
    },
    end(span, error, endTime) {
      if (error !== undefined) {
        span.setAttribute(ATTR_ERROR_TYPE, error);
        span.setStatus({ code: SpanStatusCode.ERROR });
      }
      // Never the SDK's default end: for a span given its start, that is Date.now(), whole
      // milliseconds, and a fast request's span ended before it began.
      span.end(endTime ?? performance.now());
    },
  };

  return {
    tracing,
    async shutdown(waitMs) {
      let timer: NodeJS.Timeout | undefined;
      const gaveUp = new Promise<void>((resolve) => {
        timer = setTimeout(resolve, waitMs);
        timer.unref();
      });
      try {
        await Promise.race([provider.shutdown().catch((err: unknown) => problems.report(String(err))), gaveUp]);
      } finally {
        clearTimeout(timer);
        // An export still running (a hung or trickling collector) gives up its connection now:
        // the stop waited `waitMs` for it, the process must not wait longer.
        connections.destroyAll();
        // The SDK's handlers are process-wide: a stopped tracing must not keep logging through
        // this instance's logger (a test, or a restart in the same process, starts another).
        diag.disable();
        setGlobalErrorHandler(loggingErrorHandler());
      }
    },
  };
}
