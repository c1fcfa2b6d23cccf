import type { AttemptOutcome, StoredEvent } from '../../storage/contracts/events.js';

/**
 * Capped exponential backoff with full jitter: a random delay in [0, min(initial·2^(n-1), max)].
 * A target's Retry-After is the least the next attempt waits (RFC 9110 §10.2.3: how long to wait
 * before a follow-up), capped at max: it lengthens the wait, never shortens it. Taken as the
 * delay itself, `Retry-After: 0` (or a past date) was a hot loop, thousands of attempts a second,
 * and a short one kept every attempt of 72 h that short: a stored row each.
 */
export function retryDelayMs(
  attempt: number,
  settings: { initialBackoffMs: number; maxBackoffMs: number },
  retryAfterMs?: number,
  random: () => number = Math.random,
): number {
  const cap = Math.min(settings.initialBackoffMs * 2 ** Math.min(attempt - 1, 52), settings.maxBackoffMs);
  if (retryAfterMs !== undefined && retryAfterMs >= cap) return Math.min(retryAfterMs, settings.maxBackoffMs); // past any draw: as asked, no jitter
  const drawn = Math.floor(random() * cap);
  return retryAfterMs === undefined ? drawn : Math.max(drawn, retryAfterMs);
}

/** What bounds an event's retries: a time budget from acceptance, the backoff, and an optional attempt cap. */
export interface RetryPolicy {
  retryFor: number;
  maxAttempts?: number;
  initialBackoffMs: number;
  maxBackoffMs: number;
}

/**
 * The outcome of a failed attempt: queued for the next one (backoff, or the target's Retry-After),
 * or dead when the failure is final (a 4xx), the attempt cap is reached, or the budget is spent (an
 * attempt at or after the deadline failed; the last retry is moved to the deadline itself). The budget runs from acceptance; a round started by `deliveries retry`
 * (attempts > roundAttempts; its start is not stored) gets the attempts an average round fits in
 * `retryFor`, so a requeued old event is retried again rather than dying at once.
 */
export function afterFailure(
  event: Pick<StoredEvent, 'receivedAt' | 'attempts' | 'roundAttempts'>,
  result: { status: number | null; retryAfterMs?: number },
  now: number,
  policy: RetryPolicy,
  random: () => number = Math.random,
): AttemptOutcome {
  const roundAttempt = event.roundAttempts + 1;
  if (!isRetryable(result.status)) return { status: 'dead' };
  if (policy.maxAttempts !== undefined && roundAttempt >= policy.maxAttempts) return { status: 'dead' };
  const nextAttemptAt = now + retryDelayMs(roundAttempt, policy, result.retryAfterMs, random);
  const requeued = event.attempts > event.roundAttempts;
  if (requeued)
    return roundAttempt >= attemptsInBudget(policy) ? { status: 'dead' } : { status: 'queued', nextAttemptAt };
  // The budget's end is always tried: a backoff drawn past it is cut to the deadline (else an event
  // could die up to maxBackoffMs before retryFor is over, and a target back in time would miss it).
  const deadline = event.receivedAt + policy.retryFor;
  if (now >= deadline) return { status: 'dead' };
  return { status: 'queued', nextAttemptAt: Math.min(nextAttemptAt, deadline) };
}

/** How many attempts a round of average (half-cap, full jitter) delays fits in `retryFor`. */
export function attemptsInBudget(policy: RetryPolicy): number {
  let elapsed = 0;
  let attempts = 1;
  while (attempts < 100_000) {
    const mean = Math.min(policy.initialBackoffMs * 2 ** Math.min(attempts - 1, 52), policy.maxBackoffMs) / 2;
    if (elapsed + mean > policy.retryFor) break;
    elapsed += mean;
    attempts++;
  }
  return attempts;
}

/** `Retry-After`: delta-seconds or an HTTP date; undefined when absent or unreadable. */
export function parseRetryAfter(value: string | undefined, now: number): number | undefined {
  if (value === undefined) return undefined;
  if (/^\d+$/.test(value.trim())) return Number(value.trim()) * 1000;
  // Every HTTP-date form starts with a day name; Date.parse alone would read "1.5" or "-1" as a (past) date.
  if (!/^(Mon|Tue|Wed|Thu|Fri|Sat|Sun)/.test(value.trim())) return undefined;
  const date = Date.parse(value);
  return Number.isNaN(date) ? undefined : Math.max(0, date - now);
}

/** 408, 429, 5xx and no answer at all are worth retrying; any other 4xx will not get better. */
export function isRetryable(status: number | null): boolean {
  return status === null || status === 408 || status === 429 || status >= 500;
}
