import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { UsageError } from '../errors.js';

/** How long a login waits for the browser to come back. */
const CONSENT_TIMEOUT_MS = 5 * 60_000;

export interface AuthorizationRequest {
  redirectUri: string;
  state: string;
  /** PKCE (RFC 7636, S256). */
  codeChallenge: string;
}

export interface AuthorizationResponse {
  code: string;
  redirectUri: string;
  codeVerifier: string;
  /** Everything the platform added to the redirect (Discord's guild_id, Slack's nothing). */
  params: URLSearchParams;
}

/**
 * The authorization-code leg of an installed app (RFC 8252): a listener on 127.0.0.1 and a
 * random port is the redirect URI, `state` is checked before the code is taken, and a PKCE
 * verifier is made for the token exchange. `authorizeUrl` builds the platform's consent URL,
 * `showUrl` shows it to the user. Used by Gmail setup and channel logins.
 */
/** Constant-time equality of two strings (compared as SHA-256 digests, so lengths do not leak either). */
function sameSecret(a: string, b: string): boolean {
  const digest = (s: string) => createHash('sha256').update(s, 'utf8').digest();
  return timingSafeEqual(digest(a), digest(b));
}

/** A fresh `state` and PKCE pair (RFC 7636, S256). */
export function newAuthorizationSecrets(): { state: string; codeVerifier: string; codeChallenge: string } {
  const codeVerifier = randomBytes(32).toString('base64url');
  return {
    state: randomBytes(16).toString('base64url'),
    codeVerifier,
    codeChallenge: createHash('sha256').update(codeVerifier).digest('base64url'),
  };
}

/** The platform's `error=` answer as the user should read it. */
export function consentRefused(platform: string | undefined, params: URLSearchParams): UsageError {
  const description = params.get('error_description');
  return new UsageError(
    `${platform ?? 'the platform'} answered "${params.get('error')}"${description ? ` (${description})` : ''}: the consent was not given. Run it again and approve the requested access.`,
  );
}

export async function receiveAuthorizationCode(options: {
  authorizeUrl: (request: AuthorizationRequest) => string;
  showUrl: (url: string) => void;
  timeoutMs?: number;
  /** Who answers, in error messages (default "the platform"). */
  platform?: string;
  /** A fixed loopback port, for platforms that match redirect URIs exactly (default: any free port). */
  port?: number;
}): Promise<AuthorizationResponse> {
  const { state, codeVerifier, codeChallenge } = newAuthorizationSecrets();
  let settle!: { resolve: (params: URLSearchParams) => void; reject: (err: Error) => void };
  const arrived = new Promise<URLSearchParams>((resolve, reject) => (settle = { resolve, reject }));

  // A short-lived loopback listener for one browser redirect: small, explicit parser limits too.
  const server = http.createServer(
    { maxHeaderSize: 16_384, headersTimeout: 10_000, requestTimeout: 30_000, keepAliveTimeout: 1_000 },
    (req, res) => {
      const url = new URL(req.url ?? '/', 'http://127.0.0.1');
      const page = (status: number, text: string) => {
        res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' });
        res.end(`${text}\n`);
      };
      if (url.pathname !== '/') return page(404, 'not found');
      // Without our state it is not the answer to our request (another tab, a forged link): ignored.
      if (!sameSecret(url.searchParams.get('state') ?? '', state))
        return page(400, 'gatehouse: this response does not belong to the running login (state mismatch).');
      const error = url.searchParams.get('error');
      if (error) {
        page(200, `gatehouse: authorisation refused (${error}). You can close this tab.`);
        return settle.reject(consentRefused(options.platform, url.searchParams));
      }
      if (!url.searchParams.get('code')) return page(400, 'gatehouse: no authorisation code in this response.');
      page(200, 'gatehouse: authorised. You can close this tab and return to the terminal.');
      settle.resolve(url.searchParams);
    },
  );
  server.maxHeadersCount = 100;
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) =>
      reject(
        new UsageError(`cannot listen on 127.0.0.1:${options.port ?? 0} for the redirect (${err.code ?? err.message})`),
      ),
    );
    server.listen(options.port ?? 0, '127.0.0.1', resolve);
  });
  const redirectUri = `http://127.0.0.1:${(server.address() as AddressInfo).port}/`;
  const timeoutMs = options.timeoutMs ?? CONSENT_TIMEOUT_MS;
  const timer = setTimeout(
    () => settle.reject(new UsageError(`no answer from the browser within ${Math.round(timeoutMs / 60_000)} minutes`)),
    timeoutMs,
  );
  try {
    options.showUrl(options.authorizeUrl({ redirectUri, state, codeChallenge }));
    const params = await arrived;
    return { code: params.get('code')!, redirectUri, codeVerifier, params };
  } finally {
    clearTimeout(timer);
    server.closeAllConnections();
    server.close();
  }
}
