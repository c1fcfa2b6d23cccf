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
 * `channels`: messaging platforms, each proving itself its own way (src/channels/). Tokens won
 * by `gatehouse channels login` live sealed in storage; these are the static settings.
 */
export const channelName = z.string().regex(/^[a-z0-9][a-z0-9_-]{0,31}$/, 'channel names: 1-32 characters of a-z 0-9 _ - (they appear in paths)');
const channelCommon = {
  action: z.enum(['message', 'agent']).default('message'),
  /**
   * Who may send through this channel (`POST /_gatehouse/channels/<name>/messages`): a credential
   * needs every one of these scopes, whatever gateway.auth.rules say; a rule for the channel's path itself.
   */
  send: z.strictObject({ scopes: z.array(scopeToken).min(1) }).optional(),
};
export const channelSchema = z.discriminatedUnion('kind', [
  z.strictObject({
    kind: z.literal('qr'),
    ...channelCommon,
    /** The base URL devices reach the webhook listener at (what the QR code encodes); default: the listener's own address. */
    publicUrl: httpUrl('publicUrl').optional(),
    pairingMinutes: z.number().int().min(1).max(60).default(10),
  }),
  z.strictObject({
    kind: z.literal('bot-token'),
    platform: z.literal('telegram'),
    ...channelCommon,
    botToken: z.string().regex(/^\d+:[A-Za-z0-9_-]{20,}$/, 'botToken must look like 123456:ABC… (from @BotFather)'),
    publicUrl: httpUrl('publicUrl'),
    apiBaseUrl: httpUrl('apiBaseUrl').default('https://api.telegram.org'),
  }),
  z.strictObject({
    kind: z.literal('oauth-bot'),
    platform: z.literal('discord'),
    ...channelCommon,
    clientId: z.string().regex(/^\d{5,25}$/, 'clientId: the application id (digits)'),
    clientSecret: z.string().min(8),
    botToken: z.string().min(20),
    /** Where the platform reaches the webhook listener: the OAuth callback of `login --public`. */
    publicUrl: httpUrl('publicUrl').optional(),
    publicKey: z.string().regex(/^[0-9a-fA-F]{64}$/, 'publicKey must be the 32-byte Ed25519 key as 64 hex digits'),
    permissions: z.string().regex(/^\d+$/).default('2048'),
    scopes: z.array(z.string().min(1)).min(1).default(['bot', 'applications.commands']),
    toleranceSeconds: z.number().int().min(1).max(3600).default(300),
    apiBaseUrl: httpUrl('apiBaseUrl').default('https://discord.com/api/v10'),
    authorizeUrl: httpUrl('authorizeUrl').default('https://discord.com/oauth2/authorize'),
    tokenUrl: httpUrl('tokenUrl').default('https://discord.com/api/oauth2/token'),
  }),
  z.strictObject({
    kind: z.literal('oauth'),
    platform: z.literal('slack'),
    ...channelCommon,
    clientId: z.string().min(1),
    clientSecret: z.string().min(8),
    signingSecret: hookSecret('signingSecret'),
    publicUrl: httpUrl('publicUrl').optional(),
    scopes: z.array(z.string().min(1)).min(1).default(['chat:write', 'channels:history']),
    toleranceSeconds: z.number().int().min(1).max(3600).default(300),
    apiBaseUrl: httpUrl('apiBaseUrl').default('https://slack.com/api'),
    authorizeUrl: httpUrl('authorizeUrl').default('https://slack.com/oauth/v2/authorize'),
    tokenUrl: httpUrl('tokenUrl').default('https://slack.com/api/oauth.v2.access'),
  }),
], { error: (issue) => (issue.code === 'invalid_union' ? 'kind must be one of qr, bot-token, oauth-bot, oauth (with platform telegram, discord, slack respectively)' : undefined) });
