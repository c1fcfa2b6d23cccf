import { timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { HttpError } from '../../errors.js';
import { readBody } from '../../http/read-body.js';
import { sendJson } from '../json.js';
import type { AdminFailureThrottle } from '../failure-throttle.js';
import { consoleAssets, CONSOLE_SECURITY_HEADERS } from './static.js';
import {
  clearedSessionCookie,
  ConsoleSessions,
  CSRF_HEADER,
  csrfTokenMatches,
  SESSION_ABSOLUTE_MS,
  SESSION_IDLE_MS,
  sessionCookie,
  sessionCookieOf,
  type ConsoleSession,
} from './session.js';

/** A sign-in body is `{"token": "…"}`: small. */
const MAX_SIGN_IN_BYTES = 4096;

export interface ConsoleOptions {
  /** The admin token's SHA-256 digest now (it follows reloads); undefined when admin.token is unset. */
  tokenDigest(): Buffer | undefined;
  digest(text: string): Buffer;
  /** Wrong tokens per address, shared with the Bearer checks of the listener. */
  throttle: AdminFailureThrottle;
  logger: Logger;
  bodyTimeoutMs: number;
  now?: () => number;
}

/**
 * The web console on the admin listener: its files under /console/, and its sign-in.
 * - `POST /console/session` `{"token": <admin.token>}` (JSON; compared in constant time) starts a
 *   session: an `HttpOnly; SameSite=Strict` cookie, and `{csrfToken}` for the page. Wrong: 401,
 *   counted with the listener's wrong Bearer tokens (AdminFailureThrottle: then 429 for a while).
 * - `GET /console/session`: the session's CSRF token and expiry (401 without one).
 * - `DELETE /console/session`: signs out (the session ends on the server, the cookie is cleared).
 * - `sessionOf(req)`: the admin API's second way in (the listener asks it when no Authorization
 *   header came): a live session, and for a POST or DELETE its CSRF token in X-CSRF-Token.
 * Every request that carries or makes a session must come from this origin (Sec-Fetch-Site, else
 * Origin against Host); every /console/ response gets CONSOLE_SECURITY_HEADERS.
 */
export function webConsole(options: ConsoleOptions) {
  const now = options.now ?? Date.now;
  const sessions = new ConsoleSessions(now);
  const serveAsset = consoleAssets();

  function requireToken(): Buffer {
    const digest = options.tokenDigest();
    if (digest === undefined) throw new HttpError('admin_api_disabled', 'admin.token is not set: no console sign-in');
    return digest;
  }

  async function signIn(req: IncomingMessage, res: ServerResponse): Promise<void> {
    requireToken();
    assertSameOrigin(req, false);
    const address = req.socket.remoteAddress ?? 'unknown';
    const { throttle } = options;
    throttle.refuseIfThrottled(address); // before reading the body: a throttled client costs nothing more
    const type = req.headers['content-type'] ?? '';
    if (!/^application\/json\s*(;|$)/i.test(type))
      throw new HttpError('unsupported_media_type', `content-type ${type}`);
    const raw = await readBody(req, res, MAX_SIGN_IN_BYTES, options.bodyTimeoutMs);
    let body: unknown;
    try {
      body = JSON.parse(raw.toString('utf8'));
    } catch {
      throw new HttpError('invalid_json', 'the sign-in body is not JSON');
    }
    const token = (body as { token?: unknown } | null)?.token;
    if (typeof body !== 'object' || Array.isArray(body) || Object.keys(body!).length !== 1 || typeof token !== 'string')
      throw new HttpError('invalid_parameter', 'a sign-in is {"token": "<admin.token>"}');
    // Again, with the comparison in the same turn of the event loop: sign-ins sent side by side
    // all passed the first check while their bodies arrived, and only the throttle's limit are compared.
    throttle.refuseIfThrottled(address);
    // The token now, not when the headers came: a sign-in begun before a rotation (SIGHUP) and
    // finished after it must not start a session for the old token. Compared and made in one turn.
    const expected = requireToken();
    // Digests of equal length: the time taken says nothing about the token or its length.
    if (!timingSafeEqual(options.digest(token), expected)) {
      throttle.recordFailure(address);
      throw new HttpError('invalid_admin_token', 'console sign-in with a wrong token');
    }
    const { id, session } = sessions.create();
    options.logger.info({ session: session.label, ip: address, sessions: sessions.size }, 'console: signed in');
    res.setHeader('set-cookie', sessionCookie(id, secureRequest(req)));
    sendJson(res, 200, sessionAnswer(session));
  }

  /** Idempotent: without a live session it only clears the cookie; with one, it needs the CSRF token. */
  function signOut(req: IncomingMessage, res: ServerResponse): void {
    assertSameOrigin(req, false);
    const id = sessionCookieOf(req.headers.cookie);
    const session = sessions.use(id);
    if (session) {
      assertCsrfToken(req, session);
      sessions.end(id);
      options.logger.info({ session: session.label, ip: req.socket.remoteAddress }, 'console: signed out');
    }
    res.writeHead(204, { 'set-cookie': clearedSessionCookie(secureRequest(req)), 'cache-control': 'no-store' });
    res.end();
  }

  function sessionAnswer(session: ConsoleSession) {
    return {
      csrfToken: session.csrfToken,
      expiresAt: new Date(session.createdAt + SESSION_ABSOLUTE_MS).toISOString(),
      idleTimeoutSeconds: SESSION_IDLE_MS / 1000,
    };
  }

  /**
   * The live session a request's cookie names, checked as the admin API needs: from this origin,
   * and for anything but GET/HEAD with the session's CSRF token. Throws 401 `invalid_admin_token`
   * without one, 403 `cross_site_request` or `csrf_token_invalid`.
   */
  function sessionOf(req: IncomingMessage): ConsoleSession {
    requireToken();
    const safe = req.method === 'GET' || req.method === 'HEAD';
    assertSameOrigin(req, safe);
    const session = sessions.use(sessionCookieOf(req.headers.cookie));
    if (!session) throw new HttpError('invalid_admin_token', 'no console session, or an ended one');
    if (!safe) assertCsrfToken(req, session);
    return session;
  }

  /** Answers a request whose path is /console or starts with /console/. */
  async function handleConsole(req: IncomingMessage, res: ServerResponse, path: string): Promise<void> {
    for (const [name, value] of Object.entries(CONSOLE_SECURITY_HEADERS)) res.setHeader(name, value);
    if (path === '/console') {
      res.writeHead(308, { location: '/console/', 'cache-control': 'no-store' });
      res.end();
      return;
    }
    const name = path.slice('/console/'.length);
    if (name !== 'session') return serveAsset(req, res, name);
    if (req.method === 'POST') return signIn(req, res);
    if (req.method === 'DELETE') return signOut(req, res);
    if (req.method === 'GET') return sendJson(res, 200, sessionAnswer(sessionOf(req)));
    throw new HttpError('method_not_allowed', `${req.method} ${path}`, { allow: 'GET, POST, DELETE' });
  }

  return {
    handleConsole,
    sessionOf,
    /** Whether the request names a console session (live or not): then sessionOf judges it. */
    carriesSession: (req: IncomingMessage) => sessionCookieOf(req.headers.cookie) !== undefined,
    /** The admin token changed or was removed: every session ends. */
    endSessions(why: string): void {
      const ended = sessions.endAll();
      if (ended > 0) options.logger.info({ sessions: ended, why }, 'console: every session ended');
    },
  };
}

/**
 * Refuses a request made by a page of another origin: `Sec-Fetch-Site` when the browser sends it
 * (every current one does), else `Origin` against `Host`. `navigation`: a GET may also come from
 * the address bar (`none`). Requests without either header (curl, scripts) pass: they carry no
 * ambient cookie of a victim's browser.
 */
function assertSameOrigin(req: IncomingMessage, navigation: boolean): void {
  const site = req.headersDistinct['sec-fetch-site'];
  if (site !== undefined) {
    if (site.length === 1 && (site[0] === 'same-origin' || (navigation && site[0] === 'none'))) return;
    throw new HttpError('cross_site_request', `Sec-Fetch-Site: ${site.join(', ').slice(0, 40)}`);
  }
  const origin = req.headers.origin;
  if (origin === undefined) return;
  let host: string | undefined;
  try {
    host = new URL(origin).host;
  } catch {
    host = undefined;
  }
  if (host === undefined || host === '' || host !== req.headers.host)
    throw new HttpError('cross_site_request', `Origin ${origin.slice(0, 100)} is not ${req.headers.host}`);
}

function assertCsrfToken(req: IncomingMessage, session: ConsoleSession): void {
  const given = req.headersDistinct[CSRF_HEADER];
  if (!csrfTokenMatches(session, given?.length === 1 ? given[0] : undefined))
    throw new HttpError('csrf_token_invalid', `${req.method} without the session's ${CSRF_HEADER}`);
}

/**
 * The admin listener serves plain HTTP; behind a TLS proxy the browser's side is HTTPS, which the
 * proxy says in X-Forwarded-Proto. Sent by anyone else it only makes the cookie stricter.
 */
function secureRequest(req: IncomingMessage): boolean {
  return req.headers['x-forwarded-proto'] === 'https';
}
