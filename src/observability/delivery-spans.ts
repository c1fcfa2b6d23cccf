import type { Span } from '@opentelemetry/api';
import type { Tracing } from './tracing.js';

/** What a delivery attempt is, for its span. */
export interface AttemptDescription {
  /** The receive span's traceparent, as stored with the event (none: the attempt starts a trace). */
  traceContext: string | null | undefined;
  eventId: string;
  action: string;
  /** The attempt's number, 1 for the first. */
  attempt: number;
  target: URL;
}

/** How an attempt ended, for its span. */
export interface AttemptEnd {
  /** The target's status; null when no answer came. */
  status: number | null;
  error: string | null;
  outcome: 'delivered' | 'queued' | 'dead';
}

export interface DeliveryTracing {
  /** The attempt's CLIENT span: a child of the span the event was received in, wherever and whenever it runs. */
  start(attempt: AttemptDescription): Span;
  /** The headers that make the target's span a child of the attempt's. */
  headersFor(span: Span): { traceparent: string; tracestate?: string };
  end(span: Span, end: AttemptEnd): void;
}

/** The spans of delivery attempts (src/webhooks/delivery/deliverer.ts); undefined while tracing is off. */
export function traceDeliveries(tracing: Tracing | undefined): DeliveryTracing | undefined {
  if (tracing === undefined) return undefined;
  return {
    start({ traceContext, eventId, action, attempt, target }) {
      return tracing.startStoredChildSpan(traceContext, `deliver ${action}`, 'client', {
        'http.request.method': 'POST',
        'server.address': target.hostname,
        'server.port': Number(target.port) || (target.protocol === 'https:' ? 443 : 80),
        // The origin only: a target's URL may carry its credential in the query or in the path
        // (Slack, Discord and Teams incoming webhooks do), and spans leave for a collector.
        'url.full': `${target.origin}/`,
        'gatehouse.event.id': eventId,
        'gatehouse.action': action,
        'gatehouse.delivery.attempt': attempt,
      });
    },
    headersFor: (span) => tracing.headersFor(span),
    end(span, { status, error, outcome }) {
      if (status !== null) span.setAttribute('http.response.status_code', status);
      span.setAttribute('gatehouse.delivery.outcome', outcome);
      // A short fixed reason: the status, or the error's code (ECONNREFUSED…), never its text.
      const failure =
        outcome === 'delivered'
          ? undefined
          : status !== null
            ? String(status)
            : (/^[A-Z][A-Z_]+(?=:)/.exec(error ?? '')?.[0] ?? 'no_answer');
      tracing.end(span, failure);
    },
  };
}
