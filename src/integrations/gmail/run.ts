import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import type { GmailConfig, VerifyConfig } from '../../config/schema.js';
import { UsageError } from '../../errors.js';
import { gmailGrantContext, openSecret, type SecretKeys } from '../../storage/secrets.js';
import { openGmailStore } from '../../storage/open.js';
import type { EventStore } from '../../webhooks/store.js';
import type { DirectAnswer } from '../../webhooks/verifiers/types.js';
import {
  createGmailClient,
  createOAuthClient,
  explainGoogleError,
  googleEndpoints,
  PubSubRest,
  watchRequest,
  type PulledMessage,
} from './google.js';
import { Mailbox, type MailboxNotification } from './mailbox.js';
import type { GmailStore } from './state.js';

/** The refresh token and the OAuth client's secret, sealed together in storage. */
export interface GmailGrant {
  clientSecret: string;
  refreshToken: string;
  /** The client file's token_uri, when it named one: where the refresh token is redeemed. */
  tokenUri?: string;
}

/** What the webhook receiver serves for Gmail in push mode: a route verified like a pubsub-oidc endpoint. */
export interface GmailPushRoute {
  path: string;
  verify: Extract<VerifyConfig, { type: 'pubsub-oidc' }>;
  /** Resolves with the answer once the emails are committed; throws when Pub/Sub must redeliver. */
  /** `traceContext`: the push's receive span (tracing on), which the emails' events continue. */
  consume(body: Record<string, unknown>, traceContext?: string): Promise<DirectAnswer>;
}

export interface RunningGmail {
  push?: GmailPushRoute;
  /** Stops pulling and renewing; in-flight work finishes first. */
  close(): Promise<void>;
}

const FIRST_RETRY_MS = 30_000;

/**
 * `webhooks.gmail` at run time (inside `gatehouse start`, or `gatehouse webhooks gmail run`):
 * opens the stored grant, keeps the Gmail watch renewed, and turns notifications (pushed to
 * the receiver, or pulled) into events through the Mailbox. Refuses to start without a
 * stored grant or the key that opens it.
 */
