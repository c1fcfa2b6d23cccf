// The console's calls to the admin listener: the session (sign-in, sign-out) and the admin API.
// The session cookie is HttpOnly (this page never sees it); the CSRF token the sign-in returns is
// kept in memory and sent with every change. A reload of the page asks GET /console/session for it.

let csrfToken;

/** A refused call: the HTTP status and the catalogue's code and message. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = 'ApiError';
    this.status = status;
    this.code = code;
  }
}

/** Called when a call is refused for want of a session (expired, signed out elsewhere, token rotated). */
let onSignedOut = () => {};
export function whenSignedOut(listener) {
  onSignedOut = listener;
}

async function call(path, { method = 'GET', body, headers = {} } = {}) {
  const init = { method, headers: { accept: 'application/json', ...headers }, credentials: 'same-origin' };
  if (body !== undefined) {
    init.headers['content-type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  if (method !== 'GET' && csrfToken) init.headers['x-csrf-token'] = csrfToken;
  let reply;
  try {
    reply = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, 'unreachable', `gatehouse did not answer (${err.message})`);
  }
  if (reply.status === 204) return undefined;
  let answer;
  try {
    answer = await reply.json();
  } catch {
    throw new ApiError(reply.status, 'not_json', `HTTP ${reply.status}: not a JSON answer`);
  }
  if (!reply.ok) {
    const error = answer && answer.error ? answer.error : { code: 'unknown', message: `HTTP ${reply.status}` };
    throw new ApiError(reply.status, error.code, error.message);
  }
  return answer;
}

/** Signs in with the admin token; resolves with the session ({csrfToken, expiresAt, idleTimeoutSeconds}). */
export async function signIn(token) {
  const session = await call('/console/session', { method: 'POST', body: { token } });
  csrfToken = session.csrfToken;
  return session;
}

/** The current session, or undefined when there is none (the sign-in form is shown then). */
export async function currentSession() {
  try {
    const session = await call('/console/session');
    csrfToken = session.csrfToken;
    return session;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return undefined;
    throw err;
  }
}

export async function signOut() {
  await call('/console/session', { method: 'DELETE' });
  csrfToken = undefined;
}

/** A call to /admin/api/<path>; a 401 means the session is gone: the sign-in form comes back. */
export async function admin(path, options) {
  try {
    return await call(`/admin/api/${path}`, options);
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) {
      csrfToken = undefined;
      onSignedOut();
    }
    throw err;
  }
}

/** A query string from an object, leaving out empty values: `?status=dead&q=x`. */
export function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) if (value !== undefined && value !== '') search.set(name, value);
  const text = search.toString();
  return text === '' ? '' : `?${text}`;
}
