import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import { CONSOLE_SESSION_COOKIE, withoutCookie } from '../http/console-cookie.js';
import { FRAMING_HEADERS, isValidHost, PLAIN_CONNECTION } from '../http/listener.js';
import type { ClientOrigin } from '../http/client-ip.js';
import type { Identity } from './credentials/authenticate.js';

/** Headers a client may not set for the upstream: gatehouse owns them. */
const OWNED_HEADERS = [
  'forwarded',
  'x-forwarded',
  'forwarded-for',
  'x-real-ip',
  'x-request-id',
  // Read by common frameworks and helpers as "what the proxy saw" or "who the proxy let in" (Spring,
  // Rack, Symfony, IIS, PHP's client-IP recipes, CDNs, oauth2-proxy): a client may not set them.
  'x-original-forwarded-for',
  'x-original-url',
  'x-rewrite-url',
  'x-original-host',
  'x-host',
  'true-client-ip',
  'client-ip',
  'x-client-ip',
  'x-originating-ip',
  'x-remote-ip',
  'x-remote-addr',
  'remote-addr',
  'cf-connecting-ip',
  'x-cluster-client-ip',
  'fastly-client-ip',
  'remote-user',
  'x-remote-user',
  'x-user',
  'x-webauth-user',
  'x-auth-user',
  'x-remote-group',
  'x-original-uri',
  'x-original-method',
  'front-end-https',
  'x-url-scheme',
  'x-scheme',
  'x-arr-ssl',
  'x-arr-clientcert',
  'x-client-cert',
  'ssl-client-cert',
  'x-client-verify',
  'x-client-dn',
  // A method override lets a client turn the method gatehouse saw into another one upstream.
  'x-http-method-override',
  'x-http-method',
  'x-method-override',
  // Identity set by other edges (found by an outside attack): an upstream moved from behind Kong,
  // AWS ALB, Azure App Service, Google IAP or Cloudflare Access still trusts them.
  'x-authenticated-userid',
  'x-authenticated-scope',
  'x-authenticated-groups',
  'x-credential-identifier',
  'x-credential-username',
  'x-anonymous-consumer',
  'x-userinfo',
  'x-goog-authenticated-user-email',
  'x-goog-authenticated-user-id',
  'x-goog-iap-jwt-assertion',
];
/**
 * Whole families a client may not set: gatehouse's own, the proxy's forwarding headers, an auth
 * proxy's identity (oauth2-proxy, Kong's consumer, ALB's OIDC, Azure's tokens, Cloudflare Access).
 */
const OWNED_PREFIXES = [
  'x-gatehouse-',
  'x-forwarded-',
  'x-auth-request-',
  'x-ssl-',
  'x-client-cert-',
  'x-envoy-',
  'x-consumer-',
  'x-amzn-oidc-',
  'x-ms-client-principal',
  'x-ms-token-',
  'cf-access-',
];
const CREDENTIAL_HEADERS = ['x-api-key'];
/**
 * Hop-by-hop (RFC 9110 7.6.1): about the client's connection, not the upstream's. A client's
 * `Connection: close` must not end our keep-alive. `Trailer` announces trailers gatehouse never
 * forwards (and Node throws on it for a request that is not chunked); `Expect` is answered by
 * gatehouse itself, after the credentials.
 */
const HOP_BY_HOP = ['connection', 'keep-alive', 'te', 'upgrade', 'trailer', 'expect', 'proxy'];
/** `Proxy-*` (and `Proxy` itself: httpoxy, CGI's HTTP_PROXY) is about proxies, never the upstream's business. */
const HOP_BY_HOP_PREFIX = 'proxy-';
/** The body's framing on the way up is gatehouse's own choice (see prepareUpstreamHeaders), never the client's lines. */
const BODY_FRAMING = ['content-length', 'transfer-encoding'];
const STRIPPED = new Set([...OWNED_HEADERS, ...HOP_BY_HOP, ...BODY_FRAMING]);
const STRIPPED_WITH_CREDENTIALS = new Set([...STRIPPED, ...CREDENTIAL_HEADERS]);
const STRIPPED_PREFIXES = [...OWNED_PREFIXES, HOP_BY_HOP_PREFIX];

/** Letters, digits and `-`: the only header names forwarded (Node has already lower-cased them). */
const PLAIN_NAME = /^[a-z0-9-]+$/;

/**
 * Whether a client header is kept from the upstream. A name with any character outside
 * `[A-Za-z0-9-]` (`X_Forwarded_For`, `X-Gatehouse.Subject`, `Content_Type`) is never forwarded:
 * CGI, PHP and servers built on them turn every such character into `_`, so such a name can land
 * where gatehouse's own header (or a real framing header) does. nginx drops the same names by
 * default (ignore_invalid_headers, underscores_in_headers off). Plain names are stripped when
 * gatehouse owns them, by name or by family (prefix).
 */
function isStripped(name: string, stripped: ReadonlySet<string>): boolean {
  if (!PLAIN_NAME.test(name)) return true;
  if (stripped.has(name)) return true;
  for (const prefix of STRIPPED_PREFIXES) if (name.startsWith(prefix)) return true;
  return false;
}

