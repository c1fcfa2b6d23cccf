import { HttpError } from '../errors.js';

/** Failed admin credentials counted per client address in a fixed window; past the limit, 429 until it ends. */
const FAILURES = 10;
const WINDOW_MS = 60_000;
const MAX_ADDRESSES = 1_000;

/**
 * Guessing the admin token, by console sign-in or by `Authorization: Bearer` on /metrics and the
 * admin API, counts in one place: FAILURES wrong tokens within a minute from one address, and every
 * token from it (the right one too) is 429 for the rest of that minute. A success does not reset the
 * count: a Prometheus scraping with the right token from the same address must not give a guesser
 * a fresh budget. Per socket address (the admin listener does not read X-Forwarded-For): everyone
 * behind one proxy shares it.
 */
export class AdminFailureThrottle {
  private readonly failures = new Map<string, { since: number; count: number }>();

  constructor(private readonly now: () => number = Date.now) {}

  /** Throws 429 `too_many_failures` while `address` is over the limit. */
  refuseIfThrottled(address: string): void {
    const entry = this.failures.get(address);
    const at = this.now();
    if (!entry || entry.count < FAILURES || at - entry.since >= WINDOW_MS) return;
    throw new HttpError('too_many_failures', `${FAILURES} wrong admin tokens from ${address}`, {
      'retry-after': String(Math.ceil((entry.since + WINDOW_MS - at) / 1000)),
    });
  }

  recordFailure(address: string): void {
    const at = this.now();
    const entry = this.failures.get(address);
    if (entry && at - entry.since < WINDOW_MS) entry.count++;
    else {
      this.failures.delete(address);
      if (this.failures.size >= MAX_ADDRESSES) this.failures.delete(this.failures.keys().next().value!);
      this.failures.set(address, { since: at, count: 1 });
    }
  }
}
