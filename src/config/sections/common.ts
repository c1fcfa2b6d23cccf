import { z } from 'zod';
import { isValidAddressRange } from '../../http/ip-ranges.js';
import { pathPatternProblem } from '../../gateway/path-pattern.js';
import { compileTemplate } from '../../webhooks/translate.js';
import { redactUrlCredentials } from '../redact.js';

// The building blocks several sections share: addresses, URLs, listeners and their limits, scopes, path patterns.
// Every key carries its description (`.describe`), the one source of gateway.schema.json's hover texts and of
// docs/configuration.md (scripts/docs.ts); a test fails when a key has none.

declare module 'zod' {
  interface GlobalMeta {
    /** How docs/configuration.md names the type where the JSON Schema says too little (a pattern, a refinement). */
    docsType?: string;
    /** The default in words where it is computed rather than one value (docs/configuration.md). */
    docsDefault?: string;
  }
}

/** An IP address or CIDR, IPv4 or IPv6 (`10.0.0.0/8`, `::1`). */
export const addressRange = z
  .string()
  .superRefine((value, ctx) => {
    if (!isValidAddressRange(value)) ctx.addIssue({ code: 'custom', message: `invalid CIDR "${value}"` });
  })
  .meta({ docsType: 'IP address or CIDR' });

export const httpUrl = (what: string) =>
  z
    .string()
    .superRefine((value, ctx) => {
      let url: URL;
      // "localhost:3000" parses as a URL with scheme "localhost:": say what is actually wrong.
      if (!/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(value)) {
        ctx.addIssue({
          code: 'custom',
          message: `${what} must be an absolute http(s) URL: the scheme is missing in "${redactUrlCredentials(value)}" (e.g. "http://${redactUrlCredentials(value)}")`,
        });
        return;
      }
      try {
        url = new URL(value);
      } catch {
        ctx.addIssue({
          code: 'custom',
          message: `${what} must be an absolute http(s) URL, got "${redactUrlCredentials(value)}"`,
        });
        return;
      }
      if (url.protocol !== 'http:' && url.protocol !== 'https:') {
        ctx.addIssue({ code: 'custom', message: `${what} must use http or https, got "${url.protocol}"` });
      }
    })
    .meta({ docsType: 'http(s) URL' });

export const port = z.number().int().min(0).max(65535);
export const positiveInt = z.number().int().positive();

export const listen = (defaultPort: number) =>
  z.strictObject({
    host: z
      .string()
      .min(1)
      .default('127.0.0.1')
      .describe('The address to bind: loopback by default; `0.0.0.0` or `::` for every interface.'),
    port: port.default(defaultPort).describe('The TCP port; `0` takes any free port.'),
  });

/**
 * The HTTP parser's limits on a listener, all explicit (Node's defaults are generous and some,
 * like its silent header-count cut, are unsafe for a proxy). See src/http/listener.ts.
 */
export const httpLimits = (requestTimeoutMs: number) =>
  z
    .strictObject({
      maxHeaderCount: z
        .number()
        .int()
        .min(16)
        .max(1000)
        .default(100)
        // Never cut: Node's silent cut is what made header-count smuggling possible.
        .describe(
          "Header lines per request (Apache's LimitRequestFields); a request with more gets 431 and its connection is closed.",
        ),
      maxHeaderBytes: z
        .number()
        .int()
        .min(1024)
        .max(65_536)
        .default(16_384)
        .describe(
          "Bytes of the request line and headers together, as Node's parser counts them; past it, 431. On the gateway, keep the upstream's own limit at least this plus the ~300 bytes gatehouse adds.",
        ),
      headersTimeoutMs: positiveInt
        .default(15_000)
        .describe(
          'Milliseconds a client has to send the request line and headers (slow-loris guard); past it, 408 and the connection is closed.',
        ),
      requestTimeoutMs: positiveInt
        .default(requestTimeoutMs)
        .describe(
          'Milliseconds a client has to send the whole request, body included; past it, 408. Must be at least headersTimeoutMs.',
        ),
      keepAliveTimeoutMs: positiveInt
        .default(5_000)
        .describe(
          'Milliseconds an idle keep-alive connection stays open; make it longer than the idle timeout of a load balancer in front.',
        ),
    })
    .superRefine((limits, ctx) => {
      if (limits.headersTimeoutMs > limits.requestTimeoutMs)
        ctx.addIssue({
          code: 'custom',
          path: ['headersTimeoutMs'],
          message: 'headersTimeoutMs must not exceed requestTimeoutMs',
        });
    });

