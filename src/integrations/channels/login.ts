import { randomBytes } from 'node:crypto';
import type { ChannelConfig } from '../../config/schema.js';
import { UsageError } from '../../errors.js';
import {
  consentRefused,
  newAuthorizationSecrets,
  receiveAuthorizationCode,
  type AuthorizationRequest,
  type AuthorizationResponse,
} from '../oauth-loopback.js';
import {
  channelGrantContext,
  oauthAnswerContext,
  openSecret,
  sealSecret,
  type SecretKeys,
} from '../../storage/secrets.js';
import { discord, exchangeCode, PlatformError, telegram } from './platforms.js';
import type { ChannelStore } from './state.js';

/** The sealed part of each kind's grant (what `sealed` opens to). */
export type SealedGrant =
  | { kind: 'bot-token'; secretToken: string }
  | { kind: 'oauth-bot'; accessToken: string; refreshToken: string }
  | { kind: 'oauth'; botToken: string };

export interface LoginIo {
  /** A finished step: `✓ step detail` or `✗ step detail`. */
  step(ok: boolean, step: string, detail: string): void;
  /** Free text (the QR code, the URL to open). */
  say(text: string): void;
  openBrowser?(url: string): void;
}

export interface LoginContext {
  name: string;
  channel: ChannelConfig;
  store: ChannelStore;
  secretKeys: SecretKeys;
  /** The webhook listener's base URL (qr pairing links when the channel has no publicUrl). */
  webhookBaseUrl: string;
  io: LoginIo;
  browser: boolean;
  /** OAuth kinds: receive the redirect on the running server's callback route instead of a loopback listener. */
  publicCallback?: boolean;
  /** OAuth kinds: the loopback listener's port (default: any free one). */
  loopbackPort?: number;
  timeoutMs?: number;
  now?: () => number;
}

/** A step failed: the message names it, the platform's error and the fix. */
export class LoginFailed extends UsageError {}

/** `gatehouse channels login <name>`: the ceremony of the channel's kind. */
export async function loginChannel(ctx: LoginContext): Promise<void> {
  switch (ctx.channel.kind) {
    case 'qr':
      return pairDevice(ctx, ctx.channel);
    case 'bot-token':
      return loginBotToken(ctx, ctx.channel);
    case 'oauth-bot':
      return loginOAuthBot(ctx, ctx.channel);
    case 'oauth':
      return loginOAuth(ctx, ctx.channel);
  }
}

async function step<T>(
  ctx: LoginContext,
  name: string,
  fix: string,
  run: () => Promise<{ value: T; detail: string }>,
): Promise<T> {
  try {
    const { value, detail } = await run();
    ctx.io.step(true, name, detail);
    return value;
  } catch (err) {
    const said = err instanceof Error ? err.message : String(err);
    ctx.io.step(false, name, said);
    throw new LoginFailed(
      `channel ${ctx.name}: step "${name}" failed: ${said}${err instanceof PlatformError || !(err instanceof UsageError) ? `. ${fix}` : ''}`,
    );
  }
}

/**
 * qr: a pairing code (8 characters, 10 minutes, at most 3 pending) as a QR code of the pairing
 * URL; waits until a device has used it. The device gets its token from that URL, once.
 */
