import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { ChannelConfig, Config } from '../../config/schema.js';
import { HttpError } from '../../errors.js';
import {
  channelGrantContext,
  oauthAnswerContext,
  openSecret,
  sealSecret,
  type SecretKeys,
} from '../../storage/secrets.js';
import type { IntegrationRoute, PrefixRoute } from '../../webhooks/receiver.js';
import { discordVerifier } from '../../webhooks/verifiers/discord.js';
import { headerSecret } from '../../webhooks/verifiers/secret.js';
import { slackVerifier } from '../../webhooks/verifiers/slack.js';
import { dig, headerValue, saneId, type Verdict, type WebhookVerifier } from '../../webhooks/verifiers/types.js';
import type { SealedGrant } from './login.js';
import type { ChannelGrant, ChannelStore, Device } from './state.js';

export const CHANNEL_PATH_PREFIX = '/webhook/channels/';
const DEVICE_NAME = /^[\p{L}\p{N} ._'()-]{1,64}$/u;
const MAX_TEXT_CHARS = 4096;

/** The platform a kind talks to, as the envelope names it. */
export function platformOf(channel: ChannelConfig): string {
  return channel.kind === 'qr' ? 'device' : channel.platform;
}

/**
 * The receiver routes for `channels`: `/webhook/channels/<name>` takes the channel's inbound
 * events, verified its own way (a paired device's token, Telegram's secret token from login,
 * Discord's Ed25519 signature, Slack's v0 signature), and queues them as actions whose envelope
 * adds `channel`, `from` and `text` (the raw update stays in `payload`). For `qr` channels the
 * prefix routes serve pairing (`…/pair/<code>`) and the device outbox (`…/outbox`). Failed
 * platform signatures do not count for the lockout: Telegram, Discord and Slack send from shared
 * addresses (anyone could get them locked out), and their secrets cannot be guessed anyway.
 */
export function channelRoutes(
  config: Config,
  deps: { store: ChannelStore; secretKeys: SecretKeys; logger: Logger },
): { routes: IntegrationRoute[]; prefixRoutes: PrefixRoute[] } {
  const routes: IntegrationRoute[] = [];
  const prefixRoutes: PrefixRoute[] = [];
  const { store } = deps;
  for (const [name, channel] of Object.entries(config.channels)) {
    const describe = { name, kind: channel.kind, platform: platformOf(channel) };
    const route = {
      path: `${CHANNEL_PATH_PREFIX}${name}`,
      action: channel.action,
      verifyType: `channel ${describe.platform}`,
      // For `status` only: a failed write is logged, never the sender's problem.
      onStored: () =>
        void store
          .noteEvent(name, Date.now())
          .catch((err: Error) =>
            deps.logger.warn({ channel: name, problem: err.message }, 'channel: could not note the last event'),
          ),
    };
    switch (channel.kind) {
      case 'qr': {
        const devices = new WeakMap<IncomingHttpHeaders, Device>();
        routes.push({
          ...route,
          failureCode: 'invalid_token',
          verifier: deviceVerifier(store, name, devices),
          // `from` is the paired device as stored, never a name the body claims.
          envelopeExtra: (body, headers) => ({
            channel: describe,
            from: { deviceId: devices.get(headers)?.id, deviceName: devices.get(headers)?.name },
            text: textOf(body.text),
          }),
        });
        prefixRoutes.push(devicePrefixRoute(store, name, channel, deps.logger));
        break;
      }
      case 'bot-token':
        routes.push({
          ...route,
          countsFailures: false,
          failureCode: 'invalid_webhook_secret',
          verifier: telegramChannelVerifier(store, name, deps.secretKeys),
          envelopeExtra: (body) => ({ channel: describe, ...telegramSender(body) }),
        });
        break;
      case 'oauth-bot':
        routes.push({
          ...route,
          countsFailures: false,
          verifier: discordVerifier(channel),
          envelopeExtra: (body) => ({ channel: describe, ...discordSender(body) }),
        });
        prefixRoutes.push(oauthCallbackRoute(store, name, deps.secretKeys));
        break;
      case 'oauth':
        routes.push({
          ...route,
          countsFailures: false,
          verifier: slackVerifier(channel),
          envelopeExtra: (body) => ({
            channel: describe,
            from: dig(body, 'event', 'user') ?? null,
            text: textOf(dig(body, 'event', 'text')),
          }),
        });
        prefixRoutes.push(oauthCallbackRoute(store, name, deps.secretKeys));
        break;
    }
  }
  return { routes, prefixRoutes };
}

/** A verifier's answer when storage cannot be asked: 503 (the sender retries), never a 2xx or a 401 that counts. */
function storeUnreachable(err: unknown): Verdict {
  return { ok: false, reason: `storage unavailable: ${(err as Error).message}`, unavailable: true };
}

/** A channel route's storage call: a storage failure is 503 store_unavailable (with Retry-After), not a 500. */
export async function storeCall<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (err) {
    throw new HttpError('store_unavailable', (err as Error).message, { 'retry-after': '5' });
  }
}

