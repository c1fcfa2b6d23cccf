import http from 'node:http';
import https from 'node:https';
import { StringDecoder } from 'node:string_decoder';
import { TLSSocket } from 'node:tls';
import type { Logger } from 'pino';
import { webhookActions, type WebhookAction, type WebhooksConfig } from '../../config/schema.js';
import type { Span } from '@opentelemetry/api';
import { countDelivery } from '../../observability/metrics.js';
import { activeTracing } from '../../observability/tracing.js';
import { traceDeliveries } from '../../observability/delivery-spans.js';
import { VERSION } from '../../version.js';
import type { AttemptOutcome, ClaimedEvent, EventStore } from '../../storage/contracts/events.js';
import { afterFailure, parseRetryAfter } from './retry-policy.js';
import { signingKey, signWithKey } from './sign.js';

/** Idle poll: picks up events requeued by the CLI, or due retries, at least this often. */
const POLL_MS = 1_000;
/** A lease outlives the attempt's timeout by this much, so a slow attempt is not claimed twice. */
const LEASE_MARGIN_MS = 5_000;
/** While the store cannot be read, the pump retries this often at most (from POLL_MS, doubling). */
const MAX_STORE_RETRY_MS = 5_000;

/** What each action's target needs per attempt, worked out once per config. */
interface PreparedTarget {
  url: URL;
  client: typeof http | typeof https;
  agent: http.Agent;
  timeoutMs: number;
  signingKey: Buffer | undefined;
}

interface AttemptResult {
  status: number | null;
  error: string | null;
  retryAfterMs?: number;
  responseSnippet?: string | null;
  /** When the request went out on a connected socket (this.now(), performance.now()); unset when no connection was had. */
  sent?: { at: number; mark: number };
}

/** How much of a target's answer body an attempt records (AttemptRecord.responseSnippet). */
export const RESPONSE_SNIPPET_BYTES = 512;

/**
 * How much of an answer body is read (and dropped) past the snippet so the connection can be
 * reused; a longer answer is cut off there and its connection closed, not read to its end.
 */
export const RESPONSE_DRAIN_BYTES = 64 * 1024;

/**
 * The first RESPONSE_SNIPPET_BYTES of an answer body as text: UTF-8, invalid bytes (and NUL) replaced
 * by U+FFFD, a character cut at the end left out; null for an empty body.
 */
export class ResponseSnippet {
  private readonly head = Buffer.alloc(RESPONSE_SNIPPET_BYTES);
  private kept = 0;
  private seen = 0;

  /** Takes a chunk; false once the body has gone past RESPONSE_DRAIN_BYTES (stop reading). */
  add(chunk: Buffer): boolean {
    if (this.kept < RESPONSE_SNIPPET_BYTES) this.kept += chunk.copy(this.head, this.kept, 0);
    this.seen += chunk.length;
    return this.seen <= RESPONSE_DRAIN_BYTES;
  }

  text(): string | null {
    if (this.kept === 0) return null;
    // NUL as U+FFFD too: PostgreSQL's text refuses it, and an attempt that cannot be recorded is never settled.
    return new StringDecoder('utf8').write(this.head.subarray(0, this.kept)).replaceAll('\0', '\uFFFD');
  }
}

/**
 * Delivers stored events to their action's target, at least once: events are leased from the
 * store, posted, and settled (delivered, retried later, or dead) with every attempt recorded.
 * Per-target concurrency is `delivery.concurrency`. No ordering promise.
 */
export class Deliverer {
  private readonly inFlight = new Map<WebhookAction, number>(webhookActions.map((a) => [a, 0]));
  private readonly running = new Set<Promise<void>>();
  private readonly agents: { http: http.Agent; https: https.Agent };
  private timer: NodeJS.Timeout | undefined;
  private pumping = false;
  private pumpAgain = false;
  private pumpScheduled = false;
  private stopped = true;
  /** stop() was called: a start still in progress does not start. */
  private halted = false;
  /** Consecutive pumps that could not read the store (it is down): paused, retrying with backoff. */
  private storeFailures = 0;
  private unsubscribe: (() => void) | undefined;

  private targets = new Map<WebhookAction, PreparedTarget>();
  /** Attempt lines hold ids, statuses and error texts, never a secret: no redaction pass needed. */
  private readonly attemptLog: Logger;
  /** Undefined while tracing is off: then no attempt makes a tracing call. */
  private readonly spans = traceDeliveries(activeTracing());