/** Anything that starts like the Bearer scheme (`Bearer,x`, `BearerX y` too: an upstream might read it as one). */
const BEARER_SCHEME = /^\s*bearer/i;

export interface ForwardContext {
  requestId: string;
  origin: ClientOrigin;
  identity: Identity;
  encrypted: boolean;
  forwardCredentials: boolean;
}

/**
 * Replaces the request's headers with what the upstream may see: client-sent identity and
 * forwarding headers removed (any case, look-alike spellings too), hop-by-hop headers removed,
 * the body's framing restated,
 * credentials removed unless configured otherwise, then gatehouse's own set.
 * A new object rather than deletes: deleting keys would slow every later read of it.
 */
export function prepareUpstreamHeaders(req: IncomingMessage, ctx: ForwardContext): void {
  const headers = req.headers;
  const trustedProto = ctx.origin.viaTrustedProxy ? single(headers['x-forwarded-proto']) : undefined;
  const forwardedHost = ctx.origin.viaTrustedProxy ? single(headers['x-forwarded-host']) : undefined;
  const trustedHost = isValidHost(forwardedHost) ? forwardedHost : undefined;
  const stripped = ctx.forwardCredentials ? STRIPPED : STRIPPED_WITH_CREDENTIALS;
  const connection = headers.connection;
  const namedByConnection =
    connection !== undefined && !PLAIN_CONNECTION.test(connection)
      ? connection
          .toLowerCase()
          .split(',')
          .map((t) => t.trim())
          .filter((name) => !FRAMING_HEADERS.includes(name))
      : undefined;

  const out: IncomingHttpHeaders = {};
  for (const name in headers) {
    if (isStripped(name, stripped) || namedByConnection?.includes(name)) continue;
    out[name] = headers[name];
  }
  // The body goes up framed as gatehouse parsed it, stated by gatehouse: chunked stays chunked
  // (checkFraming let no other coding through), a length is re-sent as the number it is.
  if (headers['transfer-encoding'] !== undefined) out['transfer-encoding'] = 'chunked';
  else if (headers['content-length'] !== undefined) out['content-length'] = String(Number(headers['content-length']));
  // A bearer Authorization is a credential; other schemes (Basic…) are the upstream's business.
  if (!ctx.forwardCredentials && out.authorization !== undefined && BEARER_SCHEME.test(out.authorization)) {
    delete out.authorization;
  }
  // The admin console's session rides along to every port of the host: never up to an upstream.
  if (out.cookie !== undefined && out.cookie.includes(CONSOLE_SESSION_COOKIE)) {
    const rest = withoutCookie(out.cookie, CONSOLE_SESSION_COOKIE);
    if (rest === undefined) delete out.cookie;
    else out.cookie = rest;
  }

  out['x-forwarded-for'] = ctx.origin.chain.join(', ');
  out['x-forwarded-proto'] =
    trustedProto === 'http' || trustedProto === 'https' ? trustedProto : ctx.encrypted ? 'https' : 'http';
  // Host was checked at the door (one, host[:port]); a proxy's X-Forwarded-Host only if it is as sound.
  const host = trustedHost ?? headers.host;
  if (isValidHost(host)) out['x-forwarded-host'] = host;
  out['x-request-id'] = ctx.requestId;
  out['x-gatehouse-auth'] = ctx.identity.methods.length ? ctx.identity.methods.join(',') : 'none';
  if (ctx.identity.subject !== undefined) out['x-gatehouse-subject'] = headerSafe(ctx.identity.subject);
  if (ctx.identity.keyId !== undefined) out['x-gatehouse-key-id'] = ctx.identity.keyId;
  // scope-tokens only (schema and scopesOfClaims): header-safe as they are.
  if (ctx.identity.scopes.length > 0) out['x-gatehouse-scopes'] = ctx.identity.scopes.join(' ');
  // Lowercase hex (nothing to escape): which certificate, for an upstream that pins or logs it.
  if (ctx.identity.clientCertificate) out['x-gatehouse-client-cert-sha256'] = ctx.identity.clientCertificate.sha256;
  req.headers = out;
}

/** The nearest proxy's value: the last of a comma list (anything left of it may come from the client). */
function single(value: string | string[] | undefined): string | undefined {
  if (typeof value !== 'string') return undefined;
  const last = value.slice(value.lastIndexOf(',') + 1).trim();
  return last === '' ? undefined : last;
}

/**
 * A JWT `sub` can hold anything; percent-encode what a header cannot carry, `%` itself, `,`
 * (a header parser may read `admin, root` as a list), and spaces at either end (a header parser
 * trims them: `"  admin  "` would arrive as `admin`).
 */
const HEADER_SAFE = /^(?! )[\x20-\x24\x26-\x2b\x2d-\x7e]*$/;
const UNSAFE = /[^\x20-\x7e]|[%,]|^ +| +$/gu;
export function headerSafe(value: string): string {
  if (HEADER_SAFE.test(value) && !value.endsWith(' ')) return value;
  // toWellFormed first: a lone surrogate (valid in JSON) would make encodeURIComponent throw.
  const wellFormed = (value as string & { toWellFormed(): string }).toWellFormed();
  return wellFormed.replace(UNSAFE, (c) => (c.startsWith(' ') ? '%20'.repeat(c.length) : encodeURIComponent(c)));
}
