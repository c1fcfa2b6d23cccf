import type { IncomingMessage } from 'node:http';
import { HttpError } from '../errors.js';

export const API_PREFIX = '/api/';

/*
 * Characters allowed raw in the path: RFC 3986 pchar minus `;` (path parameters are
 * read differently by different servers) and `'` (Node's url.parse would escape it,
 * changing the path on the way up). Everything else must be percent-encoded.
 */
const PATH_CHARS = /^[A-Za-z0-9\-._~!$&()*+,=:@/%]*$/;
/*
 * Encoded characters that change a path's meaning once a server decodes it:
 * `.` (dot segments), `/` and `\` (segment breaks), NUL, `;`, `%` (double decoding),
 * `?` and `#`. Traefik refuses the same set by default.
 */
const AMBIGUOUS_ENCODING = /%(2e|2f|5c|00|3b|25|3f|23)/i;
/*
 * Overlong UTF-8 (`%c0%ae` is `.` to decoders that accept it: old IIS and Tomcat did, and some
 * servlet stacks still can). Never valid UTF-8, so nothing legitimate is refused.
 */
const OVERLONG_UTF8 = /%(c0|c1)|%e0%[89]|%f0%8/i;
/*
 * Encoded control characters (C0 and DEL): no API path holds one, and a line break in a decoded
 * path is read differently by different matchers (a rule's `.` stopped at `%0a`, Express took
 * `/orders/5%0a` as order "5\n", parseInt as 5) and lands in the upstream's logs as a new line.
 */
const ENCODED_CONTROL = /%([01][0-9a-f]|7f)/i;
const MALFORMED_ENCODING = /%(?![0-9a-f]{2})/i;
const DOT_SEGMENT = /\/\.\.?(?:\/|$)/;

/**
 * Decides from the raw request target (never decoded) whether a request may go upstream.
 * Returns undefined when the path is under /api/ and unambiguous, so the upstream sees
 * exactly the path that was authenticated; otherwise the error to send (404 or 400).
 */
export function checkApiPath(req: IncomingMessage): HttpError | undefined {
  const target = req.url ?? '';
  const queryAt = target.indexOf('?');
  const path = queryAt === -1 ? target : target.slice(0, queryAt);
  if (!path.startsWith(API_PREFIX)) return new HttpError('not_found', `path outside ${API_PREFIX}`);
  if (!PATH_CHARS.test(path)) return new HttpError('invalid_path', 'character not allowed in path');
  if (MALFORMED_ENCODING.test(path) || AMBIGUOUS_ENCODING.test(path) || OVERLONG_UTF8.test(path))
    return new HttpError('invalid_path', 'ambiguous percent-encoding');
  if (ENCODED_CONTROL.test(path)) return new HttpError('invalid_path', 'encoded control character');
  // A fragment is never sent (RFC 9112 3.2): a `#` in the target is read differently by different servers.
  if (queryAt !== -1 && target.includes('#', queryAt)) return new HttpError('invalid_path', '"#" in the query');
  if (path.includes('//')) return new HttpError('invalid_path', 'empty path segment');
  // http-proxy's urlJoin turns `http:/` into `http://`: the upstream would see another path.
  if (path.includes('http:/') || path.includes('https:/')) return new HttpError('invalid_path', 'scheme-like segment');
  if (DOT_SEGMENT.test(path)) return new HttpError('invalid_path', 'dot segment');
  return undefined;
}
