import type { IncomingMessage } from 'node:http';
import type { ClientOrigin } from './client-ip.js';
import type { Identity } from './credentials/authenticate.js';

/** Headers a client may not set for the upstream: gatehouse owns them (compared with `_` read as `-`). */
const OWNED_HEADERS = new Set(['x-forwarded-for', 'x-forwarded-proto', 'x-forwarded-host', 'x-forwarded-port', 'forwarded', 'x-real-ip', 'x-request-id']);
const CREDENTIAL_HEADERS = new Set(['x-api-key']);
/** Hop-by-hop (RFC 9110 7.6.1): about the client's connection, not the upstream's. A client's `Connection: close` must not end our keep-alive. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'te', 'upgrade', 'proxy-authorization', 'proxy-authenticate']);
const OWNED_PREFIX = 'x-gatehouse-';

export interface ForwardContext {
  requestId: string;
  origin: ClientOrigin;
  identity: Identity;
  encrypted: boolean;
  forwardCredentials: boolean;
}

/**
 * Rewrites the request's headers in place into what the upstream may see:
 * client-sent identity and forwarding headers removed (any case, `_` variants too),
 * credentials removed unless configured otherwise, then gatehouse's own set.
 */
export function prepareUpstreamHeaders(req: IncomingMessage, ctx: ForwardContext): void {
  const headers = req.headers;
  const trustedProto = ctx.origin.viaTrustedProxy ? single(headers['x-forwarded-proto']) : undefined;
  const trustedHost = ctx.origin.viaTrustedProxy ? single(headers['x-forwarded-host']) : undefined;

  const connectionOptions = typeof headers.connection === 'string' ? headers.connection.toLowerCase().split(',').map((t) => t.trim()) : [];
  for (const name of Object.keys(headers)) {
    const canonical = name.includes('_') ? name.replace(/_/g, '-') : name;
    if (
      canonical.startsWith(OWNED_PREFIX) || OWNED_HEADERS.has(canonical) || HOP_BY_HOP.has(name) || connectionOptions.includes(name) ||
      (!ctx.forwardCredentials && CREDENTIAL_HEADERS.has(canonical))
    ) {
      delete headers[name];
    }
  }
  if (!ctx.forwardCredentials && headers.authorization !== undefined && /^bearer(\s|$)/i.test(headers.authorization)) {
    delete headers.authorization;
  }

  headers['x-forwarded-for'] = ctx.origin.chain.join(', ');
  headers['x-forwarded-proto'] = trustedProto === 'http' || trustedProto === 'https' ? trustedProto : ctx.encrypted ? 'https' : 'http';
  const host = trustedHost ?? headers.host;
  if (host !== undefined) headers['x-forwarded-host'] = host;
  headers['x-request-id'] = ctx.requestId;
  headers['x-gatehouse-auth'] = ctx.identity.methods.length ? ctx.identity.methods.join(',') : 'none';
  if (ctx.identity.subject !== undefined) headers['x-gatehouse-subject'] = headerSafe(ctx.identity.subject);
  if (ctx.identity.keyId !== undefined) headers['x-gatehouse-key-id'] = ctx.identity.keyId;
}

/** The nearest proxy's value: the last of a comma list (anything left of it may come from the client). */
function single(value: string | string[] | undefined): string | undefined {
  if (typeof value !== 'string') return undefined;
  const last = value.slice(value.lastIndexOf(',') + 1).trim();
  return last === '' ? undefined : last;
}

/** A JWT `sub` can hold anything; percent-encode what a header cannot carry (and `%` itself). */
function headerSafe(value: string): string {
  // toWellFormed first: a lone surrogate (valid in JSON) would make encodeURIComponent throw.
  const wellFormed = (value as string & { toWellFormed(): string }).toWellFormed();
  return wellFormed.replace(/[^\x20-\x7e]|%/gu, (c) => encodeURIComponent(c));
}
