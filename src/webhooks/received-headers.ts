import type { IncomingHttpHeaders } from 'node:http';

/** What a credential's or a signature's value is stored as. */
export const REDACTED = '[redacted]';

/** The stored JSON's cap, in characters (header values are Latin-1 in Node: at most twice as many UTF-8 bytes). */
export const MAX_HEADERS_JSON = 8 * 1024;

/** A value longer than this is cut to it (a cookie jar, a JWT in a header not named as one): the cap holds more headers. */
export const MAX_HEADER_VALUE = 1024;

/** The key that says what the cap left out: brackets are not token characters, so no header is named that. */
export const CUT_KEY = '[cut]';

/**
 * The headers whose values are kept: HTTP's own, tracing, and the event and delivery headers of the
 * senders gatehouse verifies (GitHub, GitLab, Bitbucket, Standard Webhooks and Svix, Slack, Shopify,
 * Meta, Pub/Sub). Every other value is stored as REDACTED, its name kept: a sender's own credential
 * can have any name (`Ocp-Apim-Subscription-Key`, `Verif-Hash`, `X-Partner-Key`, an edge's
 * `Cf-Access-Jwt-Assertion`), so a list of names to hide always misses some (an outside attack found
 * a dozen); a list of names to show only ever hides a little too much.
 */
export const SHOWN_HEADERS: ReadonlySet<string> = new Set([
  // HTTP and proxies
  'host',
  'content-type',
  'content-length',
  'content-encoding',
  'transfer-encoding',
  'connection',
  'accept',
  'accept-encoding',
  'accept-language',
  'accept-charset',
  'user-agent',
  'date',
  'expect',
  'cache-control',
  'pragma',
  'via',
  'forwarded',
  'x-forwarded-for',
  'x-forwarded-proto',
  'x-forwarded-host',
  'x-forwarded-port',
  'x-real-ip',
  'x-request-id',
  'x-correlation-id',
  'traceparent',
  'tracestate',
  'idempotency-key',
  // GitHub
  'x-github-event',
  'x-github-delivery',
  'x-github-hook-id',
  'x-github-hook-installation-target-id',
  'x-github-hook-installation-target-type',
  // GitLab
  'x-gitlab-event',
  'x-gitlab-event-uuid',
  'x-gitlab-webhook-uuid',
  'x-gitlab-instance',
  // Bitbucket
  'x-event-key',
  'x-hook-uuid',
  'x-request-uuid',
  'x-attempt-number',
  // Standard Webhooks, Svix
  'webhook-id',
  'webhook-timestamp',
  'svix-id',
  'svix-timestamp',
  // Slack
  'x-slack-request-timestamp',
  'x-slack-retry-num',
  'x-slack-retry-reason',
  // Shopify
  'x-shopify-topic',
  'x-shopify-shop-domain',
  'x-shopify-webhook-id',
  'x-shopify-event-id',
  'x-shopify-api-version',
  'x-shopify-triggered-at',
  // Google push notifications
  'x-goog-resource-state',
  'x-goog-message-number',
]);

/**
 * The request's headers as the event store keeps them for the operator (GET /admin/api/events/<id>):
 * a JSON object of the names and values Node gives (lower-case names; repeats joined), every value
 * but those of SHOWN_HEADERS replaced by REDACTED. Values over MAX_HEADER_VALUE are cut
 * (ending in `…`); headers that would take the JSON past MAX_HEADERS_JSON are left out, and
 * `"[cut]": "<n> headers left out"` says how many. Measured: 4–5 µs of CPU for GitHub's 15 headers
 * (building the text by hand instead of JSON.stringify saved under 1 µs: not worth its escaping).
 */
export function recordedHeaders(headers: IncomingHttpHeaders): string {
  const kept: Record<string, string | string[]> = {};
  let long = false;
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined) continue;
    if (!SHOWN_HEADERS.has(name)) kept[name] = REDACTED;
    else {
      kept[name] = value;
      if (value.length > MAX_HEADER_VALUE || (typeof value !== 'string' && value.join('').length > MAX_HEADER_VALUE))
        long = true;
    }
  }
  const json = JSON.stringify(kept);
  return json.length <= MAX_HEADERS_JSON && !long ? json : capped(headers);
}

/** The rare slow path: long values cut, then headers kept in order while the JSON fits. */
function capped(headers: IncomingHttpHeaders): string {
  const kept: Record<string, string | string[]> = {};
  // Room for the braces and the `"[cut]":"<n> headers left out"` entry.
  let size = 2 + 48;
  let left = 0;
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined) continue;
    const cut = !SHOWN_HEADERS.has(name) ? REDACTED : typeof value === 'string' ? cutValue(value) : value.map(cutValue);
    const entry = JSON.stringify(name).length + JSON.stringify(cut).length + 2;
    if (size + entry > MAX_HEADERS_JSON) {
      left++;
      continue;
    }
    kept[name] = cut;
    size += entry;
  }
  if (left > 0) kept[CUT_KEY] = `${left} header${left === 1 ? '' : 's'} left out`;
  return JSON.stringify(kept);
}

function cutValue(value: string): string {
  return value.length > MAX_HEADER_VALUE ? `${value.slice(0, MAX_HEADER_VALUE)}…` : value;
}