function textOf(value: unknown): string | null {
  return typeof value === 'string' ? value.slice(0, MAX_TEXT_CHARS) : null;
}

/** String() of a primitive; an object is empty (String() of a JSON object with its own "toString" throws). */
function primitiveText(value: unknown): string {
  return value !== null && typeof value === 'object' ? '' : String(value);
}

/** A paired device: `Authorization: Bearer <device token>`; a revoked device fails at once (looked up per request). */
function deviceVerifier(
  store: ChannelStore,
  name: string,
  devices: WeakMap<IncomingHttpHeaders, Device>,
): WebhookVerifier {
  return {
    async checkHeaders(headers, now) {
      const token = /^bearer +(\S+) *$/i.exec(headerValue(headers, 'authorization') ?? '')?.[1];
      if (!token) return { ok: false, reason: 'no device token' };
      let device: Device | undefined;
      try {
        device = await store.deviceByToken(name, token, now);
      } catch (err) {
        return storeUnreachable(err);
      }
      if (!device) return { ok: false, reason: 'unknown or revoked device token' };
      devices.set(headers, device);
      return { ok: true };
    },
    // A device's own message id (`id`), per device: a resend after a lost answer is not delivered twice.
    deliveryId: (headers, body) =>
      saneId(body.id) === undefined ? undefined : `${devices.get(headers)?.id}:${saneId(body.id)}`,
  };
}

/**
 * Telegram: the secret token login gave setWebhook, from storage (a login while gatehouse runs
 * takes effect at once); no grant, no entry. Deduped by update_id.
 */
function telegramChannelVerifier(store: ChannelStore, name: string, secretKeys: SecretKeys): WebhookVerifier {
  let cached: { sealed: string; check: ReturnType<typeof headerSecret> } | undefined;
  return {
    async checkHeaders(headers, now) {
      let grant: ChannelGrant | undefined;
      try {
        grant = await store.grant(name);
      } catch (err) {
        return storeUnreachable(err);
      }
      if (!grant) return { ok: false, reason: `channel ${name} is not logged in` };
      if (cached?.sealed !== grant.sealed) {
        let sealed: SealedGrant;
        try {
          sealed = JSON.parse(openSecret(grant.sealed, secretKeys, channelGrantContext(name))) as SealedGrant;
        } catch (err) {
          // Another GATEHOUSE_SECRET_KEY than the login's: 503, so Telegram retries once it is fixed.
          return { ok: false, reason: (err as Error).message, unavailable: true };
        }
        if (sealed.kind !== 'bot-token') return { ok: false, reason: 'stored grant is not a bot-token grant' };
        cached = { sealed: grant.sealed, check: headerSecret('x-telegram-bot-api-secret-token', sealed.secretToken) };
      }
      return cached.check(headers, now);
    },
    deliveryId: (_headers, body) => saneId(body.update_id),
  };
}

function telegramSender(body: Record<string, unknown>): { from: unknown; text: string | null } {
  const message = (body.message ?? body.edited_message ?? body.channel_post) as Record<string, any> | undefined;
  const from = message?.from ?? message?.sender_chat;
  return {
    from: from
      ? { id: from.id, username: from.username ?? from.title ?? null, chatId: message?.chat?.id ?? null }
      : null,
    text: textOf(message?.text),
  };
}

function discordSender(body: Record<string, unknown>): { from: unknown; text: string | null } {
  const user = (dig(body, 'member', 'user') ?? dig(body, 'user')) as Record<string, unknown> | undefined;
  // Shape asserted, not assumed: a signed body is still untrusted JSON (a non-array `options`,
  // or an object with its own "toString", would make the envelope throw).
  const name = dig(body, 'data', 'name');
  const options = dig(body, 'data', 'options');
  const option = (o: unknown) => ` ${primitiveText(dig(o, 'name'))}:${primitiveText(dig(o, 'value'))}`;
  const text =
    typeof name === 'string' && name !== ''
      ? `/${name}${Array.isArray(options) ? options.map(option).join('') : ''}`
      : null;
  return {
    from: user ? { id: user.id, username: user.username ?? null, channelId: body.channel_id ?? null } : null,
    text,
  };
}

