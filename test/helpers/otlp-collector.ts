import http from 'node:http';
import type { AddressInfo } from 'node:net';

/**
 * A fake OpenTelemetry collector: an OTLP/HTTP receiver on port 0 that decodes what the official
 * exporter sends with the JSON encoding (`@opentelemetry/exporter-trace-otlp-http`). It follows
 * the OTLP specification's "OTLP/HTTP" section (POST <base>/v1/traces, `Content-Type:
 * application/json`, an ExportTraceServiceRequest as protobuf JSON: trace and span ids as hex
 * strings, enums as numbers) and opentelemetry-proto's trace.proto for the message shapes. It
 * answers 200 with an empty ExportTraceServiceResponse, or (`hang`) reads the body and never
 * answers, as a collector stuck behind a full pipeline does, or (`trickle`) never finishes its answer; it refuses anything but that path
 * and JSON (415), as a real collector does.
 */

/** SpanKind in trace.proto. */
export const SPAN_KIND = { internal: 1, server: 2, client: 3, producer: 4, consumer: 5 } as const;
/** Status.StatusCode in trace.proto. */
export const STATUS_ERROR = 2;

export interface CollectedSpan {
  traceId: string;
  spanId: string;
  /** '' for a root span (trace.proto: empty parent_span_id). */
  parentSpanId: string;
  name: string;
  kind: number;
  attributes: Record<string, string | number | boolean>;
  /** A link's traceState: '' when it has none (trace.proto: an empty string). */
  links: { traceId: string; spanId: string; traceState: string }[];
  status: { code?: number };
  /** Nanoseconds since the epoch, as the JSON encoding carries them (a decimal string: they exceed 2^53). */
  startTimeUnixNano: string;
  endTimeUnixNano: string;
  /** The resource's attributes (service.name…). */
  resource: Record<string, string | number | boolean>;
}

export interface FakeCollector {
  url: string;
  port: number;
  spans: CollectedSpan[];
  /** Export requests received (answered or not). */
  requests: number;
  /** While true, requests are read and never answered. */
  hang: boolean;
  /**
   * While true, requests are answered 200 with a body that never ends: one byte every second, so
   * the connection is never idle (a collector behind a proxy that trickles, or a hostile one).
   */
  trickle: boolean;
  close(): Promise<void>;
}

interface AnyValue {
  stringValue?: string;
  boolValue?: boolean;
  intValue?: number | string;
  doubleValue?: number;
}
type KeyValue = { key: string; value: AnyValue };

function flatten(attributes: KeyValue[] | undefined): Record<string, string | number | boolean> {
  const out: Record<string, string | number | boolean> = {};
  for (const { key, value } of attributes ?? []) {
    if (value.stringValue !== undefined) out[key] = value.stringValue;
    else if (value.boolValue !== undefined) out[key] = value.boolValue;
    else if (value.intValue !== undefined)
      out[key] = Number(value.intValue); // int64: a string in proto JSON
    else if (value.doubleValue !== undefined) out[key] = value.doubleValue;
  }
  return out;
}

/** Decodes one ExportTraceServiceRequest (JSON) into flat spans. */
export function decodeTraces(body: string): CollectedSpan[] {
  const request = JSON.parse(body) as {
    resourceSpans?: {
      resource?: { attributes?: KeyValue[] };
      scopeSpans?: {
        spans?: {
          traceId: string;
          spanId: string;
          parentSpanId?: string;
          name: string;
          kind: number;
          attributes?: KeyValue[];
          links?: { traceId: string; spanId: string; traceState?: string }[];
          status?: { code?: number };
          startTimeUnixNano: string | number;
          endTimeUnixNano: string | number;
        }[];
      }[];
    }[];
  };
  const spans: CollectedSpan[] = [];
  for (const resourceSpans of request.resourceSpans ?? []) {
    const resource = flatten(resourceSpans.resource?.attributes);
    for (const scope of resourceSpans.scopeSpans ?? [])
      for (const span of scope.spans ?? [])
        spans.push({
          traceId: span.traceId,
          spanId: span.spanId,
          parentSpanId: span.parentSpanId ?? '',
          name: span.name,
          kind: span.kind,
          attributes: flatten(span.attributes),
          links: (span.links ?? []).map((l) => ({
            traceId: l.traceId,
            spanId: l.spanId,
            traceState: l.traceState ?? '',
          })),
          status: span.status ?? {},
          startTimeUnixNano: String(span.startTimeUnixNano),
          endTimeUnixNano: String(span.endTimeUnixNano),
          resource,
        });
  }
  return spans;
}

export async function startFakeCollector(options: { hang?: boolean } = {}): Promise<FakeCollector> {
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      collector.requests++;
      if (req.method !== 'POST' || req.url !== '/v1/traces') {
        res.writeHead(404).end();
        return;
      }
      if (!/^application\/json\b/.test(req.headers['content-type'] ?? '')) {
        res.writeHead(415).end();
        return;
      }
      if (collector.hang) return; // read, never answered
      if (collector.trickle) {
        res.writeHead(200, { 'content-type': 'application/json' });
        const drip = setInterval(() => res.write(' '), 1000);
        res.on('close', () => clearInterval(drip));
        return;
      }
      collector.spans.push(...decodeTraces(Buffer.concat(chunks).toString('utf8')));
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{}');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  const collector: FakeCollector = {
    url: `http://127.0.0.1:${port}`,
    port,
    spans: [],
    requests: 0,
    hang: options.hang ?? false,
    trickle: false,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
  return collector;
}

/** A W3C traceparent's parts (version 00). */
export function parseTraceparent(value: string | undefined): { traceId: string; parentId: string; flags: string } {
  const match = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/.exec(value ?? '');
  if (!match) throw new Error(`not a traceparent: ${value}`);
  return { traceId: match[1]!, parentId: match[2]!, flags: match[3]! };
}
