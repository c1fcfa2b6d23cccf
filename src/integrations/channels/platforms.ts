/**
 * The few platform API calls channels make, with fetch: Telegram's Bot API, Discord's OAuth2
 * and REST API, Slack's OAuth v2 and Web API. Each failure becomes a PlatformError carrying the
 * platform's own words, for the CLI ("failures name the step, the platform's error and the fix")
 * and for the 502 the outbound route answers.
 */
import { VERSION } from '../../version.js';

export class PlatformError extends Error {
  override name = 'PlatformError';
  constructor(
    readonly platform: string,
    message: string,
    /** The HTTP status the platform answered, when it answered. */
    readonly status?: number,
  ) {
    super(`${platform}: ${message}`);
  }
}

const TIMEOUT_MS = 10_000;

/**
 * Discord's HTTP API (the OAuth2 token URL included) "must" get `User-Agent: DiscordBot ($url,
 * $versionNumber)`; anything else may be blocked by Cloudflare (JSON code 40333), and fetch's own
 * `node` is not one. https://discord.com/developers/docs/reference#user-agent (gatehouse has no
 * public URL, so its name stands in the `$url` place.)
 */
export const DISCORD_USER_AGENT = `DiscordBot (gatehouse, ${VERSION})`;

async function callJson(platform: string, url: string, init: RequestInit): Promise<{ status: number; body: any }> {
  let response: Response;
  try {
    response = await fetch(url, { ...init, signal: AbortSignal.timeout(TIMEOUT_MS) });
  } catch (err) {
    throw new PlatformError(platform, `unreachable (${(err as Error).message})`);
  }
  const text = await response.text();
  let body: any;
  try {
    body = text ? JSON.parse(text) : {};
  } catch {
    throw new PlatformError(platform, `answered ${response.status} with a body that is not JSON`, response.status);
  }
  return { status: response.status, body };
}

const form = (fields: Record<string, string | undefined>) =>
  new URLSearchParams(Object.entries(fields).filter((e): e is [string, string] => e[1] !== undefined));

/** Where each platform documents how long (and how blank) a message's text may be. */
const TEXT_RULES = {
  // "Text of the message to be sent, 1-4096 characters after entities parsing"; blank is "message text is empty".
  telegram: { max: 4096, blankAllowed: false, source: 'https://core.telegram.org/bots/api#sendmessage' },
  // content: "Message contents (up to 2000 characters)"; an empty message is JSON code 50006.
  discord: {
    max: 2000,
    blankAllowed: false,
    source: 'https://discord.com/developers/docs/resources/message#create-message',
  },
  // "truncate messages containing more than 40,000 characters"; whitespace is not documented as refused.
  slack: { max: 40_000, blankAllowed: true, source: 'https://docs.slack.dev/reference/methods/chat.postMessage' },
} as const;

/**
 * Why `platform` would refuse `text` as a message, or undefined: checked before calling it, so a
 * caller gets a 400 that names the platform's limit instead of a 502 with the platform's refusal.
 * Characters are Unicode code points (the references say "characters" and do not define them).
 */
export function messageTextProblem(platform: keyof typeof TEXT_RULES, text: string): string | undefined {
  const rule = TEXT_RULES[platform];
  if (!rule.blankAllowed && text.trim() === '') return `${platform} refuses a blank message (${rule.source})`;
  const length = [...text].length;
  if (length > rule.max)
    return `${platform} takes at most ${rule.max} characters in a message, got ${length} (${rule.source})`;
  return undefined;
}

// Telegram Bot API: https://core.telegram.org/bots/api (`{ ok, result }` or `{ ok: false, description }`).

