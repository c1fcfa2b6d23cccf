import { z } from 'zod';
import { isValidAddressRange } from '../../gateway/ip-allowlist.js';
import { pathPatternProblem } from '../../gateway/path-pattern.js';
import { redactUrlCredentials } from '../redact.js';

// The building blocks several sections share: addresses, URLs, listeners and their limits, scopes, path patterns.

/** An IP address or CIDR, IPv4 or IPv6 (`10.0.0.0/8`, `::1`). */
export const addressRange = z.string().superRefine((value, ctx) => {
  if (!isValidAddressRange(value)) ctx.addIssue({ code: 'custom', message: `invalid CIDR "${value}"` });
});

export const httpUrl = (what: string) =>
  z.string().superRefine((value, ctx) => {
    let url: URL;
    // "localhost:3000" parses as a URL with scheme "localhost:": say what is actually wrong.
    if (!/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(value)) {
      ctx.addIssue({ code: 'custom', message: `${what} must be an absolute http(s) URL: the scheme is missing in "${redactUrlCredentials(value)}" (e.g. "http://${redactUrlCredentials(value)}")` });
      return;
    }
    try {
      url = new URL(value);
    } catch {
      ctx.addIssue({ code: 'custom', message: `${what} must be an absolute http(s) URL, got "${redactUrlCredentials(value)}"` });
      return;
    }
    if (url.protocol !== 'http:' && url.protocol !== 'https:') {
      ctx.addIssue({ code: 'custom', message: `${what} must use http or https, got "${url.protocol}"` });
    }
  });

export const port = z.number().int().min(0).max(65535);
export const positiveInt = z.number().int().positive();

export const listen = (defaultPort: number) =>
  z.strictObject({
    host: z.string().min(1).default('127.0.0.1'),
    port: port.default(defaultPort),
  });

/**
 * The HTTP parser's limits on a listener, all explicit (Node's defaults are generous and some,
 * like its silent header-count cut, are unsafe for a proxy). See src/http/listener.ts.
 */
export const httpLimits = (requestTimeoutMs: number) =>
  z.strictObject({
    /** Header lines per request; a request with more is refused (431), never cut. Apache's LimitRequestFields. */
    maxHeaderCount: z.number().int().min(16).max(1000).default(100),
    /** Bytes of the request line and headers together (431 past it). */
    maxHeaderBytes: z.number().int().min(1024).max(65_536).default(16_384),
    /** Time to receive the request line and headers (408, connection closed). */
    headersTimeoutMs: positiveInt.default(15_000),
    /** Time to receive the whole request, body included (408). */
    requestTimeoutMs: positiveInt.default(requestTimeoutMs),
    /** How long an idle keep-alive connection stays open (make it longer than a load balancer's idle timeout in front). */
    keepAliveTimeoutMs: positiveInt.default(5_000),
  }).superRefine((limits, ctx) => {
    if (limits.headersTimeoutMs > limits.requestTimeoutMs) ctx.addIssue({ code: 'custom', path: ['headersTimeoutMs'], message: 'headersTimeoutMs must not exceed requestTimeoutMs' });
  });

/** An OAuth scope-token (RFC 6749 §3.3): printable ASCII except space, `"` and `\\`. */
export const scopeToken = z.string().regex(/^[\x21\x23-\x5b\x5d-\x7e]{1,128}$/, 'a scope is 1-128 printable ASCII characters without space, " or \\ (RFC 6749 scope-token)');
/** A period like "1s", "30s", "1m", "1h", "1d", as seconds. */
export const period = z.string({ error: (issue) => `per ${issue.input === undefined ? 'is required' : 'must be text'}: a whole number followed by s, m, h or d (e.g. "1m")` }).regex(/^[1-9]\d{0,5}[smhd]$/, 'per must be a whole number followed by s, m, h or d (e.g. "1m")')
  .transform((text) => Number(text.slice(0, -1)) * { s: 1, m: 60, h: 3600, d: 86_400 }[text.at(-1) as 's' | 'm' | 'h' | 'd']);
/** `/api/…` (or `/_gatehouse/…`) patterns: `*` one segment, `**` (last) any rest. */
export const pathPatterns = z.array(z.string().superRefine((pattern, ctx) => {
  const problem = pathPatternProblem(pattern);
  if (problem) ctx.addIssue({ code: 'custom', message: problem });
})).min(1);
/** Methods as Node reports them: upper case tokens. */
export const methods = z.array(z.string().regex(/^[A-Z]{1,20}$/, 'methods are upper case, e.g. "GET"')).min(1);
export const rateLimitQuota = { requests: positiveInt, per: period };

export const hookSecret = (what: string) => z.string().min(16, `${what} must be at least 16 characters`);
