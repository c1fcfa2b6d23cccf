import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { ChannelConfig, Config } from '../../config/schema.js';
import { errorCatalogue, HttpError } from '../../errors.js';
import { noteError } from '../../http/request-context.js';
import { readBody } from '../../http/read-body.js';
import { channelGrantContext, openSecret, type SecretKeys } from '../../storage/secrets.js';
import type { SealedGrant } from './login.js';
import { discord, messageTextProblem, PlatformError, slack, telegram } from './platforms.js';
import { storeCall } from './inbound.js';
import type { ChannelStore } from './state.js';

const MAX_BODY_BYTES = 16 * 1024;
const MAX_TEXT_CHARS = 4000;

/** A message text the channel's platform documents it would refuse (too long, blank). */
class TextRefused extends Error {}

export interface ChannelSender {
  /** Answers `POST /_gatehouse/channels/<name>/messages` for a request the pipeline has authenticated, authorized and counted. */
  handle(req: IncomingMessage, res: ServerResponse): Promise<void>;
}

/**
 * Outbound: an internal service sends `{ to, text }` through a channel without ever holding its
 * token. gatehouse uses the channel's token (from the config, or the grant a login stored) and
 * answers with the platform's message id, or 502 with the platform's error. For a `qr` channel
 * the message waits in the device's outbox (`to` = device id or name).
 */
export function createChannelSender(
  config: Config,
  deps: { store: ChannelStore; secretKeys: SecretKeys; logger: Logger },
): ChannelSender {
  const { store, logger } = deps;
  const json = (res: ServerResponse, status: number, body: unknown) => {
    const text = JSON.stringify(body);
    res.writeHead(status, {
      'content-type': 'application/json; charset=utf-8',
      'content-length': Buffer.byteLength(text),
      'cache-control': 'no-store',
    });
    res.end(text);
  };

  async function sealedGrant(name: string): Promise<SealedGrant> {
    const grant = await storeCall(() => store.grant(name));
    if (!grant)
      throw new HttpError(
        'channel_not_connected',
        `channel ${name} has no stored grant: run \`gatehouse channels login ${name}\``,
      );
    try {
      return JSON.parse(openSecret(grant.sealed, deps.secretKeys, channelGrantContext(name))) as SealedGrant;
    } catch (err) {
      // GATEHOUSE_SECRET_KEY differs from the one the login used: the server's problem, said plainly.
      logger.error({ channel: name, problem: (err as Error).message }, 'cannot open a stored channel grant');
      throw new HttpError('credentials_unreadable', (err as Error).message);
    }
  }

  // A text the platform would refuse is the caller's mistake (400), said before calling it.
  function refuseText(platform: Parameters<typeof messageTextProblem>[0], text: string): void {
    const problem = messageTextProblem(platform, text);
    if (problem) throw new TextRefused(problem);
  }

  async function send(
    name: string,
    channel: ChannelConfig,
    to: string,
    text: string,
  ): Promise<Record<string, unknown>> {
    const now = Date.now();
    switch (channel.kind) {
      case 'qr': {
        const device = (await storeCall(() => store.devices(name))).find(
          (d) => (d.id === to || d.name === to) && d.revokedAt === null,
        );
        if (!device) throw new HttpError('invalid_message', `no paired device "${to}" on channel ${name}`);
        return {
          id: String(await storeCall(() => store.enqueueForDevice(name, device.id, text, now))),
          to: device.id,
          status: 'queued for the device',
        };
      }
      case 'bot-token': {
        await sealedGrant(name); // logged in: the webhook (and so the conversation) exists
        refuseText('telegram', text);
        const sent = await telegram.sendMessage(channel.apiBaseUrl, channel.botToken, to, text);
        return { id: String(sent.message_id), to };
      }
      case 'oauth-bot': {
        await sealedGrant(name);
        refuseText('discord', text);
        const sent = await discord.sendMessage(channel.apiBaseUrl, channel.botToken, to, text);
        return { id: sent.id, to };
      }
      case 'oauth': {
        const grant = await sealedGrant(name);
        if (grant.kind !== 'oauth')
          throw new HttpError('channel_not_connected', 'stored grant is not a workspace grant');
        refuseText('slack', text);
        const sent = await slack.postMessage(channel.apiBaseUrl, grant.botToken, to, text);
        return { id: sent.ts, to: sent.channel ?? to };
      }
    }
  }

  return {
    async handle(req, res) {
      const match = /^\/_gatehouse\/channels\/([a-z0-9][a-z0-9_-]{0,31})\/messages(?:\?.*)?$/.exec(req.url ?? '');
      const name = match?.[1];
      // Own properties only: a name like "constructor" must not find Object.prototype's.
      const channel = name !== undefined && Object.hasOwn(config.channels, name) ? config.channels[name] : undefined;
      if (!name || !channel) throw new HttpError('not_found', 'no such channel');
      if (req.method !== 'POST')
        throw new HttpError('method_not_allowed', `${req.method} on a channel`, { allow: 'POST' });
      const raw = await readBody(req, res, MAX_BODY_BYTES, 10_000);
      let body: { to?: unknown; text?: unknown };
      try {
        body = JSON.parse(raw.toString('utf8'));
      } catch {
        throw new HttpError('invalid_message', 'body is not JSON');
      }
      const to = typeof body?.to === 'number' ? String(body.to) : body?.to;
      if (typeof to !== 'string' || to.length === 0 || to.length > 128)
        throw new HttpError('invalid_message', '"to" must be a non-empty string or number');
      if (typeof body.text !== 'string' || body.text.length === 0 || body.text.length > MAX_TEXT_CHARS)
        throw new HttpError('invalid_message', `"text" must be 1-${MAX_TEXT_CHARS} characters`);
      try {
        const sent = await send(name, channel, to, body.text);
        logger.info(
          { channel: name, to, id: sent.id, caller: req.gatehouse?.identity?.subject },
          'channel message sent',
        );
        return json(res, 200, { channel: name, ...sent });
      } catch (err) {
        if (err instanceof TextRefused) {
          noteError(req, new HttpError('invalid_message', err.message));
          // The platform's rule goes back with it, as a refusal's words do below.
          return json(res, 400, {
            error: { code: 'invalid_message', message: errorCatalogue.invalid_message.message, problem: err.message },
          });
        }
        if (!(err instanceof PlatformError)) throw err;
        await store.noteError(name, err.message, Date.now()).catch(() => undefined); // for `status` only
        noteError(req, new HttpError('channel_send_failed', err.message));
        // The platform's own words go back to the internal caller: it needs them to fix the request.
        return json(res, 502, {
          error: {
            code: 'channel_send_failed',
            message: errorCatalogue.channel_send_failed.message,
            platformError: err.message,
          },
        });
      }
    },
  };
}