/** An OAuth scope-token (RFC 6749 §3.3): printable ASCII except space, `"` and `\\`. */
export const scopeToken = z
  .string()
  .regex(
    /^[\x21\x23-\x5b\x5d-\x7e]{1,128}$/,
    'a scope is 1-128 printable ASCII characters without space, " or \\ (RFC 6749 scope-token)',
  );
/** A period like "1s", "30s", "1m", "1h", "1d", as seconds. */
export const period = z
  .string({
    error: (issue) =>
      `per ${issue.input === undefined ? 'is required' : 'must be text'}: a whole number followed by s, m, h or d (e.g. "1m")`,
  })
  .regex(/^[1-9]\d{0,5}[smhd]$/, 'per must be a whole number followed by s, m, h or d (e.g. "1m")')
  .transform(
    (text) => Number(text.slice(0, -1)) * { s: 1, m: 60, h: 3600, d: 86_400 }[text.at(-1) as 's' | 'm' | 'h' | 'd'],
  )
  .meta({ docsType: 'period like "1m"' });
/** `/api/…` (or `/_gatehouse/…`) patterns: `*` one segment, `**` (last) any rest. */
export const pathPatterns = z
  .array(
    z.string().superRefine((pattern, ctx) => {
      const problem = pathPatternProblem(pattern);
      if (problem) ctx.addIssue({ code: 'custom', message: problem });
    }),
  )
  .min(1);
/** Methods as Node reports them: upper case tokens. */
export const methods = z.array(z.string().regex(/^[A-Z]{1,20}$/, 'methods are upper case, e.g. "GET"')).min(1);
export const rateLimitQuota = {
  requests: positiveInt.describe('How many requests are allowed per `per` (the refill rate).'),
  per: period.describe(
    'The period `requests` refill over: a whole number and `s`, `m`, `h` or `d` (`"1s"`, `"1m"`, `"1h"`, `"1d"`).',
  ),
};

/**
 * Where a schema takes `unknown` and parses it by hand (for speed), the schema of what a config file
 * holds there: json-schema.ts emits that one, so editors and docs/configuration.md still see its keys.
 */
export const writtenAs = new WeakMap<z.core.$ZodType, z.core.$ZodType>();

/** A message template (`{{a.b[0].c}}` property paths), compiled once here so a broken one is a config error. */
export const messageTemplate = z.string().superRefine((template, ctx) => {
  try {
    compileTemplate(template);
  } catch (err) {
    ctx.addIssue({ code: 'custom', message: (err as Error).message });
  }
});

export const hookSecret = (what: string) => z.string().min(16, `${what} must be at least 16 characters`);

const DURATION_UNIT_MS = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;
/** A duration as text (`72h`, `30m`, `7d`, `90s`, `500ms`), parsed to milliseconds. */
export const duration = z
  .string({
    error: (issue) =>
      `${issue.input === undefined ? 'required: ' : ''}a duration as text, like "72h", "30m", "7d" or "90s"`,
  })
  .regex(/^[1-9]\d*(ms|s|m|h|d)$/, 'a duration like "72h", "30m", "7d" or "90s"')
  .transform((text) => {
    const [, amount, unit] = /^(\d+)(ms|s|m|h|d)$/.exec(text)!;
    return Number(amount) * DURATION_UNIT_MS[unit as keyof typeof DURATION_UNIT_MS];
  })
  .meta({ docsType: 'duration like "72h"' });
