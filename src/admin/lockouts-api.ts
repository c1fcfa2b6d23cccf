import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import { HttpError } from '../errors.js';
import { clientGroupOf, LOCKOUT_AREAS, lockoutKey, parseLockoutKey } from '../http/lockout.js';
import { limitParameter, queryParameters, requireMethod, sendJson } from './json.js';
import type { LockoutControl } from './sources.js';

const DEFAULT_LIMIT = 200;
const MAX_LIMIT = 1_000;

/** One lockout as the API shows it. */
export interface LockoutView {
  /** An IPv4 address, or an IPv6 /64 (`2001:db8:0:0::/64`): the unit the lockout counts. */
  client: string;
  /** Which listener's failures locked it: `gateway` (/api/) or `webhooks` (the receiver's endpoints). */
  area: string;
  until: string;
}

function viewOf([key, until]: [string, number]): LockoutView {
  const { client, area } = parseLockoutKey(key);
  return { client, area, until: new Date(until).toISOString() };
}

/**
 * The `limit` locks that end last, latest first, without sorting them all: a spray of addresses can
 * leave a million locks, and this runs on the process that also receives webhooks. The ends alone
 * sort natively (a typed array), and only the locks past the limit's end are sorted as pairs.
 */
function latestFirst(locks: [string, number][], limit: number): [string, number][] {
  let kept = locks;
  if (locks.length > limit) {
    const ends = Float64Array.from(locks, ([, until]) => until).sort();
    const last = ends[ends.length - limit]!;
    kept = locks.filter(([, until]) => until >= last);
  }
  return kept.sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1)).slice(0, limit);
}

/**
 * The admin API's lockout routes, under /admin/api/ (the listener authenticates first):
 * `GET lockouts` lists the clients locked out, latest end first (`limit`, and `total`);
 * `DELETE lockouts/<client>` lifts a client's lockouts in both areas, wherever this instance
 * enforces them and, on PostgreSQL, on every instance (see LockoutControl.lift). Lifts are
 * logged at info with who (`admin token`, or the console session: the token has no id yet) and what.
 */
export function lockoutsApi(options: {
  lockouts: LockoutControl;
  logger: Logger;
  who: (req: IncomingMessage) => string;
  now?: () => number;
}) {
  const now = options.now ?? Date.now;

  async function list(res: ServerResponse, url: URL): Promise<void> {
    const limit = limitParameter(queryParameters(url, ['limit']).get('limit'), DEFAULT_LIMIT, MAX_LIMIT);
    const locks = await options.lockouts.list(now());
    sendJson(res, 200, { lockouts: latestFirst(locks, limit).map(viewOf), total: locks.length });
  }

  async function lift(res: ServerResponse, url: URL, named: string, who: string): Promise<void> {
    queryParameters(url, []);
    let text: string;
    try {
      text = decodeURIComponent(named); // an IPv6 /64 comes as 2001%3Adb8%3A0%3A0%3A%3A%2F64
    } catch {
      throw new HttpError('invalid_parameter', 'client: not URL-encoded');
    }
    const client = clientGroupOf(text);
    if (client === undefined)
      throw new HttpError(
        'invalid_parameter',
        `client: an IP address, or an IPv6 /64 as listed (${text.slice(0, 100)})`,
      );
    const keys = LOCKOUT_AREAS.map((area) => lockoutKey(area, client));
    const { locks, incomplete } = await options.lockouts.lift(keys, now());
    const lifted = locks.map(viewOf);
    if (incomplete !== undefined) {
      options.logger.warn({ who, client, lifted, incomplete }, 'admin: lockout lifted, not everywhere');
      throw new HttpError('lockout_lift_incomplete', incomplete, { 'retry-after': '5' });
    }
    if (lifted.length === 0) {
      // Its failures counted so far are forgotten all the same (the lift clears counts too).
      options.logger.info({ who, client }, 'admin: lockout lift: the client was not locked out');
      throw new HttpError('lockout_not_found', `client ${client}`);
    }
    options.logger.info({ who, client, lifted }, 'admin: lockout lifted');
    sendJson(res, 200, { lifted });
  }

  /** Answers a request whose path is lockouts or lockouts/<client> (already authenticated). */
  return async function handleLockoutsApi(req: IncomingMessage, res: ServerResponse, url: URL): Promise<void> {
    const rest = url.pathname.slice('/admin/api/'.length);
    if (rest === 'lockouts') {
      requireMethod(req, url, 'GET');
      return list(res, url);
    }
    if (rest.startsWith('lockouts/') && rest.length > 'lockouts/'.length) {
      requireMethod(req, url, 'DELETE');
      return lift(res, url, rest.slice('lockouts/'.length), options.who(req));
    }
    throw new HttpError('not_found', `no admin route ${url.pathname}`);
  };
}