export const telegram = {
  async call<T>(base: string, token: string, method: string, params: Record<string, unknown>): Promise<T> {
    const { status, body } = await callJson('telegram', `${base}/bot${token}/${method}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(params),
    });
    if (body.ok !== true)
      throw new PlatformError('telegram', `${method}: ${body.description ?? `HTTP ${status}`}`, status);
    return body.result as T;
  },
  getMe: (base: string, token: string) =>
    telegram.call<{ id: number; username?: string; first_name?: string }>(base, token, 'getMe', {}),
  setWebhook: (base: string, token: string, url: string, secretToken: string) =>
    telegram.call<boolean>(base, token, 'setWebhook', {
      url,
      secret_token: secretToken,
      allowed_updates: ['message', 'edited_message', 'channel_post'],
    }),
  deleteWebhook: (base: string, token: string) => telegram.call<boolean>(base, token, 'deleteWebhook', {}),
  sendMessage: (base: string, token: string, chatId: string, text: string) =>
    telegram.call<{ message_id: number }>(base, token, 'sendMessage', { chat_id: chatId, text }),
};

// OAuth 2.0 token endpoints (Discord: RFC 6749 errors; Slack: `{ ok: false, error }`).

export async function exchangeCode(
  platform: 'discord' | 'slack',
  tokenUrl: string,
  fields: { clientId: string; clientSecret: string; code: string; redirectUri: string; codeVerifier?: string },
): Promise<Record<string, any>> {
  const { status, body } = await callJson(platform, tokenUrl, {
    method: 'POST',
    headers: formHeaders(platform),
    body: form({
      grant_type: 'authorization_code',
      code: fields.code,
      redirect_uri: fields.redirectUri,
      client_id: fields.clientId,
      client_secret: fields.clientSecret,
      code_verifier: fields.codeVerifier,
    }),
  });
  return oauthResult(platform, status, body);
}

export async function refreshGrant(
  platform: 'discord',
  tokenUrl: string,
  fields: { clientId: string; clientSecret: string; refreshToken: string },
): Promise<Record<string, any>> {
  const { status, body } = await callJson(platform, tokenUrl, {
    method: 'POST',
    headers: formHeaders(platform),
    body: form({
      grant_type: 'refresh_token',
      refresh_token: fields.refreshToken,
      client_id: fields.clientId,
      client_secret: fields.clientSecret,
    }),
  });
  return oauthResult(platform, status, body);
}

// Both token URLs take only application/x-www-form-urlencoded (Discord: "JSON content is not
// permitted"; Slack's oauth.v2.access lists no other content type).
function formHeaders(platform: 'discord' | 'slack'): Record<string, string> {
  return {
    'content-type': 'application/x-www-form-urlencoded',
    ...(platform === 'discord' ? { 'user-agent': DISCORD_USER_AGENT } : {}),
  };
}

function oauthResult(platform: string, status: number, body: any): Record<string, any> {
  if (body.ok === false) throw new PlatformError(platform, `token exchange: ${body.error}`, status);
  if (status >= 400 || body.error)
    throw new PlatformError(
      platform,
      `token exchange: ${body.error ?? `HTTP ${status}`}${body.error_description ? ` (${body.error_description})` : ''}`,
      status,
    );
  return body;
}

// Discord REST: https://discord.com/developers/docs/resources/message#create-message

export const discord = {
  async getBot(apiBase: string, botToken: string): Promise<{ id: string; username: string }> {
    const { status, body } = await callJson('discord', `${apiBase}/users/@me`, {
      headers: { authorization: `Bot ${botToken}`, 'user-agent': DISCORD_USER_AGENT },
    });
    if (status >= 400)
      throw new PlatformError('discord', `bot token check: ${body.message ?? `HTTP ${status}`}`, status);
    return body;
  },
  async sendMessage(apiBase: string, botToken: string, channelId: string, content: string): Promise<{ id: string }> {
    if (!/^\d{1,25}$/.test(channelId))
      throw new PlatformError('discord', `"to" must be a channel id (digits), got "${channelId}"`, 400);
    const { status, body } = await callJson('discord', `${apiBase}/channels/${channelId}/messages`, {
      method: 'POST',
      headers: {
        authorization: `Bot ${botToken}`,
        'content-type': 'application/json',
        'user-agent': DISCORD_USER_AGENT,
      },
      body: JSON.stringify({ content }),
    });
    if (status >= 400)
      throw new PlatformError('discord', `create message: ${body.message ?? `HTTP ${status}`}`, status);
    return body;
  },
};

// Slack Web API: https://api.slack.com/methods/chat.postMessage (HTTP 200 with `ok: false` on errors).

export const slack = {
  async postMessage(
    apiBase: string,
    botToken: string,
    channel: string,
    text: string,
  ): Promise<{ ts: string; channel: string }> {
    const { status, body } = await callJson('slack', `${apiBase}/chat.postMessage`, {
      method: 'POST',
      headers: { authorization: `Bearer ${botToken}`, 'content-type': 'application/json; charset=utf-8' },
      body: JSON.stringify({ channel, text }),
    });
    if (body.ok !== true)
      throw new PlatformError('slack', `chat.postMessage: ${body.error ?? `HTTP ${status}`}`, status);
    return body;
  },
};
