import type { IncomingMessage } from 'node:http';
import type { AuthConfig } from '../config/schema.js';
import { HttpError } from '../errors.js';

/** The subprotocol a browser offers beside its credential, and that gatehouse answers when the upstream selects none. */
export const GATEHOUSE_PROTOCOL = 'gatehouse';
const BEARER_PROTOCOL = 'gatehouse.bearer.';
const API_KEY_PROTOCOL = 'gatehouse.api-key.';
/** A compact JWS (RFC 7515 §7.1): what a query credential must look like to be read as a bearer token. */
const COMPACT_JWS = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/;

/**
 * Moves a credential a browser had to put elsewhere into the header the authenticator reads
 * (`Authorization: Bearer` or `X-API-Key`), so it is checked exactly like one, and takes it out
 * of what the upstream will see. Undefined (go on) or the error to answer.
 */
export type BrowserCredentialReader = (req: IncomingMessage, upgrade: boolean) => HttpError | undefined;

/** Whether the client offered the `gatehouse` subprotocol (set by the reader on an upgrade). */
const offeredGatehouse = new WeakSet<IncomingMessage>();
export function offeredGatehouseProtocol(req: IncomingMessage): boolean {
  return offeredGatehouse.has(req);
}

/**
 * Compiles `gateway.auth.browser`; undefined when both forms are off (the /api/ path then does
 * nothing more per request). `websocketProtocol` (upgrades only): `Sec-WebSocket-Protocol:
 * gatehouse, gatehouse.bearer.<JWT>` or `gatehouse.api-key.<key>` (how Kubernetes and OpenAI pass a
 * credential from a browser's `new WebSocket(url, protocols)`). `queryParameter` (GET only:
 * EventSource and WebSocket): a JWT or an API key in that parameter, removed from the URL.
 */
export function compileBrowserCredentials(browser: AuthConfig['browser']): BrowserCredentialReader | undefined {
  const { websocketProtocol, queryParameter } = browser;
  if (!websocketProtocol && queryParameter === undefined) return undefined;
  return function readBrowserCredential(req, upgrade) {
    if (upgrade && websocketProtocol) {
      const refused = fromWebSocketProtocol(req);
      if (refused) return refused;
    }
    if (queryParameter !== undefined && req.method === 'GET') return fromQuery(req, queryParameter);
    return undefined;
  };
}

function fromWebSocketProtocol(req: IncomingMessage): HttpError | undefined {
  const lines = req.headersDistinct['sec-websocket-protocol'];
  if (lines === undefined) return undefined;
  const offered = lines
    .join(',')
    .split(',')
    .map((p) => p.trim())
    .filter((p) => p !== '');
  if (!offered.some((p) => p === GATEHOUSE_PROTOCOL || p.startsWith(`${GATEHOUSE_PROTOCOL}.`))) return undefined;
  const credentials = offered.filter((p) => p.startsWith(BEARER_PROTOCOL) || p.startsWith(API_KEY_PROTOCOL));
  if (credentials.length > 1) return new HttpError('invalid_token', 'several credentials in Sec-WebSocket-Protocol');
  const rest = offered.filter((p) => p !== GATEHOUSE_PROTOCOL && !p.startsWith(`${GATEHOUSE_PROTOCOL}.`));
  if (offered.includes(GATEHOUSE_PROTOCOL)) offeredGatehouse.add(req);
  // The upstream never sees the credential, nor the marker it cannot select.
  if (rest.length > 0) req.headers['sec-websocket-protocol'] = rest.join(', ');
  else delete req.headers['sec-websocket-protocol'];
  const [credential] = credentials;
  if (credential === undefined) return undefined;
  return credential.startsWith(BEARER_PROTOCOL)
    ? setBearer(req, credential.slice(BEARER_PROTOCOL.length), 'Sec-WebSocket-Protocol')
    : setApiKey(req, credential.slice(API_KEY_PROTOCOL.length), 'Sec-WebSocket-Protocol');
}

function fromQuery(req: IncomingMessage, name: string): HttpError | undefined {
  const url = req.url!;
  const queryAt = url.indexOf('?');
  if (queryAt === -1) return undefined;
  const parts = url.slice(queryAt + 1).split('&');
  let found: string | undefined;
  let count = 0;
  const kept: string[] = [];
  for (const part of parts) {
    const equals = part.indexOf('=');
    // Compared decoded: `access%5Ftoken` is the same parameter to the upstream.
    if (decodeQueryComponent(equals === -1 ? part : part.slice(0, equals)) !== name) {
      kept.push(part);
      continue;
    }
    count++;
    found = equals === -1 ? '' : decodeQueryComponent(part.slice(equals + 1));
  }
  if (count === 0) return undefined;
  if (count > 1 || found === undefined || found === '')
    return new HttpError('invalid_request', `query parameter ${name}: given ${count > 1 ? 'several times' : 'empty'}`);
  req.url = kept.length > 0 ? `${url.slice(0, queryAt)}?${kept.join('&')}` : url.slice(0, queryAt);
  return COMPACT_JWS.test(found)
    ? setBearer(req, found, `query parameter ${name}`)
    : setApiKey(req, found, `query parameter ${name}`);
}

/** A query component as servers read it (`+` is a space); undefined-safe for a malformed escape. */
function decodeQueryComponent(text: string): string | undefined {
  try {
    return decodeURIComponent(text.replace(/\+/g, ' '));
  } catch {
    return undefined;
  }
}

// One credential of a kind per request: a second one elsewhere is refused, never chosen between.
function setBearer(req: IncomingMessage, token: string, where: string): HttpError | undefined {
  if (req.headers.authorization !== undefined)
    return new HttpError('invalid_token', `a bearer token both in Authorization and in ${where}`, {
      'www-authenticate': 'Bearer realm="gatehouse", error="invalid_request"',
    });
  req.headers.authorization = `Bearer ${token}`;
  return undefined;
}

function setApiKey(req: IncomingMessage, key: string, where: string): HttpError | undefined {
  if (req.headers['x-api-key'] !== undefined)
    return new HttpError('invalid_api_key', `an API key both in X-API-Key and in ${where}`);
  req.headers['x-api-key'] = key;
  return undefined;
}
