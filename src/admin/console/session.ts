import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { CONSOLE_SESSION_COOKIE } from '../../http/console-cookie.js';

/** The session cookie's name. Not `__Host-`: that prefix needs `Secure`, which plain HTTP cannot set. */
export const SESSION_COOKIE = CONSOLE_SESSION_COOKIE;
/** The header a cookie-authenticated change must carry, with the session's CSRF token. */
export const CSRF_HEADER = 'x-csrf-token';
/** A session unused this long ends (every authenticated request, auto-refresh included, uses it). */
export const SESSION_IDLE_MS = 2 * 60 * 60 * 1000;
/** A session ends this long after sign-in, however busy: the cookie's Max-Age too. */
export const SESSION_ABSOLUTE_MS = 12 * 60 * 60 * 1000;
/** Sessions kept at most; a sign-in past it ends the least recently used one. Only token holders make them. */
const MAX_SESSIONS = 100;
/** What a session id and a CSRF token look like: 32 random bytes, base64url. */
const TOKEN_SHAPE = /^[A-Za-z0-9_-]{43}$/;

export interface ConsoleSession {
  /** The first characters of the id's digest: names the session in logs without being usable. */
  label: string;
  csrfToken: string;
  createdAt: number;
  lastUsedAt: number;
}

/**
 * The console's sign-ins, in this process's memory: an id (the cookie) maps to a session with its
 * own CSRF token. Ids are looked up by their SHA-256 digest, so neither the map's key comparison nor
 * a heap dump gives a usable id. A session ends when idle for SESSION_IDLE_MS, SESSION_ABSOLUTE_MS
 * after sign-in, at sign-out, or when every session is ended (the admin token changed). A restart
 * ends them all.
 */
export class ConsoleSessions {
  /** By id digest, least recently used first (a use moves the entry to the end). */
  private readonly sessions = new Map<string, ConsoleSession>();

  constructor(private readonly now: () => number = Date.now) {}

  /** Starts a session; returns the cookie value (the id) and the session. */
  create(): { id: string; session: ConsoleSession } {
    this.sweep();
    while (this.sessions.size >= MAX_SESSIONS) this.sessions.delete(this.sessions.keys().next().value!);
    const id = randomBytes(32).toString('base64url');
    const key = digestOf(id);
    const at = this.now();
    const session = {
      label: key.slice(0, 8),
      csrfToken: randomBytes(32).toString('base64url'),
      createdAt: at,
      lastUsedAt: at,
    };
    this.sessions.set(key, session);
    return { id, session };
  }

  /** The live session of a cookie value, marked as used now; undefined when unknown or expired. */
  use(id: string | undefined): ConsoleSession | undefined {
    if (id === undefined || !TOKEN_SHAPE.test(id)) return undefined;
    const key = digestOf(id);
    const session = this.sessions.get(key);
    if (!session) return undefined;
    const at = this.now();
    this.sessions.delete(key);
    if (expired(session, at)) return undefined;
    session.lastUsedAt = at;
    this.sessions.set(key, session);
    return session;
  }

  /** Ends the session of a cookie value (sign-out); true when there was one. */
  end(id: string | undefined): boolean {
    return id !== undefined && TOKEN_SHAPE.test(id) && this.sessions.delete(digestOf(id));
  }

  /** Ends every session (the admin token changed or was removed); returns how many there were. */
  endAll(): number {
    const count = this.sessions.size;
    this.sessions.clear();
    return count;
  }

  get size(): number {
    return this.sessions.size;
  }

  /** Drops expired sessions: run at each sign-in (at most MAX_SESSIONS to look at). */
  private sweep(): void {
    const at = this.now();
    for (const [key, session] of this.sessions) if (expired(session, at)) this.sessions.delete(key);
  }
}

function expired(session: ConsoleSession, at: number): boolean {
  return at - session.lastUsedAt >= SESSION_IDLE_MS || at - session.createdAt >= SESSION_ABSOLUTE_MS;
}

function digestOf(text: string): string {
  return createHash('sha256').update(text).digest('base64url');
}

/** Whether `given` is the session's CSRF token, in time that does not depend on where they differ. */
export function csrfTokenMatches(session: ConsoleSession, given: string | undefined): boolean {
  if (given === undefined || !TOKEN_SHAPE.test(given)) return false;
  return timingSafeEqual(Buffer.from(given), Buffer.from(session.csrfToken));
}

/** The value of the session cookie in a request's Cookie header(s), when there is exactly one. */
export function sessionCookieOf(cookieHeader: string | undefined): string | undefined {
  if (cookieHeader === undefined) return undefined;
  let found: string | undefined;
  for (const part of cookieHeader.split(';')) {
    const eq = part.indexOf('=');
    if (eq === -1 || part.slice(0, eq).trim() !== SESSION_COOKIE) continue;
    if (found !== undefined) return undefined; // two: one was planted (a sibling subdomain, a path); trust neither
    found = part.slice(eq + 1).trim();
  }
  return found;
}

/** The Set-Cookie value that starts a session (`secure`: the browser reached us over HTTPS). */
export function sessionCookie(id: string, secure: boolean): string {
  return cookie(id, Math.floor(SESSION_ABSOLUTE_MS / 1000), secure);
}

/** The Set-Cookie value that makes the browser forget the session. */
export function clearedSessionCookie(secure: boolean): string {
  return cookie('', 0, secure);
}

function cookie(value: string, maxAge: number, secure: boolean): string {
  return `${SESSION_COOKIE}=${value}; Path=/; Max-Age=${maxAge}; HttpOnly; SameSite=Strict${secure ? '; Secure' : ''}`;
}
