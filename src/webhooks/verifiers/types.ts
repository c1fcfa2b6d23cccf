import type { IncomingHttpHeaders } from 'node:http';

/** A verifier's answer: pass, or fail with a reason for the log (never a secret). */
export type Verdict =
  | { ok: true }
  | {
      ok: false;
      reason: string;
      /** the sender's keys could not be fetched: 503, not the sender's fault */ unavailable?: boolean;
    };

/** A response the sender's own handshake expects, answered directly and never queued. */
export interface DirectAnswer {
  status: number;
  contentType: string;
  body: string;
}

/**
 * How one kind of sender proves a webhook is theirs. The receiver runs `checkHeaders` before
 * reading the body, `verifyBody` on the raw bytes before parsing them, then the rest on the
 * parsed body. Every failure is a 401 for the sender; it counts toward the lockout only on the
 * routes that count failures (`secret` endpoints, device tokens: see receiver.ts `countsFailures`).
 */
export interface WebhookVerifier {
  /** Header-only checks: a header secret, or that the signature headers are there and well-formed. */
  checkHeaders(headers: IncomingHttpHeaders, now: number): Verdict | Promise<Verdict>;
  /** The signature over the exact bytes received. Absent when the headers say it all. */
  verifyBody?(headers: IncomingHttpHeaders, rawBody: Buffer, now: number): Verdict;
  /** The sender's id for this delivery, for deduplication (undefined: none). */
  deliveryId(headers: IncomingHttpHeaders, body: Record<string, unknown>): string | undefined;
  /**
   * For senders that sign no timestamp, whose signed requests stay valid forever: what identifies
   * the signed request itself (a digest of its verified signature), so a replay of it is a
   * duplicate even under a new delivery id. Called only once `verifyBody` has passed.
   */
  replayKey?(headers: IncomingHttpHeaders): string;
  /** The sender's handshake (Slack url_verification, Discord PING): answered, not queued. */
  handshake?(body: Record<string, unknown>): DirectAnswer | undefined;
  /** What the sender must get once its event is stored (or is a repeat), when a 202 is not enough (Discord). */
  acceptedAnswer?(body: Record<string, unknown>): DirectAnswer;
  /** GET on the endpoint (Meta's subscription check): the answer, or why it failed (403). Absent: GET is 405. */
  answerGet?(query: URLSearchParams): { answer: DirectAnswer } | { failed: string };
  /**
   * The `payload` the target receives when it is not the body as sent (Pub/Sub's base64 data).
   * JSON it finds inside the body is parsed only within `maxJsonDepth` levels (as the body was).
   */
  payload?(body: Record<string, unknown>, limits: { maxJsonDepth: number }): Record<string, unknown>;
}

/** Only one header value counts; repeated signature headers are refused rather than guessed at. */
export function headerValue(headers: IncomingHttpHeaders, name: string): string | undefined {
  const value = headers[name];
  return typeof value === 'string' ? value : undefined;
}

/** A sender-supplied id is used for dedupe only when it is a short printable string or a number. */
export function saneId(value: unknown): string | undefined {
  if (typeof value === 'number' && Number.isFinite(value)) return String(value);
  return typeof value === 'string' && /^[\x21-\x7e]{1,256}$/.test(value) ? value : undefined;
}

/** Reads `a.b[0].c`-style paths used by delivery-id extraction; own properties only. */
export function dig(value: unknown, ...path: (string | number)[]): unknown {
  let current = value;
  for (const key of path) {
    if (current === null || typeof current !== 'object' || !Object.hasOwn(current, key)) return undefined;
    current = (current as Record<string | number, unknown>)[key];
  }
  return current;
}

/** Unix seconds within `toleranceSeconds` of now (replay window). */
export function withinTolerance(timestamp: string | undefined, now: number, toleranceSeconds: number): Verdict {
  if (timestamp === undefined || !/^\d{1,12}$/.test(timestamp))
    return { ok: false, reason: 'missing or malformed timestamp' };
  const skew = Math.abs(now / 1000 - Number(timestamp));
  return skew <= toleranceSeconds
    ? { ok: true }
    : { ok: false, reason: `timestamp ${Math.round(skew)}s from now (tolerance ${toleranceSeconds}s)` };
}
