import type { IncomingHttpHeaders } from 'node:http';
import type { Span } from '@opentelemetry/api';
import type { Logger } from 'pino';
import type { TracingConfig } from '../config/schema.js';

/**
 * OpenTelemetry tracing, as the request paths see it. Nothing here loads the OpenTelemetry SDK:
 * `startTracing` imports it (./otel.ts) only when `observability.tracing` is configured, and an
 * app asks `activeTracing()` once, when it is built, so with tracing off no request makes any
 * tracing call (as `metricsEnabled()` does for metrics). Spans are made explicitly, never by
 * auto-instrumentation (its require hooks and context manager cost CPU on every request), and
 * their parents are passed by hand: no AsyncLocalStorage.
 */
export interface Tracing {
  /**
   * The trace a request that just came in belongs to, and whether it is sampled, decided once
   * without making a span. `trusted`: the request came through a trusted proxy (gateway.trustProxy),
   * so a valid W3C `traceparent` is continued and its sampled flag followed (ParentBased);
   * otherwise a new trace, sampled by its id (TraceIdRatioBased: the same id, the same decision).
   */
  incoming(headers: IncomingHttpHeaders, trusted: boolean): IncomingTrace;
  /**
   * The SERVER span of a sampled request (started at `startTime`: see `SpanTime`), in the trace
   * `incoming` chose; an untrusted client's own context, if any, is only a link (a client must
   * not choose the trace, or the sampling, of our spans).
   */
  startServerSpan(
    incoming: IncomingTrace,
    name: string,
    headers: IncomingHttpHeaders,
    startTime: SpanTime,
    attributes: SpanAttributes,
  ): Span;
  /**
   * The W3C headers for the next hop of an unsampled request: a new span id in its trace, flagged
   * 00 (not sampled), and a trusted proxy's `tracestate` passed on; no span is made.
   */
  unsampledHeaders(incoming: IncomingTrace, headers: IncomingHttpHeaders): { traceparent: string; tracestate?: string };
  /** A child of `parent` (a CLIENT span for a call that leaves gatehouse, else INTERNAL). */
  startChildSpan(
    parent: Span,
    name: string,
    kind: 'client' | 'internal',
    attributes?: SpanAttributes,
    startTime?: SpanTime,
  ): Span;
  /**
   * A span whose parent is a stored `traceparent` (a webhook event's receive span, perhaps hours
   * ago and on another instance); a new trace when none was stored or it does not parse.
   */
  startStoredChildSpan(
    traceparent: string | null | undefined,
    name: string,
    kind: 'client' | 'internal',
    attributes?: SpanAttributes,
  ): Span;
  /** The W3C headers (`traceparent`, and `tracestate` when there is one) that make a receiver's span a child of `span`. */
  headersFor(span: Span): { traceparent: string; tracestate?: string };
  /** Ends `span`; with `error` (a catalogue code or a reason), its status is ERROR and `error.type` says why. */
  end(span: Span, error?: string, endTime?: SpanTime): void;
}

/** A request's trace before any span: see `Tracing.incoming`. */
export interface IncomingTrace {
  readonly traceId: string;
  readonly sampled: boolean;
  /** The trusted proxy's span (the request's parent) and its trace flags; undefined: a new trace. */
  readonly parent?: { readonly spanId: string; readonly traceFlags: number };
}

/**
 * A span's start or end: a `performance.now()`, or epoch milliseconds (fractional). The SDK anchors
 * each span's performance clock to `Date.now()` (whole milliseconds) when the span starts, so spans
 * that must order exactly (a request's server span and its children) are given epoch times from
 * one anchor: `Date.now() - performance.now()` taken once per request, plus `performance.now()`.
 */
export type SpanTime = number;

export type SpanAttributes = Record<string, string | number | boolean | undefined>;

/** What ./otel.ts gives back once started. */
export interface RunningTracing {
  tracing: Tracing;
  /** Exports what is queued, waiting at most `waitMs`, then stops exporting. */
  shutdown(waitMs: number): Promise<void>;
}

let running: RunningTracing | undefined;

/** The tracing in force in this process, or undefined (off): ask once, when an app is built. */
export function activeTracing(): Tracing | undefined {
  return running?.tracing;
}

/**
 * Starts tracing in this process when configured (idempotent: a gateway worker and its primary
 * each start their own exporter). Must come before the apps are built.
 */
export async function startTracing(config: TracingConfig | undefined, logger: Logger): Promise<void> {
  if (config === undefined || running !== undefined) return;
  const { startOtel } = await import('./otel.js');
  running = startOtel(config, logger);
}

/** Flushes and stops tracing (a no-op when off): queued spans get at most `waitMs` to be exported. */
export async function stopTracing(waitMs = SHUTDOWN_FLUSH_MS): Promise<void> {
  const stopping = running;
  running = undefined;
  await stopping?.shutdown(waitMs);
}

/** How long a shutdown waits for the last spans to be exported: a collector that is down does not hold a stop. */
export const SHUTDOWN_FLUSH_MS = 2_000;
