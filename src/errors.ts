import type { ServerResponse } from 'node:http';

/**
 * The one error catalogue: every error a client can see, by stable code.
 * `message` is the public description; what went wrong in detail goes to the log only.
 */
export const errorCatalogue = {
  not_found: { status: 404, message: 'No such route.' },
  invalid_path: {
    status: 400,
    message: 'The request path is ambiguous or contains characters gatehouse does not forward.',
  },
  invalid_request: {
    status: 400,
    message:
      'The request framing is ambiguous or malformed (a body on GET/HEAD, a transfer coding other than chunked, or Connection naming a framing header).',
  },
  invalid_host: { status: 400, message: 'The Host header must appear once, as host[:port].' },
  request_header_fields_too_large: {
    status: 431,
    message: 'The request has too many header lines, or they are too large.',
  },
  invalid_client_ip: { status: 400, message: 'The client address could not be determined.' },
  ip_not_allowed: { status: 403, message: 'Requests from this address are not allowed.' },
  cors_origin_not_allowed: {
    status: 403,
    message: 'Pages on this origin may not call this API (see the CORS settings).',
  },
  insufficient_scope: { status: 403, message: 'The credentials do not grant access to this path and method.' },
  rate_limited: { status: 429, message: 'Too many requests; slow down and retry after the time given.' },
  too_many_failures: { status: 429, message: 'Too many failed authentication attempts; try again later.' },
  missing_credentials: { status: 401, message: 'Authentication is required.' },
  invalid_api_key: { status: 401, message: 'The API key is not valid.' },
  invalid_token: { status: 401, message: 'The bearer token is not valid.' },
  invalid_client_certificate: { status: 401, message: 'The client certificate is not valid.' },
  auth_unavailable: { status: 503, message: 'Credentials cannot be checked right now; retry later.' },
  upstream_unreachable: { status: 502, message: 'The upstream service could not be reached.' },
  upstream_timeout: { status: 504, message: 'The upstream service did not answer in time.' },
  method_not_allowed: { status: 405, message: 'This method is not allowed here.' },
  invalid_webhook_secret: { status: 401, message: 'The webhook secret is missing or wrong.' },
  invalid_webhook_signature: { status: 401, message: 'The webhook signature is missing, stale or does not match.' },
  invalid_verify_token: { status: 403, message: 'The subscription verify token does not match.' },
  unsupported_media_type: { status: 415, message: 'The body must be JSON (application/json).' },
  payload_too_large: { status: 413, message: 'The body is larger than this endpoint accepts.' },
  invalid_json: { status: 400, message: 'The body must be a JSON object, nested no deeper than this receiver allows.' },
  invalid_idempotency_key: {
    status: 400,
    message:
      'The delivery id header (Idempotency-Key, webhook-id, X-GitHub-Delivery) must be 1-256 printable characters.',
  },
  request_timeout: { status: 408, message: 'The request (its headers or its body) took too long to arrive.' },
  expectation_failed: { status: 417, message: 'The only expectation supported is Expect: 100-continue.' },
  store_unavailable: { status: 503, message: 'The event could not be stored; retry later.' },
  invalid_message: { status: 400, message: 'The body must be {"to": …, "text": …} for an existing recipient.' },
  credentials_unreadable: { status: 500, message: "Stored credentials cannot be opened with this server's key." },
  channel_send_failed: { status: 502, message: 'The platform refused the message or did not answer.' },
  channel_not_connected: { status: 409, message: 'This channel is not logged in.' },
  invalid_oauth_state: { status: 400, message: 'This authorisation response does not belong to a pending login.' },
  pairing_not_found: { status: 404, message: 'No such pairing code.' },
  pairing_gone: { status: 410, message: 'This pairing code was already used or has expired.' },
  integration_unavailable: { status: 503, message: 'The notification could not be processed now; retry later.' },
  invalid_admin_token: {
    status: 401,
    message: 'The admin token is missing or wrong (Authorization: Bearer <admin.token>).',
  },
  admin_api_disabled: { status: 403, message: 'The admin API needs admin.token to be set.' },
  invalid_parameter: {
    status: 400,
    message:
      'A query parameter or body field is unknown, repeated, missing or malformed (see the admin API reference).',
  },
  invalid_cursor: { status: 400, message: 'The cursor is not one this API returned.' },
  event_not_found: { status: 404, message: 'No such event.' },
  lockout_not_found: { status: 404, message: 'This client is not locked out.' },
  lockout_lift_incomplete: {
    status: 503,
    message:
      'The lockout was lifted here but not everywhere it is enforced (the shared store or a gateway worker did not answer); retry.',
  },
  idempotency_key_reused: {
    status: 422,
    message: 'This Idempotency-Key was already used with a different request.',
  },
  csrf_token_invalid: {
    status: 403,
    message: "A change made with the console's session cookie needs the session's X-CSRF-Token header.",
  },
  cross_site_request: { status: 403, message: 'The admin listener refuses requests made by pages of another origin.' },
  upgrade_not_supported: { status: 501, message: 'This gateway does not proxy protocol upgrades (WebSocket) here.' },
  too_many_connections: { status: 503, message: 'Too many open connections; retry later.' },
  internal_error: { status: 500, message: 'Internal error.' },
} as const satisfies Record<string, { status: number; message: string }>;

export type ErrorCode = keyof typeof errorCatalogue;

/**
 * A request failure with a catalogue code. `detail` is for the log, never for the client.
 * Plain object rather than an Error subclass: rejections are a hot path and need no stack.
 */
export class HttpError {
  readonly status: number;
  constructor(
    readonly code: ErrorCode,
    readonly detail?: string,
    readonly headers?: Readonly<Record<string, string>>,
  ) {
    this.status = errorCatalogue[code].status;
  }
}

/** The JSON body for a code, prebuilt once per code. */
const errorBodies = Object.fromEntries(
  Object.entries(errorCatalogue).map(([code, { message }]) => [code, JSON.stringify({ error: { code, message } })]),
) as Record<ErrorCode, string>;

/** Writes `{ error: { code, message } }` with the catalogue status; ends the response. */
export function sendError(res: ServerResponse, error: HttpError): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const body = errorBodies[error.code];
  const headers: Record<string, string | number> = {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    'cache-control': 'no-store',
  };
  if (error.headers) Object.assign(headers, error.headers);
  res.writeHead(error.status, headers);
  res.end(body);
}

/** A problem in the configuration, with one line per issue (`path: reason`). */
export class ConfigError extends Error {
  constructor(readonly problems: readonly string[]) {
    super(problems.join('\n'));
    this.name = 'ConfigError';
  }
}

/** A CLI usage problem the user can fix (bad flag value, missing file). */
export class UsageError extends Error {
  override name = 'UsageError';
}
