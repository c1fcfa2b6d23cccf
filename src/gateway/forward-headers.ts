import type { IncomingHttpHeaders, IncomingMessage } from 'node:http';
import { HttpError } from '../errors.js';
import type { ClientOrigin } from './client-ip.js';
import type { Identity } from './credentials/authenticate.js';

/** Headers a client may not set for the upstream: gatehouse owns them (compared with `_` read as `-`). */
const OWNED_HEADERS = [
  'x-forwarded-for', 'x-forwarded-proto', 'x-forwarded-host', 'x-forwarded-port', 'forwarded', 'x-real-ip', 'x-request-id',
  // Read by common frameworks as "what the proxy saw" (Spring, Rack, Symfony, IIS, CDNs): a client may not set them.
  'x-forwarded-prefix', 'x-forwarded-scheme', 'x-forwarded-ssl', 'x-forwarded-server', 'x-forwarded-path', 'x-original-forwarded-for',
  'x-original-url', 'x-rewrite-url', 'x-original-host', 'true-client-ip', 'x-client-ip', 'cf-connecting-ip', 'x-cluster-client-ip', 'fastly-client-ip',
];
const CREDENTIAL_HEADERS = ['x-api-key'];
/** Hop-by-hop (RFC 9110 7.6.1): about the client's connection, not the upstream's. A client's `Connection: close` must not end our keep-alive. */
const HOP_BY_HOP = ['connection', 'keep-alive', 'proxy-connection', 'te', 'upgrade', 'proxy-authorization', 'proxy-authenticate'];
const OWNED_PREFIX = 'x-gatehouse-';
const STRIPPED = new Set([...OWNED_HEADERS, ...HOP_BY_HOP]);
const STRIPPED_WITH_CREDENTIALS = new Set([...STRIPPED, ...CREDENTIAL_HEADERS]);
/** Headers that frame the message: a client may not have them dropped by naming them in Connection. */
const FRAMING = ['content-length', 'transfer-encoding', 'host'];

/**
 * Refuses framing an upstream could read differently (smuggling): a body on a method that has
 * none, or a Connection header naming a framing header (honouring it would strip the body's
 * length on the way up and let the body pass for a second request).
 */
export function checkConnectionHeader(req: IncomingMessage): HttpError | undefined {
  // A body on GET/HEAD/TRACE has no meaning (RFC 9110 9.3.1) and many servers never read it:
  // forwarded, its bytes would be parsed as the next request on the upstream connection.
  if ((req.method === 'GET' || req.method === 'HEAD' || req.method === 'TRACE') &&
      (req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) > 0)) {
    return new HttpError('invalid_request', `${req.method} with a body`);
  }
  const connection = req.headers.connection;
  if (connection === undefined || PLAIN_CONNECTION.test(connection)) return undefined;
  const named = connection.toLowerCase().split(',').map((t) => t.trim());
  return named.some((name) => FRAMING.includes(name)) ? new HttpError('invalid_request', `Connection names a framing header: ${connection}`) : undefined;
}

/** Connection values that name no other header: the common case skips parsing it. */
const PLAIN_CONNECTION = /^\s*(keep-alive|close)\s*$/i;

export interface ForwardContext {
  requestId: string;
  origin: ClientOrigin;
  identity: Identity;
  encrypted: boolean;
  forwardCredentials: boolean;
}

/**
 * Replaces the request's headers with what the upstream may see: client-sent identity and
 * forwarding headers removed (any case, `_` variants too), hop-by-hop headers removed,
 * credentials removed unless configured otherwise, then gatehouse's own set.
 * A new object rather than deletes: deleting keys would slow every later read of it.
 */
export function prepareUpstreamHeaders(req: IncomingMessage, ctx: ForwardContext): void {
  const headers = req.headers;
  const trustedProto = ctx.origin.viaTrustedProxy ? single(headers['x-forwarded-proto']) : undefined;
  const trustedHost = ctx.origin.viaTrustedProxy ? single(headers['x-forwarded-host']) : undefined;
  const stripped = ctx.forwardCredentials ? STRIPPED : STRIPPED_WITH_CREDENTIALS;
  const connection = headers.connection;
  const namedByConnection = connection !== undefined && !PLAIN_CONNECTION.test(connection)
    ? connection.toLowerCase().split(',').map((t) => t.trim()).filter((name) => !FRAMING.includes(name))
    : undefined;

  const out: IncomingHttpHeaders = {};
  for (const name in headers) {
    if (stripped.has(name) || name.startsWith(OWNED_PREFIX) || namedByConnection?.includes(name)) continue;
    if (name.includes('_')) {
      const canonical = name.replace(/_/g, '-');
      if (stripped.has(canonical) || canonical.startsWith(OWNED_PREFIX)) continue;
    }
    out[name] = headers[name];
  }
  // A bearer Authorization is a credential; other schemes (Basic…) are the upstream's business.
  if (!ctx.forwardCredentials && out.authorization !== undefined && /^bearer(\s|$)/i.test(out.authorization)) {
    delete out.authorization;
  }

  out['x-forwarded-for'] = ctx.origin.chain.join(', ');
  out['x-forwarded-proto'] = trustedProto === 'http' || trustedProto === 'https' ? trustedProto : ctx.encrypted ? 'https' : 'http';
  const host = trustedHost ?? headers.host;
  if (host !== undefined) out['x-forwarded-host'] = host;
  out['x-request-id'] = ctx.requestId;
  out['x-gatehouse-auth'] = ctx.identity.methods.length ? ctx.identity.methods.join(',') : 'none';
  if (ctx.identity.subject !== undefined) out['x-gatehouse-subject'] = headerSafe(ctx.identity.subject);
  if (ctx.identity.keyId !== undefined) out['x-gatehouse-key-id'] = ctx.identity.keyId;
  req.headers = out;
}

/** The nearest proxy's value: the last of a comma list (anything left of it may come from the client). */
function single(value: string | string[] | undefined): string | undefined {
  if (typeof value !== 'string') return undefined;
  const last = value.slice(value.lastIndexOf(',') + 1).trim();
  return last === '' ? undefined : last;
}

/** A JWT `sub` can hold anything; percent-encode what a header cannot carry (and `%` itself). */
const HEADER_SAFE = /^[\x20-\x24\x26-\x7e]*$/;
function headerSafe(value: string): string {
  if (HEADER_SAFE.test(value)) return value;
  // toWellFormed first: a lone surrogate (valid in JSON) would make encodeURIComponent throw.
  const wellFormed = (value as string & { toWellFormed(): string }).toWellFormed();
  return wellFormed.replace(/[^\x20-\x7e]|%/gu, (c) => encodeURIComponent(c));
}