  constructor(
    private readonly store: EventStore,
    private config: WebhooksConfig,
    private readonly logger: Logger,
    private readonly now: () => number = Date.now,
    /** `httpAgent`: the agent for http: targets (tests: one limited to a socket, so requests queue for it). */
    private readonly options: { leaseMarginMs?: number; httpAgent?: http.Agent } = {},
  ) {
    this.agents = {
      http: options.httpAgent ?? new http.Agent({ keepAlive: true }),
      https: new https.Agent({ keepAlive: true }),
    };
    this.attemptLog = logger.child({}, { redact: [] });
    this.prepareTargets();
  }

  private prepareTargets(): void {
    this.targets = new Map();
    for (const action of webhookActions) {
      const target = this.config.targets[action];
      if (!target) continue;
      const url = new URL(target.url);
      const secure = url.protocol === 'https:';
      this.targets.set(action, {
        url,
        client: secure ? https : http,
        agent: secure ? this.agents.https : this.agents.http,
        timeoutMs: target.timeoutMs ?? this.config.delivery.timeoutMs,
        signingKey: target.secret !== undefined ? signingKey(target.secret) : undefined,
      });
    }
  }

  /** Starts delivering from a clean slate: no lease is held by this deliverer yet. */
  async start(): Promise<void> {
    await this.store.releaseLeases();
    if (this.halted) return; // stopped while the leases were released (a start that waited for the database)
    this.stopped = false;
    // Another instance accepted (or the CLI requeued) on a shared store: look now, not at the next poll.
    this.unsubscribe = this.store.onDue?.(() => this.notify());
    this.notify();
  }

  reconfigure(config: WebhooksConfig): void {
    this.config = config;
    this.prepareTargets();
    this.notify();
  }

  /** Something may be due now (a webhook was accepted). Coalesced: one pump per turn of the event loop. */
  notify(): void {
    if (this.stopped) return;
    if (this.pumping) {
      this.pumpAgain = true;
      return;
    }
    if (this.pumpScheduled) return;
    this.pumpScheduled = true;
    setImmediate(() => {
      this.pumpScheduled = false;
      if (this.pumping) this.pumpAgain = true;
      else if (!this.stopped) void this.pump();
    });
  }

  /** Stops claiming; waits for attempts in flight (they are settled, or their lease lets a restart retry them). */
  async stop(graceMs = 10_000): Promise<void> {
    this.stopped = true;
    this.halted = true;
    this.unsubscribe?.();
    clearTimeout(this.timer);
    const grace = new Promise<void>((resolve) => setTimeout(resolve, graceMs).unref());
    await Promise.race([Promise.allSettled([...this.running]), grace]);
    if (this.running.size > 0)
      this.logger.warn(
        { attempts: this.running.size },
        'delivery attempts still under way after the grace: cut; an outcome not recorded leaves the event to be retried once its lease runs out',
      );
    this.agents.http.destroy();
    this.agents.https.destroy();
  }

  private async pump(): Promise<void> {
    this.pumping = true;
    clearTimeout(this.timer);
    let claimed = 0;
    try {
      do {
        this.pumpAgain = false;
        for (const action of webhookActions) {
          const target = this.config.targets[action];
          if (!target) continue;
          const free = this.config.delivery.concurrency - this.inFlight.get(action)!;
          if (free <= 0) continue;
          const events = await this.store.claimDue(this.now(), free, this.leaseMs(action), action);
          for (const event of events) this.track(this.deliver(event));
          claimed += events.length;
          if (events.length === free) this.pumpAgain = true;
        }
      } while (this.pumpAgain && !this.stopped && this.hasFreeSlot());
      if (this.storeFailures > 0)
        this.logger.info({ after: this.storeFailures }, 'event store reachable again: delivering');
      this.storeFailures = 0;
    } catch (err) {
      // Paused: said once, then retried with backoff until the store answers (no log line per retry).
      if (this.storeFailures++ === 0)
        this.logger.error(
          { err: (err as Error).message },
          'deliverer could not read the event store; paused, retrying',
        );
    } finally {
      this.pumping = false;
    }
    if (this.stopped) return;
    if (this.storeFailures > 0) {
      clearTimeout(this.timer);
      this.timer = setTimeout(
        () => this.notify(),
        Math.min(POLL_MS * 2 ** (this.storeFailures - 1), MAX_STORE_RETRY_MS),
      );
      this.timer.unref();
      return;
    }
    await this.scheduleNext(claimed > 0);
  }

