import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Span } from '@opentelemetry/api';
import type { ClientOrigin } from '../http/client-ip.js';
import type { IncomingTrace, SpanAttributes, Tracing } from './tracing.js';

/**
 * The spans of one request on a listener, and what they are named and carry. Built only while
 * tracing is on (the apps hold `undefined` otherwise and skip every call). Attribute names follow
 * OpenTelemetry's HTTP semantic conventions; gatehouse's own are `gatehouse.*`. Never recorded:
 * a credential, a key id, the query string (clients put credentials there), a header value.
 */

/** The trace of one /api/ request: the server span, and its children while they are open. */
interface ApiTrace {
  incoming: IncomingTrace;
  /** Undefined: the trace is not sampled, so no span is made (only the upstream's traceparent). */
  server?: Span;
  /** The client came through a trusted proxy: its trace context, baggage included, is continued. */
  trusted: boolean;
  auth?: Span;
  upstream?: Span;
  /** `Date.now() - performance.now()` at the request's start: every span of it is timed from this one anchor (SpanTime). */
  clock: number;
}

/** What an upstream span says of its target (a route's upstream.target), worked out once per target. */
interface UpstreamAttributes {
  address: string;
  port: number;
  /** The origin and path prefix, no trailing slash: the request's path is appended. */
  base: string;
}

function upstreamAttributesOf(target: string): UpstreamAttributes {
  const url = new URL(target);
  return {
    address: url.hostname,
    port: Number(url.port) || (url.protocol === 'https:' ? 443 : 80),
    base: `${url.origin}${url.pathname.replace(/\/+$/, '')}`,
  };
}

/** Upstream failures gatehouse answers for itself: the upstream span failed with them. */
const UPSTREAM_FAILURES = new Set(['upstream_timeout', 'upstream_unreachable']);

/** The status a request ended with, as the request log has it (499: the client left first). */
function finalStatus(res: ServerResponse, req: IncomingMessage): number {
  return res.writableFinished ? res.statusCode : (req.gatehouse?.rawStatus ?? 499);
}

function pathOf(url: string | undefined): string {
  const path = url ?? '';
  const queryAt = path.indexOf('?');
  return queryAt === -1 ? path : path.slice(0, queryAt);
}

export interface ApiRequestTracing {
  /** Starts the request's server span (it ends, with any child still open, when the answer does). */
  begin(req: IncomingMessage, res: ServerResponse, origin: ClientOrigin, encrypted: boolean): void;
  /** Starts the authentication child span (the lockout check and the credentials). */
  beginAuthentication(req: IncomingMessage): undefined;
  /** Ends it: `refused` is the catalogue code of a refusal. */
  endAuthentication(req: IncomingMessage, refused?: string): void;
  /**
   * Starts the upstream child span and sets the request's `traceparent` (and `tracestate`) to it,
   * replacing what the client sent: the upstream sees gatehouse's span as its parent.
   */
  beginUpstream(req: IncomingMessage, target: string): void;
}