async function pairDevice(ctx: LoginContext, channel: Extract<ChannelConfig, { kind: 'qr' }>): Promise<void> {
  const now = ctx.now ?? Date.now;
  if (!channel.publicUrl && /\/\/(0\.0\.0\.0|\[::\])[:/]/.test(ctx.webhookBaseUrl)) {
    throw new LoginFailed(
      `channel ${ctx.name}: the webhook listener binds every address (${ctx.webhookBaseUrl}); set channels.${ctx.name}.publicUrl to the URL devices reach it at`,
    );
  }
  const code = await ctx.store.createPairing(ctx.name, channel.pairingMinutes * 60_000, now());
  if (!code)
    throw new LoginFailed(
      `channel ${ctx.name}: 3 pairing codes are already pending; use one, or wait until they expire (${channel.pairingMinutes} minutes)`,
    );
  const url = `${(channel.publicUrl ?? ctx.webhookBaseUrl).replace(/\/$/, '')}/webhook/channels/${ctx.name}/pair/${code}`;
  ctx.io.say(await renderQr(url));
  ctx.io.say(
    `Scan it with the device, or have it POST {"deviceName": "…"} to\n  ${url}\npairing code: ${code} (valid ${channel.pairingMinutes} minutes)\nwaiting for the device…`,
  );
  const deadline = Math.min(
    now() + channel.pairingMinutes * 60_000,
    ctx.timeoutMs === undefined ? Infinity : now() + ctx.timeoutMs,
  );
  for (;;) {
    const status = await ctx.store.pairingStatus(code);
    if (status?.device) {
      ctx.io.step(true, 'pair', `paired: ${status.device.name} (${status.device.id})`);
      return;
    }
    if (now() >= deadline)
      throw new LoginFailed(`channel ${ctx.name}: no device used the pairing code before it expired; run login again`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

/**
 * The terminal QR code (half-block characters: two modules per line). qrcode (with pngjs) is
 * imported here, on the first code drawn: `gatehouse start` and every other command load this
 * module through the CLI's command tree and never draw one.
 */
export async function renderQr(text: string): Promise<string> {
  const { default: QRCode } = await import('qrcode');
  return QRCode.toString(text, { type: 'utf8', errorCorrectionLevel: 'M', margin: 2 });
}

/** bot-token (Telegram): getMe, then setWebhook with a fresh secret_token that inbound updates must carry. */
async function loginBotToken(ctx: LoginContext, channel: Extract<ChannelConfig, { kind: 'bot-token' }>): Promise<void> {
  const now = ctx.now ?? Date.now;
  const bot = await step(
    ctx,
    'token',
    'Check channels.' + ctx.name + '.botToken: copy it again from @BotFather (/token).',
    async () => {
      const me = await telegram.getMe(channel.apiBaseUrl, channel.botToken);
      return { value: me, detail: `bot @${me.username ?? me.id} (id ${me.id})` };
    },
  );
  const webhookUrl = `${channel.publicUrl.replace(/\/$/, '')}/webhook/channels/${ctx.name}`;
  const secretToken = randomBytes(32).toString('base64url'); // 43 characters of A-Z a-z 0-9 _ -, as Telegram allows
  await step(
    ctx,
    'webhook',
    `Telegram must reach ${webhookUrl} over https (publicUrl must be public, port 443, 80, 88 or 8443).`,
    async () => {
      await telegram.setWebhook(channel.apiBaseUrl, channel.botToken, webhookUrl, secretToken);
      return { value: undefined, detail: `updates go to ${webhookUrl} with a new secret token` };
    },
  );
  const sealed: SealedGrant = { kind: 'bot-token', secretToken };
  await ctx.store.saveGrant(
    {
      name: ctx.name,
      kind: channel.kind,
      sealed: sealSecret(JSON.stringify(sealed), ctx.secretKeys, channelGrantContext(ctx.name)),
      details: { botId: bot.id, username: bot.username, webhookUrl },
      expiresAt: null,
    },
    now(),
  );
  ctx.io.step(true, 'stored', 'secret token stored encrypted');
}

/** oauth-bot (Discord): the bot install consent (scopes, permissions, state, PKCE), code → grant. */
async function loginOAuthBot(ctx: LoginContext, channel: Extract<ChannelConfig, { kind: 'oauth-bot' }>): Promise<void> {
  const now = ctx.now ?? Date.now;
  const bot = await step(
    ctx,
    'bot token',
    `Check channels.${ctx.name}.botToken (Developer Portal → Bot → Reset Token).`,
    async () => {
      const me = await discord.getBot(channel.apiBaseUrl, channel.botToken);
      return { value: me, detail: `bot ${me.username} (id ${me.id})` };
    },
  );
  const response = await step(
    ctx,
    'authorise',
    'Approve the install in the browser, with an account that can manage the server.',
    async () => {
      const value = await receiveCode(ctx, channel.publicUrl, {
        authorizeUrl: ({ redirectUri, state, codeChallenge }) => {
          const url = new URL(channel.authorizeUrl);
          url.search = new URLSearchParams({
            client_id: channel.clientId,
            redirect_uri: redirectUri,
            response_type: 'code',
            scope: channel.scopes.join(' '),
            permissions: channel.permissions,
            state,
            code_challenge: codeChallenge,
            code_challenge_method: 'S256',
          }).toString();
          return url.toString();
        },
        showUrl: (url) => showUrl(ctx, url),
        timeoutMs: ctx.timeoutMs,
      });
      return {
        value,
        detail: `consent given${value.params.get('guild_id') ? ` for guild ${value.params.get('guild_id')}` : ''}`,
      };
    },
  );
  const tokens = await step(
    ctx,
    'token',
    `Check channels.${ctx.name}.clientId/clientSecret, and that the redirect URI ${response.redirectUri} is registered exactly (Developer Portal → OAuth2 → Redirects; a fixed port with --port).`,
    async () => {
      const value = await exchangeCode('discord', channel.tokenUrl, {
        clientId: channel.clientId,
        clientSecret: channel.clientSecret,
        code: response.code,
        redirectUri: response.redirectUri,
        codeVerifier: response.codeVerifier,
      });
      return {
        value,
        detail: `grant for guild ${value.guild?.id ?? response.params.get('guild_id') ?? '?'}, expires in ${Math.round(Number(value.expires_in ?? 0) / 3600)} h`,
      };
    },
  );
  const sealed: SealedGrant = {
    kind: 'oauth-bot',
    accessToken: tokens.access_token,
    refreshToken: tokens.refresh_token,
  };
  await ctx.store.saveGrant(
    {
      name: ctx.name,
      kind: channel.kind,
      sealed: sealSecret(JSON.stringify(sealed), ctx.secretKeys, channelGrantContext(ctx.name)),
      details: {
        guildId: tokens.guild?.id ?? response.params.get('guild_id'),
        guildName: tokens.guild?.name,
        scope: tokens.scope,
        bot: bot.username,
      },
      expiresAt: tokens.expires_in ? now() + Number(tokens.expires_in) * 1000 : null,
    },
    now(),
  );
  ctx.io.step(true, 'stored', 'grant stored encrypted; gatehouse refreshes it before it expires');
}

/** oauth (Slack): the workspace install consent, code → bot token and team. */
async function loginOAuth(ctx: LoginContext, channel: Extract<ChannelConfig, { kind: 'oauth' }>): Promise<void> {
  const now = ctx.now ?? Date.now;
  const response = await step(
    ctx,
    'authorise',
    'Approve the install in the browser, with an account allowed to install apps in the workspace.',
    async () => {
      const value = await receiveCode(ctx, channel.publicUrl, {
        authorizeUrl: ({ redirectUri, state }) => {
          const url = new URL(channel.authorizeUrl);
          url.search = new URLSearchParams({
            client_id: channel.clientId,
            scope: channel.scopes.join(','),
            redirect_uri: redirectUri,
            state,
          }).toString();
          return url.toString();
        },
        showUrl: (url) => showUrl(ctx, url),
        timeoutMs: ctx.timeoutMs,
      });
      return { value, detail: 'consent given' };
    },
  );
  const tokens = await step(
    ctx,
    'token',
    `Check channels.${ctx.name}.clientId/clientSecret, and add ${response.redirectUri} to the app's Redirect URLs (OAuth & Permissions; a fixed port with --port).`,
    async () => {
      const value = await exchangeCode('slack', channel.tokenUrl, {
        clientId: channel.clientId,
        clientSecret: channel.clientSecret,
        code: response.code,
        redirectUri: response.redirectUri,
      });
      if (typeof value.access_token !== 'string')
        throw new PlatformError('slack', 'the token response has no bot access_token');
      return {
        value,
        detail: `installed in ${value.team?.name ?? value.team?.id} (${value.team?.id}), bot user ${value.bot_user_id}`,
      };
    },
  );
  const sealed: SealedGrant = { kind: 'oauth', botToken: tokens.access_token };
  await ctx.store.saveGrant(
    {
      name: ctx.name,
      kind: channel.kind,
      sealed: sealSecret(JSON.stringify(sealed), ctx.secretKeys, channelGrantContext(ctx.name)),
      details: {
        teamId: tokens.team?.id,
        teamName: tokens.team?.name,
        botUserId: tokens.bot_user_id,
        scope: tokens.scope,
      },
      expiresAt: null,
    },
    now(),
  );
  ctx.io.step(true, 'stored', 'bot token stored encrypted');
}

export const oauthCallbackPath = (name: string) => `/webhook/channels/${name}/oauth/callback`;

/**
 * The authorization code: on a loopback listener (default), or with `--public` on the running
 * server's `/webhook/channels/<name>/oauth/callback` (for hosts no browser can reach), which
 * checks `state` and hands the answer to this process through storage.
 */
async function receiveCode(
  ctx: LoginContext,
  publicUrl: string | undefined,
  options: {
    authorizeUrl: (request: AuthorizationRequest) => string;
    showUrl: (url: string) => void;
    timeoutMs?: number;
  },
): Promise<AuthorizationResponse> {
  if (!ctx.publicCallback) return receiveAuthorizationCode({ ...options, port: ctx.loopbackPort });
  if (!publicUrl)
    throw new UsageError(
      `--public needs channels.${ctx.name}.publicUrl (the URL the platform and the browser reach the webhook listener at)`,
    );
  const now = ctx.now ?? Date.now;
  const timeoutMs = options.timeoutMs ?? 5 * 60_000;
  const { state, codeVerifier, codeChallenge } = newAuthorizationSecrets();
  const redirectUri = `${publicUrl.replace(/\/$/, '')}${oauthCallbackPath(ctx.name)}`;
  await ctx.store.createOAuthRequest(ctx.name, state, timeoutMs, now());
  options.showUrl(options.authorizeUrl({ redirectUri, state, codeChallenge }));
  const deadline = now() + timeoutMs;
  for (;;) {
    const sealed = await ctx.store.takeOAuthAnswer(state, now());
    if (sealed) {
      const params = new URLSearchParams(openSecret(sealed, ctx.secretKeys, oauthAnswerContext(ctx.name)));
      if (params.get('error')) throw consentRefused(undefined, params);
      return { code: params.get('code')!, redirectUri, codeVerifier, params };
    }
    if (now() >= deadline)
      throw new UsageError(
        `no answer reached ${redirectUri} within ${Math.round(timeoutMs / 60_000)} minutes (is gatehouse running and reachable there?)`,
      );
    await new Promise((r) => setTimeout(r, 250));
  }
}

function showUrl(ctx: LoginContext, url: string): void {
  ctx.io.say(`Open this URL in a browser and approve:\n\n  ${url}\n`);
  if (ctx.browser) ctx.io.openBrowser?.(url);
}