export async function startGmail(
  config: GmailConfig,
  deps: { store: EventStore; logger: Logger; onAccepted: () => void; secretKeys: SecretKeys; now?: () => number },
): Promise<RunningGmail> {
  const { account } = config;
  const now = deps.now ?? Date.now;
  const logger = deps.logger.child({ gmail: account });
  const state: GmailStore = openGmailStore(deps.store);
  const stored = await state.get(account);
  if (!stored?.cursor)
    throw new UsageError(
      `webhooks.gmail: ${account} is not set up in this storage: run \`gatehouse webhooks gmail setup --account ${account}\` first`,
    );
  const grant = JSON.parse(openSecret(stored.sealedGrant, deps.secretKeys, gmailGrantContext(account))) as GmailGrant;

  // googleApiUrl, else the token endpoint the grant came from, else Google's own.
  const endpoints = googleEndpoints({ googleApiUrl: config.googleApiUrl, tokenUri: grant.tokenUri });
  const auth = await createOAuthClient(endpoints, { clientId: stored.clientId, clientSecret: grant.clientSecret });
  auth.setCredentials({ refresh_token: grant.refreshToken });
  const gmail = await createGmailClient(endpoints, auth);
  const mailbox = new Mailbox(config, { gmail, state, logger, onAccepted: deps.onAccepted, now });
  const explain = (err: unknown) => explainGoogleError(err, { project: config.project, api: 'Gmail' });

  let stopped = false;
  const stopping = new AbortController();
  const timers = new Set<NodeJS.Timeout>();
  const later = (ms: number, run: () => void) => {
    // A renewal answered after close() must not start a timer: it would keep the process alive.
    if (stopped) return;
    const timer = setTimeout(() => {
      timers.delete(timer);
      if (!stopped) run();
    }, ms);
    timers.add(timer);
  };

  // The watch lasts 7 days; Google asks for a renewal at least daily. A failure is logged at
  // error level every time and retried with a growing delay, never dropped.
  const renewEvery = config.renewMinutes * 60_000;
  let retryMs = FIRST_RETRY_MS;
  async function renewWatch(): Promise<void> {
    try {
      const { data } = await gmail.users.watch({
        userId: 'me',
        requestBody: watchRequest(`projects/${config.project}/topics/${config.topic}`, config.labels),
      });
      await state.recordWatch(account, data.historyId!, Number(data.expiration), now());
      logger.info({ expiration: new Date(Number(data.expiration)).toISOString() }, 'gmail watch renewed');
      retryMs = FIRST_RETRY_MS;
      // Every renewMinutes, and always well before the watch lapses (renewMinutes may exceed its life).
      later(Math.max(60_000, Math.min(renewEvery, (Number(data.expiration) - now()) / 2)), () => void renewWatch());
    } catch (err) {
      if (stopped) return; // shut down meanwhile (the store may be closed): nothing to record or retry
      const problem = `watch renewal failed: ${explain(err)}`;
      logger.error(
        { problem, retryInMs: retryMs },
        'GMAIL WATCH RENEWAL FAILED: notifications stop when the watch expires',
      );
      await state.recordError(account, problem, now()).catch(() => undefined);
      later(retryMs, () => void renewWatch());
      retryMs = Math.min(retryMs * 2, renewEvery);
    }
  }
  const dueIn = stored.watchExpiration === null ? 0 : stored.watchExpiration - renewEvery - now();
  if (dueIn <= 0) void renewWatch();
  else later(Math.min(dueIn, renewEvery), () => void renewWatch());
  logger.info(
    {
      mode: config.mode,
      cursor: stored.cursor,
      watchExpiration: stored.watchExpiration ? new Date(stored.watchExpiration).toISOString() : null,
    },
    'gmail integration running',
  );

  /** Handles one Pub/Sub message; resolves when it may be acknowledged. */
  async function handleMessage(
    data: string | undefined,
    traceContext?: string,
  ): Promise<'handled' | 'other-account' | 'malformed'> {
    const notification = decodeNotification(data);
    if (!notification) {
      logger.warn('gmail notification without a usable {emailAddress, historyId}: acknowledged and dropped');
      return 'malformed';
    }
    if (notification.emailAddress.toLowerCase() !== account.toLowerCase()) return 'other-account';
    try {
      await mailbox.handle({ ...notification, traceContext });
      return 'handled';
    } catch (err) {
      const problem = explain(err);
      await state.recordError(account, problem, now()).catch(() => undefined);
      throw new Error(problem);
    }
  }

  async function pullLoop(): Promise<void> {
    const pubsub = new PubSubRest(auth, endpoints.pubsubRoot, config.project);
    let backoffMs = 1_000;
    while (!stopped) {
      let messages: PulledMessage[];
      try {
        messages = await pubsub.pull(config.subscription, config.pull.maxMessages, stopping.signal);
      } catch (err) {
        if (stopped) return;
        logger.error(
          { problem: explainGoogleError(err, { project: config.project, api: 'Pub/Sub' }), retryInMs: backoffMs },
          'gmail pull failed',
        );
        await sleep(backoffMs, undefined, { signal: stopping.signal }).catch(() => undefined);
        backoffMs = Math.min(backoffMs * 2, 60_000);
        continue;
      }
      backoffMs = 1_000;
      const done: string[] = [];
      for (const { ackId, message } of messages) {
        try {
          await handleMessage(message.data);
          done.push(ackId);
        } catch (err) {
          // Not acknowledged: Pub/Sub redelivers it (and the rest) after the ack deadline.
          logger.error({ problem: (err as Error).message }, 'gmail notification not processed: left for redelivery');
          break;
        }
      }
      if (done.length > 0) {
        await pubsub
          .acknowledge(config.subscription, done)
          .catch((err) =>
            logger.warn(
              { problem: explainGoogleError(err, { project: config.project, api: 'Pub/Sub' }) },
              'gmail acknowledge failed: the notifications come again and change nothing',
            ),
          );
      }
      if (messages.length === 0 || done.length < messages.length)
        await sleep(config.pull.intervalMs, undefined, { signal: stopping.signal }).catch(() => undefined);
    }
  }
  const pulling = config.mode === 'pull' ? pullLoop() : Promise.resolve();

  const push: GmailPushRoute | undefined =
    config.mode === 'push' && config.push
      ? {
          path: config.push.path,
          verify: gmailPushVerifier(config, config.push),
          async consume(body, traceContext) {
            const message = body.message as { data?: unknown } | undefined;
            const data = typeof message?.data === 'string' ? message.data : undefined;
            const outcome = await handleMessage(data, traceContext);
            // Any 2xx acknowledges the push; 204 for what was not for this mailbox (or unusable).
            return outcome === 'handled'
              ? { status: 200, contentType: 'application/json; charset=utf-8', body: '{"status":"processed"}' }
              : { status: 204, contentType: 'application/json; charset=utf-8', body: '' };
          },
        }
      : undefined;

  return {
    push,
    async close() {
      stopped = true;
      stopping.abort();
      for (const timer of timers) clearTimeout(timer);
      await pulling;
      await mailbox.idle();
    },
  };
}

/**
 * How the push route verifies Pub/Sub's OIDC token: for `push.audience`, signed as
 * `push.serviceAccountEmail`, against `push.jwksUri` when configured (always), else the key set
 * under `googleApiUrl`, else Google's.
 */
export function gmailPushVerifier(
  config: Pick<GmailConfig, 'googleApiUrl'>,
  push: NonNullable<GmailConfig['push']>,
): GmailPushRoute['verify'] {
  const jwksUri = push.jwksUri ?? googleEndpoints({ googleApiUrl: config.googleApiUrl }).jwksUri;
  return { type: 'pubsub-oidc', audience: push.audience, serviceAccountEmail: push.serviceAccountEmail, jwksUri };
}

/** Gmail's push data: base64 JSON `{ emailAddress, historyId }`; undefined when it is not that. */
export function decodeNotification(data: string | undefined): MailboxNotification | undefined {
  if (data === undefined) return undefined;
  try {
    const parsed = JSON.parse(Buffer.from(data, 'base64').toString('utf8')) as {
      emailAddress?: unknown;
      historyId?: unknown;
    };
    const historyId = typeof parsed.historyId === 'number' ? String(parsed.historyId) : parsed.historyId;
    if (typeof parsed.emailAddress !== 'string' || typeof historyId !== 'string' || !/^\d{1,20}$/.test(historyId))
      return undefined;
    return { emailAddress: parsed.emailAddress, historyId };
  } catch {
    return undefined;
  }
}