/** The spans of /api/ requests (src/gateway/app.ts). */
export function traceApiRequests(tracing: Tracing): ApiRequestTracing {
  const traceOf = (req: IncomingMessage) => req.gatehouse!.trace as ApiTrace | undefined;
  // Per route target (a handful, fixed by the config): parsed at its first sampled request.
  const upstreams = new Map<string, UpstreamAttributes>();

  function finish(req: IncomingMessage, res: ServerResponse, spans: ApiTrace, server: Span): void {
    const ctx = req.gatehouse!;
    const status = finalStatus(res, req);
    const code = ctx.errorCode;
    const endTime = spans.clock + performance.now();
    if (spans.auth) tracing.end(spans.auth, code ?? 'unfinished', endTime);
    if (spans.upstream) {
      if (code !== undefined && UPSTREAM_FAILURES.has(code)) tracing.end(spans.upstream, code, endTime);
      else {
        spans.upstream.setAttribute('http.response.status_code', status);
        tracing.end(spans.upstream, status >= 500 ? String(status) : undefined, endTime);
      }
    }
    const attributes: SpanAttributes = { 'http.response.status_code': status };
    if (ctx.route !== undefined) {
      server.updateName(`${req.method!} ${ctx.route}`);
      attributes['http.route'] = ctx.route;
    }
    const identity = ctx.identity;
    if (identity) {
      attributes['gatehouse.auth'] = identity.methods.join(',');
      if (identity.subject !== undefined) attributes['enduser.id'] = identity.subject;
    }
    if (code !== undefined) attributes['gatehouse.error.code'] = code;
    server.setAttributes(attributes);
    // OpenTelemetry's HTTP conventions: a server span fails on 5xx only (a 4xx is the client's).
    tracing.end(server, status >= 500 ? (code ?? String(status)) : undefined, endTime);
  }

  return {
    begin(req, res, origin, encrypted) {
      const trusted = origin.viaTrustedProxy;
      const incoming = tracing.incoming(req.headers, trusted);
      // Unsampled: no span, no attributes, nothing to end; beginUpstream writes the traceparent.
      const ctx = req.gatehouse!;
      if (!incoming.sampled) return void (ctx.trace = { incoming, trusted, clock: 0 } satisfies ApiTrace);
      const clock = Date.now() - performance.now();
      const server = tracing.startServerSpan(incoming, req.method!, req.headers, clock + ctx.startedAt, {
        'http.request.method': req.method,
        'url.path': pathOf(req.url),
        'url.scheme': encrypted ? 'https' : 'http',
        'client.address': origin.ip,
        'gatehouse.request.id': ctx.id,
      });
      const spans: ApiTrace = { incoming, server, trusted, clock };
      ctx.trace = spans;
      res.once('close', () => finish(req, res, spans, server));
    },
    beginAuthentication(req) {
      const spans = traceOf(req);
      if (spans?.server === undefined) return undefined;
      spans.auth = tracing.startChildSpan(
        spans.server,
        'authenticate',
        'internal',
        undefined,
        spans.clock + performance.now(),
      );
      return undefined;
    },
    endAuthentication(req, refused) {
      const spans = traceOf(req);
      if (spans?.auth === undefined) return;
      const identity = req.gatehouse?.identity;
      if (identity) spans.auth.setAttribute('gatehouse.auth', identity.methods.join(','));
      if (refused !== undefined) spans.auth.setAttribute('gatehouse.error.code', refused);
      tracing.end(spans.auth, refused, spans.clock + performance.now());
      spans.auth = undefined;
    },
    beginUpstream(req, target) {
      const spans = traceOf(req);
      if (spans === undefined) return;
      let headers: { traceparent: string; tracestate?: string };
      if (spans.server === undefined) {
        // An unsampled trace still sends its traceparent (flag 00): the upstream follows the decision.
        headers = tracing.unsampledHeaders(spans.incoming, req.headers);
      } else {
        let upstream = upstreams.get(target);
        if (upstream === undefined) upstreams.set(target, (upstream = upstreamAttributesOf(target)));
        spans.upstream = tracing.startChildSpan(
          spans.server,
          req.method!,
          'client',
          {
            'http.request.method': req.method,
            'server.address': upstream.address,
            'server.port': upstream.port,
            'url.full': `${upstream.base}${pathOf(req.url)}`,
          },
          spans.clock + performance.now(),
        );
        headers = tracing.headersFor(spans.upstream);
      }
      req.headers.traceparent = headers.traceparent;
      if (headers.tracestate === undefined) delete req.headers.tracestate;
      else req.headers.tracestate = headers.tracestate;
      // W3C Baggage travels with the trace context: an untrusted client's is not passed on as if the trace carried it.
      if (!spans.trusted) delete req.headers.baggage;
    },
  };
}

/** The receive span of one webhook request (src/webhooks/receiver.ts): `traceparent` is what the event stores. */
export interface WebhookRequestTracing {
  begin(req: IncomingMessage, res: ServerResponse, endpoint: string, origin: ClientOrigin): void;
  /** The traceparent a stored event keeps: its deliveries are children of the receive span. */
  traceparentOf(req: IncomingMessage): string | undefined;
}

/** The receive spans of webhook requests (configured endpoints, Gmail push and channel routes). */
export function traceWebhookRequests(tracing: Tracing): WebhookRequestTracing {
  // The receive span, or for an unsampled request the traceparent (flags 00) its deliveries follow.
  const traces = new WeakMap<IncomingMessage, Span | string>();
  return {
    begin(req, res, endpoint, origin) {
      const ctx = req.gatehouse!;
      const incoming = tracing.incoming(req.headers, origin.viaTrustedProxy);
      if (!incoming.sampled) return void traces.set(req, tracing.unsampledHeaders(incoming, req.headers).traceparent);
      const span = tracing.startServerSpan(incoming, `${req.method!} ${endpoint}`, req.headers, ctx.startedAt, {
        'http.request.method': req.method,
        'http.route': endpoint,
        'url.path': endpoint,
        'client.address': origin.ip,
        'gatehouse.request.id': ctx.id,
      });
      traces.set(req, span);
      res.once('close', () => {
        const status = finalStatus(res, req);
        span.setAttribute('http.response.status_code', status);
        if (ctx.outcome !== undefined) span.setAttribute('gatehouse.webhook.outcome', ctx.outcome);
        if (ctx.errorCode !== undefined) span.setAttribute('gatehouse.error.code', ctx.errorCode);
        const eventId = res.getHeader('x-gatehouse-event-id');
        if (typeof eventId === 'string') span.setAttribute('gatehouse.event.id', eventId);
        tracing.end(span, status >= 500 ? (ctx.errorCode ?? String(status)) : undefined);
      });
    },
    traceparentOf(req) {
      const trace = traces.get(req);
      return trace === undefined || typeof trace === 'string' ? trace : tracing.headersFor(trace).traceparent;
    },
  };
}
