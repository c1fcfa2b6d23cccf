import { z } from 'zod';
import { httpUrl, positiveInt } from './common.js';

/**
 * `observability.tracing`: OpenTelemetry traces exported over OTLP/HTTP (src/observability/tracing.ts).
 * Off unless configured; then the request paths make no tracing call at all. Read at start only.
 */
const tracing = z
  .strictObject({
    exporter: z
      .literal('otlp', { error: 'exporter must be "otlp" (OTLP/HTTP with JSON bodies)' })
      .default('otlp')
      .describe(
        'How spans leave: `"otlp"`, OTLP/HTTP with JSON bodies (`@opentelemetry/exporter-trace-otlp-http`), the only one.',
      ),
    endpoint: httpUrl('endpoint')
      .refine((url) => !URL.canParse(url) || (new URL(url).username === '' && new URL(url).password === ''), {
        error:
          "endpoint must not carry a user or password (the exporter would not send them): put the collector's credentials in headers",
      })
      .describe(
        'The collector\'s OTLP/HTTP base URL, e.g. `"http://collector:4318"`: spans are POSTed to `<endpoint>/v1/traces` (a URL already ending in `/v1/traces` is used as it is), as `OTEL_EXPORTER_OTLP_ENDPOINT` works.',
      ),
    sampleRatio: z
      .number({ error: 'sampleRatio must be a number from 0 to 1' })
      .min(0, 'sampleRatio must be from 0 to 1')
      .max(1, 'sampleRatio must be from 0 to 1')
      .default(1)
      .describe(
        "The share of new traces recorded, from `0` (none) to `1` (all), decided from the trace id (OpenTelemetry's `TraceIdRatioBased`). A trace continued from a trusted proxy follows its sampled flag instead (`ParentBased`), and so does every delivery of a webhook event.",
      ),
    serviceName: z
      .string()
      .min(1)
      .default('gatehouse')
      .describe('The `service.name` resource attribute of every span.'),
    headers: z
      .record(z.string().regex(/^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/, 'a header name is an HTTP token'), z.string())
      .optional()
      .describe(
        'Headers sent with every export, e.g. `{ authorization: "Bearer ${OTLP_TOKEN}" }` for a hosted collector. Shown redacted by `config print`.',
      ),
    maxQueueSize: positiveInt
      .default(2048)
      .describe(
        'Finished spans waiting for export at most; past it new spans are dropped (and counted in `gatehouse_trace_spans_dropped_total`), so a slow or absent collector never holds requests or memory.',
      ),
  })
  .optional()
  .describe('OpenTelemetry tracing of `/api/` requests and webhook events. Off unless this section is present.');

/** `observability`: what gatehouse reports about itself beyond logs and metrics. */
export const observability = z
  .strictObject({ tracing })
  .prefault({})
  .describe('Traces (OpenTelemetry). Changes take effect at the next restart.');
