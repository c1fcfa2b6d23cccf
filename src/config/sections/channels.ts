import { z } from 'zod';
import { hookSecret, httpUrl, scopeToken } from './common.js';

/** Channels' own routes live under this path; nothing else may be configured there. */
export const CHANNEL_PATHS = '/webhook/channels/';

/** Gatehouse's own channel API on the gateway listener, outside the proxied /api/ space. */
export const CHANNEL_SEND_PREFIX = '/_gatehouse/channels/';
/** The path that sends through channel `name` (what rules, rate limits and `send.scopes` match). */
export const channelSendPath = (name: string) => `${CHANNEL_SEND_PREFIX}${name}/messages`;
export const isChannelPath = (path: string) => path === CHANNEL_PATHS.slice(0, -1) || path.startsWith(CHANNEL_PATHS);

/**
 * `channels`: messaging platforms, each proving itself its own way (src/integrations/channels/). Tokens won
 * by `gatehouse channels login` live sealed in storage; these are the static settings.
 */
export const channelName = z
  .string()
  .regex(/^[a-z0-9][a-z0-9_-]{0,31}$/, 'channel names: 1-32 characters of a-z 0-9 _ - (they appear in paths)');
const channelCommon = {
  action: z
    .enum(['message', 'agent'])
    .default('message')
    .describe("What the channel's inbound messages become; that action needs a `webhooks.targets` entry."),
  send: z
    .strictObject({
      scopes: z
        .array(scopeToken)
        .min(1)
        .describe(
          'Scopes a credential must hold, all of them, to send through the channel, whatever `gateway.auth.rules` say (under `defaultAllow: false` they also grant its path).',
        ),
    })
    .optional()
    .describe(
      'Who may send through the channel (`POST /_gatehouse/channels/<name>/messages` on the gateway). Unset: any credential the rules let through; `config check` warns.',
    ),
};
const apiUrl = (what: string, fallback: string, purpose: string) => httpUrl(what).default(fallback).describe(purpose);
export const channelSchema = z
  .discriminatedUnion(
    'kind',
    [
      z.strictObject({
        kind: z
          .literal('qr')
          .describe(
            '`"qr"`: devices paired by scanning a QR code (`gatehouse channels login`), which then post messages and poll their outbox with their own token.',
          ),
        ...channelCommon,
        publicUrl: httpUrl('publicUrl').optional().meta({
          description:
            "The base URL devices reach the webhook listener at (what the QR code encodes). Unset: the listener's own address.",
          docsDefault: "the webhook listener's address",
        }),
        pairingMinutes: z.number().int().min(1).max(60).default(10).describe('Minutes a pairing code stays valid.'),
      }),
      z.strictObject({
        kind: z
          .literal('bot-token')
          .describe(
            '`"bot-token"`: a Telegram bot, proven by its token; `channels login` points Telegram\'s webhook at gatehouse.',
          ),
        platform: z.literal('telegram').describe('`"telegram"`, the platform of `bot-token` channels.'),
        ...channelCommon,
        botToken: z
          .string()
          .regex(/^\d+:[A-Za-z0-9_-]{20,}$/, 'botToken must look like 123456:ABC… (from @BotFather)')
          .describe("The bot's token from @BotFather (`123456:ABC…`); `${VAR}` or `{ file }`."),
        publicUrl: httpUrl('publicUrl').describe(
          "gatehouse's public https base URL: Telegram posts to `<publicUrl>/webhook/channels/<name>` (port 443, 80, 88 or 8443).",
        ),
        apiBaseUrl: apiUrl(
          'apiBaseUrl',
          'https://api.telegram.org',
          'The Bot API base URL (for tests and self-hosted Bot API servers).',
        ),
      }),
      z.strictObject({
        kind: z
          .literal('oauth-bot')
          .describe('`"oauth-bot"`: a Discord bot, installed in a server through an OAuth consent (`channels login`).'),
        platform: z.literal('discord').describe('`"discord"`, the platform of `oauth-bot` channels.'),
        ...channelCommon,
        clientId: z
          .string()
          .regex(/^\d{5,25}$/, 'clientId: the application id (digits)')
          .describe('The application id (digits), from the Developer Portal.'),
        clientSecret: z.string().min(8).describe("The application's OAuth2 client secret; `${VAR}` or `{ file }`."),
        botToken: z.string().min(20).describe("The bot's token; `${VAR}` or `{ file }`."),
        publicUrl: httpUrl('publicUrl')
          .optional()
          .describe(
            'Where Discord and the browser reach the webhook listener: the OAuth callback of `channels login --public`. Unset: login listens on loopback.',
          ),
        publicKey: z
          .string()
          .regex(/^[0-9a-fA-F]{64}$/, 'publicKey must be the 32-byte Ed25519 key as 64 hex digits')
          .describe("The application's public key (64 hex digits): interactions are verified with it (Ed25519)."),
        permissions: z
          .string()
          .regex(/^\d+$/)
          .default('2048')
          .describe('The bot\'s permissions integer asked for at install, as text (`"2048"`: send messages).'),
        scopes: z
          .array(z.string().min(1))
          .min(1)
          .default(['bot', 'applications.commands'])
          .describe('The OAuth scopes asked for at install.'),
        toleranceSeconds: z
          .number()
          .int()
          .min(1)
          .max(3600)
          .default(300)
          .describe("How many seconds an interaction's signed timestamp may differ from now."),
        apiBaseUrl: apiUrl('apiBaseUrl', 'https://discord.com/api/v10', 'The Discord API base URL (for tests).'),
        authorizeUrl: apiUrl(
          'authorizeUrl',
          'https://discord.com/oauth2/authorize',
          'The OAuth authorization page (for tests).',
        ),
        tokenUrl: apiUrl('tokenUrl', 'https://discord.com/api/oauth2/token', 'The OAuth token endpoint (for tests).'),
      }),
      z.strictObject({
        kind: z
          .literal('oauth')
          .describe('`"oauth"`: a Slack app, installed in a workspace through an OAuth consent (`channels login`).'),
        platform: z.literal('slack').describe('`"slack"`, the platform of `oauth` channels.'),
        ...channelCommon,
        clientId: z.string().min(1).describe("The app's Client ID."),
        clientSecret: z.string().min(8).describe("The app's Client Secret; `${VAR}` or `{ file }`."),
        signingSecret: hookSecret('signingSecret').describe(
          "The app's Signing Secret: events are verified with it (v0); `${VAR}` or `{ file }`.",
        ),
        publicUrl: httpUrl('publicUrl')
          .optional()
          .describe(
            'Where Slack and the browser reach the webhook listener: the OAuth callback of `channels login --public`. Unset: login listens on loopback.',
          ),
        scopes: z
          .array(z.string().min(1))
          .min(1)
          .default(['chat:write', 'channels:history'])
          .describe('The bot token scopes asked for at install.'),
        toleranceSeconds: z
          .number()
          .int()
          .min(1)
          .max(3600)
          .default(300)
          .describe("How many seconds an event's signed timestamp may differ from now."),
        apiBaseUrl: apiUrl('apiBaseUrl', 'https://slack.com/api', 'The Slack Web API base URL (for tests).'),
        authorizeUrl: apiUrl(
          'authorizeUrl',
          'https://slack.com/oauth/v2/authorize',
          'The OAuth authorization page (for tests).',
        ),
        tokenUrl: apiUrl('tokenUrl', 'https://slack.com/api/oauth.v2.access', 'The OAuth token endpoint (for tests).'),
      }),
    ],
    {
      error: (issue) =>
        issue.code === 'invalid_union'
          ? 'kind must be one of qr, bot-token, oauth-bot, oauth (with platform telegram, discord, slack respectively)'
          : undefined,
    },
  )
  .describe('One channel; `kind` says which platform and how it proves itself.');

export const channels = z.record(channelName, channelSchema).default({}).meta({
  description:
    'Messaging platforms, by name (1-32 characters of `a-z 0-9 _ -`): their events arrive as actions, and services send through them. Needs `webhooks.enabled`.',
  docsType: 'object of channels by name',
});