  /** How long a claim lasts: the attempt's timeout and a margin; renewed halfway while the attempt runs. */
  private leaseMs(action: WebhookAction): number {
    const target = this.config.targets[action];
    return (target?.timeoutMs ?? this.config.delivery.timeoutMs) + (this.options.leaseMarginMs ?? LEASE_MARGIN_MS);
  }

  private hasFreeSlot(): boolean {
    return webhookActions.some(
      (a) => this.config.targets[a] && this.inFlight.get(a)! < this.config.delivery.concurrency,
    );
  }

  private async scheduleNext(claimedAny: boolean): Promise<void> {
    let wait = POLL_MS;
    // All slots busy: each finishing attempt calls notify(), so only the idle poll is needed.
    if (!this.hasFreeSlot()) {
      this.timer = setTimeout(() => this.notify(), wait);
      this.timer.unref();
      return;
    }
    try {
      const next = await this.store.nextDueAt(this.now());
      // Something due that this pump could not take (its action's slots are full, or it has no
      // target any more): a finishing attempt or the idle poll wakes us, not a 0 ms loop.
      const dueButNotTaken = next !== undefined && next <= this.now() && !claimedAny;
      if (next !== undefined && !dueButNotTaken) wait = Math.max(0, Math.min(POLL_MS, next - this.now()));
    } catch {
      // the next pump reports store errors
    }
    if (this.stopped) return;
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.notify(), wait);
    this.timer.unref();
  }

  private track(work: Promise<void>): void {
    this.running.add(work);
    void work.finally(() => this.running.delete(work));
  }

  private async deliver(event: ClaimedEvent): Promise<void> {
    const action = event.action;
    this.inFlight.set(action, this.inFlight.get(action)! + 1);
    const stopRenewing = this.renewWhileRunning(event);
    const startedAt = this.now();
    const started = performance.now();
    const span = this.spans?.start({
      traceContext: event.traceContext,
      eventId: event.id,
      action,
      attempt: event.attempts + 1,
      target: this.targets.get(action)!.url,
    });
    let result: AttemptResult;
    try {
      result = await this.post(event, span);
    } catch (err) {
      result = { status: null, error: (err as Error).message };
    }
    // The target's time: from the request sent to its answer (a wait for a connection is ours, not the target's).
    const durationMs = performance.now() - (result.sent?.mark ?? started);
    const delivered = result.status !== null && result.status >= 200 && result.status < 300;
    const outcome: AttemptOutcome = delivered
      ? { status: 'delivered' }
      : afterFailure(event, result, this.now(), this.config.delivery);
    if (span) this.spans!.end(span, { status: result.status, error: result.error, outcome: outcome.status });

    try {
      const recorded = await this.store.recordAttempt(
        event.id,
        {
          attempt: event.attempts + 1,
          at: result.sent?.at ?? startedAt,
          status: result.status,
          error: result.error,
          durationMs,
          responseSnippet: result.responseSnippet ?? null,
        },
        outcome,
        event.claimId,
      );
      // Fenced off: the lease ran out and another claim (maybe another instance) owns the event now.
      if (!recorded)
        this.logger.warn(
          { id: event.id, outcome: outcome.status },
          'lease lost before the attempt was recorded: its outcome is left to the new holder',
        );
      else countDelivery(action, outcome.status);
    } catch (err) {
      // Not settled: the lease runs out and the event is tried again (at least once, never lost).
      this.logger.error({ err: (err as Error).message, id: event.id }, 'could not record a delivery attempt');
    } finally {
      stopRenewing();
    }
    const log = {
      id: event.id,
      action,
      attempt: event.attempts + 1,
      status: result.status,
      error: result.error ?? undefined,
      ms: Math.round(durationMs),
      outcome: outcome.status,
    };
    // Every attempt is in the store (deliveries show); the log keeps what needs a human: failures.
    if (outcome.status === 'dead') this.attemptLog.warn(log, 'delivery failed for good (dead)');
    else if (outcome.status === 'queued') this.attemptLog.info(log, 'delivery attempt failed; will retry');
    else this.attemptLog.debug(log, 'delivered');
    this.inFlight.set(action, this.inFlight.get(action)! - 1);
    this.notify();
  }

  /**
   * Keeps a long attempt's lease (Convoy's heartbeat): renewed at half of what is left of it when
   * the attempt starts (an event may come with part of its lease spent), then every half lease,
   * while the attempt and its recording run, under the claim's token, so a renewal never revives a
   * lease another claim has taken. Returns the stop.
   */
  private renewWhileRunning(event: ClaimedEvent): () => void {
    const leaseMs = this.leaseMs(event.action);
    let timer: NodeJS.Timeout | undefined;
    let stopped = false;
    const renew = () => {
      this.store.renewLease(event.id, event.claimId, this.now() + this.leaseMs(event.action)).then(
        (held) => {
          if (held) return;
          stopped = true;
          clearTimeout(timer);
          this.logger.warn({ id: event.id }, 'lease lost during a delivery attempt: another claim owns the event now');
        },
        (err: Error) => this.logger.warn({ id: event.id, err: err.message }, 'could not renew a delivery lease'),
      );
      schedule(leaseMs / 2);
    };
    const schedule = (ms: number) => {
      if (stopped) return;
      timer = setTimeout(renew, Math.max(ms, 10));
      timer.unref();
    };
    schedule(Math.min(event.leaseUntil - this.now(), leaseMs) / 2);
    return () => {
      stopped = true;
      clearTimeout(timer);
    };
  }

  private post(event: ClaimedEvent, span?: Span): Promise<AttemptResult> {
    const { url, client, agent, timeoutMs, signingKey: key } = this.targets.get(event.action)!;
    const headers: Record<string, string | number> = {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(event.envelope),
      'idempotency-key': event.id,
      'x-gatehouse-action': event.action,
      'user-agent': `gatehouse/${VERSION}`,
    };
    if (span) Object.assign(headers, this.spans!.headersFor(span));
    if (key !== undefined) {
      const timestamp = Math.floor(this.now() / 1000);
      headers['webhook-id'] = event.id;
      headers['webhook-timestamp'] = String(timestamp);
      headers['webhook-signature'] = signWithKey(key, event.id, timestamp, event.envelope);
    }
    return new Promise((resolve) => {
      let sent: AttemptResult['sent'];
      const req = client.request(url, { method: 'POST', headers, agent, timeout: timeoutMs }, (res) => {
        const snippet = new ResponseSnippet();
        const answered = () =>
          resolve({
            status: res.statusCode ?? null,
            error: null,
            retryAfterMs: parseRetryAfter(res.headers['retry-after'], this.now()),
            responseSnippet: snippet.text(),
            sent,
          });
        res.on('data', (chunk: Buffer) => {
          if (snippet.add(chunk)) return;
          // Past RESPONSE_DRAIN_BYTES: the answer is settled with what came; the connection, which
          // a reuse would first have to drain, is closed instead (the agent opens a fresh one).
          answered();
          res.destroy();
        });
        res.on('end', answered);
        res.on('error', (err) => resolve({ status: null, error: err.message, sent }));
      });
      // Two bounds, one after the other. Waiting for a connection (a socket from the agent, the
      // lookup, the TCP and TLS handshakes) is this process's time, not the target's: on a busy
      // machine it passed timeoutMs while the target then answered in 100 ms. It gets timeoutMs of
      // its own and counts as a connect failure; the answer's timeoutMs starts once the request is
      // sent on a connected socket. The lease is renewed throughout (renewWhileRunning).
      let deadline = setTimeout(
        () => req.destroy(new Error(`connect timeout: no connection within ${timeoutMs} ms`)),
        timeoutMs,
      );
      const onConnected = () => {
        clearTimeout(deadline);
        sent = { at: this.now(), mark: performance.now() };
        // `timeout` below is per idle socket; a target trickling its answer must not outlive the lease either.
        deadline = setTimeout(
          () => req.destroy(new Error(`timeout: no complete answer within ${timeoutMs} ms`)),
          timeoutMs,
        );
      };
      req.once('socket', (socket) => {
        if (!socket.connecting)
          onConnected(); // a kept-alive connection, ready
        else socket.once(socket instanceof TLSSocket ? 'secureConnect' : 'connect', onConnected);
      });
      req.on('timeout', () =>
        req.destroy(
          new Error(sent ? `timeout after ${timeoutMs} ms` : `connect timeout: no connection within ${timeoutMs} ms`),
        ),
      );
      req.on('close', () => clearTimeout(deadline));
      req.on('error', (err: NodeJS.ErrnoException) =>
        resolve({ status: null, error: err.code ? `${err.code}: ${err.message}` : err.message, sent }),
      );
      req.end(event.envelope);
    });
  }
}