/**
 * `GET …/oauth/callback` for `channels login --public`: the platform's redirect lands here; an
 * answer whose `state` matches a pending login of this channel is handed (sealed, through
 * storage) to the waiting CLI, once. Any other is 400 and counts for the lockout.
 */
function oauthCallbackRoute(store: ChannelStore, name: string, secretKeys: SecretKeys): PrefixRoute {
  return {
    prefix: `${CHANNEL_PATH_PREFIX}${name}/`,
    async handle(req, res, rest, tools) {
      if (rest !== 'oauth/callback') throw new HttpError('not_found', 'no channel route at this path');
      if (req.method !== 'GET')
        throw new HttpError('method_not_allowed', `${req.method} on the OAuth callback`, { allow: 'GET' });
      const query = (req.url ?? '').split('?')[1] ?? '';
      const state = new URLSearchParams(query).get('state');
      if (
        !state ||
        !(await storeCall(() =>
          store.answerOAuthRequest(name, state, sealSecret(query, secretKeys, oauthAnswerContext(name)), Date.now()),
        ))
      ) {
        await tools.lockout.recordFailure(tools.clientIp);
        throw new HttpError('invalid_oauth_state', 'no pending login with this state');
      }
      res.writeHead(200, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' });
      res.end('gatehouse: answer received. You can close this tab and return to the terminal.\n');
    },
  };
}

/**
 * qr pairing and outbox:
 * - `POST …/pair/<code>` `{ deviceName }` → 201 `{ deviceId, token }` once; an unknown code 404, a
 *   used or expired one 410, each counted by the lockout (codes are guessable only by brute force).
 * - `GET …/outbox` with the device token → the messages sent to it, each handed over once.
 */
function devicePrefixRoute(store: ChannelStore, name: string, _channel: ChannelConfig, logger: Logger): PrefixRoute {
  const json = (res: ServerResponse, status: number, body: unknown) => {
    const text = JSON.stringify(body);
    res.writeHead(status, {
      'content-type': 'application/json; charset=utf-8',
      'content-length': Buffer.byteLength(text),
      'cache-control': 'no-store',
    });
    res.end(text);
  };
  return {
    prefix: `${CHANNEL_PATH_PREFIX}${name}/`,
    async handle(req: IncomingMessage, res: ServerResponse, rest, tools) {
      const now = Date.now();
      const pairing = /^pair\/([A-Za-z0-9]{1,16})$/.exec(rest);
      if (pairing) {
        if (req.method !== 'POST')
          throw new HttpError('method_not_allowed', `${req.method} on a pairing URL`, { allow: 'POST' });
        const body = await tools.readJson();
        const deviceName = typeof body.deviceName === 'string' ? body.deviceName.trim() : '';
        if (!DEVICE_NAME.test(deviceName))
          throw new HttpError('invalid_request', "deviceName: 1-64 letters, digits, spaces or . _ ' ( ) -");
        // Again after the body: concurrent guesses all passed the first check before any failed.
        const lockedFor = await tools.lockout.lockedFor(tools.clientIp);
        if (lockedFor > 0)
          throw new HttpError('too_many_failures', `locked out for ${lockedFor}s more`, {
            'retry-after': String(lockedFor),
          });
        const outcome = await storeCall(() => store.pair(name, pairing[1]!, deviceName, now));
        if (!outcome.ok) {
          await tools.lockout.recordFailure(tools.clientIp);
          throw new HttpError(
            outcome.reason === 'unknown' ? 'pairing_not_found' : 'pairing_gone',
            `pairing code ${outcome.reason}`,
          );
        }
        logger.info({ channel: name, device: outcome.device.id, deviceName }, 'channel device paired');
        return json(res, 201, {
          deviceId: outcome.device.id,
          token: outcome.token,
          channel: name,
          messagesUrl: `${CHANNEL_PATH_PREFIX}${name}`,
          outboxUrl: `${CHANNEL_PATH_PREFIX}${name}/outbox`,
        });
      }
      if (rest === 'outbox') {
        if (req.method !== 'GET')
          throw new HttpError('method_not_allowed', `${req.method} on the outbox`, { allow: 'GET' });
        const token = /^bearer +(\S+) *$/i.exec(req.headers.authorization ?? '')?.[1];
        const device = token ? await storeCall(() => store.deviceByToken(name, token, now)) : undefined;
        if (!device) {
          if (token) await tools.lockout.recordFailure(tools.clientIp);
          throw new HttpError(token ? 'invalid_token' : 'missing_credentials', 'device token unknown or revoked');
        }
        return json(res, 200, { messages: await storeCall(() => store.takeOutbox(device.id, 100, now)) });
      }
      throw new HttpError('not_found', 'no channel route at this path');
    },
  };
}
