import type { IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { GatewayConfig } from '../config/schema.js';
import type { CorsConfig } from '../config/sections/cors.js';
import { HttpError } from '../errors.js';
import { matchablePath } from './path-pattern.js';

/*
 * CORS at the edge, following the Fetch standard's CORS protocol (fetch.spec.whatwg.org,
 * "HTTP CORS protocol" and "CORS check"): a browser compares `Access-Control-Allow-Origin` with
 * its serialized origin byte for byte, so an origin is matched exactly as browsers serialize it
 * (lower-case scheme and host, punycode, no default port), never by suffix or substring.
 *
 * Where the standard leaves the server a choice, gatehouse does what Kong's cors plugin and
 * Traefik's headers middleware do: the preflight is answered at the edge and never proxied
 * (Kong's `preflight_continue: false`), the upstream's own `Access-Control-*` headers are
 * replaced (Traefik: "if this value is set by a backend service, it will be overwritten"), and
 * `Vary: Origin` goes on every answer whose headers depend on the Origin (Kong, Traefik's
 * `addVaryHeader`).
 */

/** What gatehouse always lets a page read: why it was refused, and which request it was. */
export const ALWAYS_EXPOSED = ['RateLimit', 'RateLimit-Policy', 'Retry-After', 'X-Request-Id'] as const;
/** What a page may always send: gatehouse's own credentials. */
export const ALWAYS_ALLOWED = ['Authorization', 'X-API-Key'] as const;

/** The answer `preflight` gave itself (a 204): nothing more to do for this request. */
export const ANSWERED = Symbol('cors preflight answered');

/** RFC 9110 §5.6.2 token: a header name. */
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
/** One DNS label as browsers serialize it (lower case LDH, punycode included): what `*` in `https://*.example.com` stands for. */
const LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
/** `scheme://` then the rest, with nothing that makes it more than an origin (a path, query, fragment or user). */
const ORIGIN_SYNTAX = /^([A-Za-z][A-Za-z0-9+.-]*):\/\/([^/?#@\\]+)$/;

/** An entry of `origins`, parsed: every origin, one origin, or the direct subdomains of a host. */
export type OriginPattern =
  | { kind: 'any' }
  | { kind: 'exact'; origin: string }
  /** `key` is the pattern as a browser-serialized origin with `*` as its first label: `https://*.example.com:8443`. */
  | { kind: 'subdomain'; key: string };

/**
 * Parses one configured origin, or says why it is refused (a config error). Accepted:
 * `"*"`; `http(s)://host[:port]`, normalized as a browser serializes it (`https://App.example.com:443`
 * is `https://app.example.com`); and `http(s)://*.host[:port]`, where `*` is exactly one label,
 * as in a TLS wildcard certificate (RFC 6125 §6.4.3): `https://*.example.com` matches
 * `https://app.example.com`, not `https://example.com`, `https://a.b.example.com`,
 * `https://evil-example.com` or `https://app.example.com.evil.com`.
 */
export function parseOriginPattern(text: string): OriginPattern | string {
  if (text === '*') return { kind: 'any' };
  if (text.toLowerCase() === 'null') {
    // Every sandboxed iframe, data: URL and file: page sends "null": allowing it allows them all.
    return '"null" is the origin of every sandboxed iframe, data: URL and file: page, so it cannot be allowed by name; use "*" for a public API';
  }
  const syntax = ORIGIN_SYNTAX.exec(text);
  if (!syntax)
    return `"${text}" is not an origin: write scheme://host[:port], with no path, not even "/" (e.g. "https://app.example.com")`;
  const scheme = syntax[1]!.toLowerCase();
  if (scheme !== 'http' && scheme !== 'https') return `"${text}": only http and https origins can be allowed`;
  let hostPort = syntax[2]!;
  const wildcard = hostPort.startsWith('*.');
  if (wildcard) hostPort = hostPort.slice(2);
  if (hostPort.includes('*'))
    return `"${text}": "*" may only be the whole first label of the host (e.g. "https://*.example.com")`;
  let url: URL;
  try {
    url = new URL(`${scheme}://${wildcard ? 'wildcard.' : ''}${hostPort}`);
  } catch {
    return `"${text}" is not an origin: its host or port is invalid`;
  }
  if (!wildcard) return { kind: 'exact', origin: url.origin };
  const suffix = url.hostname.slice('wildcard.'.length);
  // A suffix of one label (`*.com`) would allow a whole top-level domain; an IP address has no subdomains.
  if (!suffix.includes('.') || suffix.startsWith('[') || /^\d+$/.test(suffix.slice(suffix.lastIndexOf('.') + 1))) {
    return `"${text}": a wildcard needs a domain of at least two labels after "*." (e.g. "https://*.example.com"), not a top-level domain or an IP address`;
  }
  return { kind: 'subdomain', key: `${url.protocol}//*.${suffix}${url.port ? `:${url.port}` : ''}` };
}

/** Whether an `Origin` value is allowed: a Set lookup, plus one for subdomain patterns. */
export type OriginMatcher = (origin: string) => boolean;

/** Compiles `origins` (already validated by the schema) into one O(1) check. */
export function compileOriginMatcher(origins: readonly string[]): OriginMatcher {
  const exact = new Set<string>();
  const subdomains = new Set<string>();
  for (const text of origins) {
    const pattern = parseOriginPattern(text);
    if (typeof pattern === 'string') throw new Error(`gateway.cors: ${pattern}`);
    if (pattern.kind === 'any') return () => true;
    if (pattern.kind === 'exact') exact.add(pattern.origin);
    else subdomains.add(pattern.key);
  }
  if (subdomains.size === 0) return (origin) => exact.has(origin);
  return function matchOrigin(origin) {
    if (exact.has(origin)) return true;
    // `https://app.example.com:8443` → label `app`, key `https://*.example.com:8443`: the rest must equal a pattern exactly.
    const hostAt = origin.indexOf('://') + 3;
    const dot = origin.indexOf('.', hostAt);
    if (hostAt === 2 || dot === -1) return false;
    return LABEL.test(origin.slice(hostAt, dot)) && subdomains.has(`${origin.slice(0, hostAt)}*${origin.slice(dot)}`);
  };
}

/** One `cors` setting, compiled: what is checked and sent, built once per config. */
export interface CorsPolicy {
  readonly allows: OriginMatcher;
  /** `"*"` is configured: `Access-Control-Allow-Origin: *` rather than the origin itself. */
  readonly anyOrigin: boolean;
  readonly credentials: boolean;
  /** `Access-Control-Expose-Headers` on every answer but a preflight's. */
  readonly exposeHeaders: string;
  /** `Access-Control-Allow-Methods` on a preflight. */
  readonly allowMethods: string;
  /** Lower-case header names a page may send besides `ALWAYS_ALLOWED`; undefined: any it asks for. */
  readonly allowHeaders: ReadonlySet<string> | undefined;
  /** `Access-Control-Max-Age`, in seconds. */
  readonly maxAge: string;
}

export function compileCorsPolicy(config: CorsConfig): CorsPolicy {
  const expose = dedupe([...ALWAYS_EXPOSED, ...config.exposeHeaders]);
  return {
    allows: compileOriginMatcher(config.origins),
    anyOrigin: config.origins.includes('*'),
    credentials: config.credentials,
    exposeHeaders: expose.join(', '),
    allowMethods: config.methods.join(', '),
    allowHeaders: config.allowHeaders && new Set(config.allowHeaders.map((name) => name.toLowerCase())),
    maxAge: String(Math.floor(config.maxAge / 1000)),
  };
}

/** Header names without repeats, compared in any case, the first spelling kept. */
function dedupe(names: readonly string[]): string[] {
  const seen = new Set<string>();
  return names.filter((name) => {
    const folded = name.toLowerCase();
    if (seen.has(folded)) return false;
    seen.add(folded);
    return true;
  });
}

const ALWAYS_ALLOWED_FOLDED = new Set(ALWAYS_ALLOWED.map((name) => name.toLowerCase()));

/**
 * `Access-Control-Allow-Headers` for a preflight: gatehouse's credential headers, then those the
 * page asked for (`Access-Control-Request-Headers`, a comma-separated list of names) that are
 * allowed. A name that is not a token is left out; the browser then refuses to send it.
 */
export function allowedRequestHeaders(policy: CorsPolicy, requested: string | undefined): string {
  let answer = ALWAYS_ALLOWED.join(', ');
  if (requested === undefined) return answer;
  const seen = new Set(ALWAYS_ALLOWED_FOLDED);
  for (const part of requested.split(',')) {
    const name = part.trim().toLowerCase();
    if (!TOKEN.test(name) || seen.has(name)) continue;
    seen.add(name);
    if (policy.allowHeaders === undefined || policy.allowHeaders.has(name)) answer += `, ${name}`;
  }
  return answer;
}

/**
 * Gatehouse owns CORS on this answer: the upstream's `Access-Control-*` headers are dropped (the
 * ones set on `res` stand), and its `Vary` keeps naming Origin. `headers` is the upstream's, as
 * about to be written.
 */
export function replaceUpstreamCors(headers: OutgoingHttpHeaders): void {
  for (const name in headers) if (name.startsWith('access-control-')) delete headers[name];
  const vary = headers.vary;
  if (vary === undefined) return;
  const text = Array.isArray(vary) ? vary.join(', ') : String(vary);
  if (text.trim() === '*' || /(?:^|,)\s*origin\s*(?:,|$)/i.test(text)) headers.vary = text;
  else headers.vary = `${text}, Origin`;
}

/** The CORS steps of the /api/ pipeline (see compileCors). */
export interface CorsEdge {
  /**
   * First step, before the path gate: for a request with an `Origin` on a route with CORS, the
   * headers every answer to it carries (whoever writes it: an error, a 429, the upstream's), and
   * the decision on `req.gatehouse.cors`. Never refuses.
   */
  decorate(req: IncomingMessage, res: ServerResponse): undefined;
  /**
   * After allowedIPs, before the lockout and credentials: answers a preflight (`OPTIONS` with
   * `Origin` and `Access-Control-Request-Method`): 204 for an allowed origin, 403
   * `cors_origin_not_allowed` otherwise. Neither reaches the upstream or the lockout.
   */
  preflight(req: IncomingMessage, res: ServerResponse): HttpError | typeof ANSWERED | undefined;
}

/**
 * Compiles `gateway.cors` and the routes' `cors` once per config; undefined when neither is set,
 * so the /api/ pipeline does no CORS work at all. `selectRoute` is the pipeline's own route choice
 * (routes.ts), consulted only when some route has its own `cors`.
 */
export function compileCors(
  gateway: Pick<GatewayConfig, 'cors' | 'routes'>,
  selectRoute: (url: string, decodedPath: string) => { prefix: string } | HttpError,
): CorsEdge | undefined {
  const global = gateway.cors && compileCorsPolicy(gateway.cors);
  // A route's `cors` replaces gateway.cors for it; `false` turns CORS off there (the upstream answers it).
  const byPrefix = new Map<string, CorsPolicy | undefined>();
  for (const route of gateway.routes) {
    if (route.cors !== undefined)
      byPrefix.set(route.prefix, route.cors === false ? undefined : compileCorsPolicy(route.cors));
  }
  if (global === undefined && byPrefix.size === 0) return undefined;

  const policyFor =
    byPrefix.size === 0
      ? () => global
      : (req: IncomingMessage) => {
          // Before the path gate: a target it will refuse gets gateway.cors (its 400 is readable then).
          const path = matchablePath(req.url!);
          const route = typeof path === 'string' ? selectRoute(req.url!, path) : path;
          if (route instanceof HttpError || !byPrefix.has(route.prefix)) return global;
          return byPrefix.get(route.prefix);
        };

  return {
    decorate: function corsHeaders(req, res) {
      const origin = req.headers.origin;
      if (origin === undefined) return undefined;
      const policy = policyFor(req);
      if (policy === undefined) return undefined;
      // Allowed or not, this answer depends on Origin: a cache must not serve it to another (Fetch §3.2.5 "CORS protocol and HTTP caches").
      res.setHeader('vary', 'Origin');
      if (!policy.allows(origin)) {
        req.gatehouse!.cors = false;
        return undefined;
      }
      req.gatehouse!.cors = policy;
      res.setHeader('access-control-allow-origin', policy.anyOrigin ? '*' : origin);
      if (policy.credentials) res.setHeader('access-control-allow-credentials', 'true');
      if (!isPreflight(req)) res.setHeader('access-control-expose-headers', policy.exposeHeaders);
      return undefined;
    },
    preflight: function corsPreflight(req, res) {
      const policy = req.gatehouse!.cors;
      if (policy === undefined || !isPreflight(req)) return undefined;
      if (policy === false)
        return new HttpError('cors_origin_not_allowed', `Origin ${req.headers.origin} is not allowed`);
      // A method outside `methods` is still answered 204 with the list: the browser refuses the
      // request and says which method was missing (as for headers). GET, HEAD and POST pass a
      // browser's check whatever the list says (CORS-safelisted methods).
      res.writeHead(204, {
        'access-control-allow-methods': policy.allowMethods,
        'access-control-allow-headers': allowedRequestHeaders(policy, req.headers['access-control-request-headers']),
        'access-control-max-age': policy.maxAge,
      });
      res.end();
      return ANSWERED;
    },
  };
}

/** A CORS preflight (Fetch "CORS-preflight request"): OPTIONS with Origin and Access-Control-Request-Method. */
function isPreflight(req: IncomingMessage): boolean {
  return (
    req.method === 'OPTIONS' &&
    req.headers['access-control-request-method'] !== undefined &&
    req.headers.origin !== undefined
  );
}
