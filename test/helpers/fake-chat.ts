/**
 * Local stand-ins for the chat platforms gatehouse's channels talk to: the Telegram Bot API,
 * Discord (OAuth2 bot install, REST v10, signed interactions) and Slack (OAuth v2, Web API,
 * signed Events API requests). Each fake is its own node:http server on 127.0.0.1:0; a test
 * points a channel at `fake.url` instead of api.telegram.org, discord.com or slack.com.
 *
 * Paths, bodies and error envelopes follow the platforms' public docs; only what the channels
 * use is implemented. Error texts the docs do not spell out are the ones the platforms have been
 * seen to answer; the few the fake had to invent are marked "fake's wording".
 */
import http from 'node:http';
import https from 'node:https';
import { createHash, createHmac, generateKeyPairSync, randomBytes, randomInt, sign, type KeyObject } from 'node:crypto';
import type { AddressInfo } from 'node:net';

// ─── Shared: what every fake records and accepts ─────────────────────────────────────────────

export interface RecordedCall {
  method: string;
  /** Percent-decoded path without the query. Telegram's holds the bot token: '/bot123:AA…/sendMessage'. */
  path: string;
  query: Record<string, string | string[]>;
  headers: http.IncomingHttpHeaders;
  /** Parsed JSON or form body; the raw text when it does not parse; undefined when empty. */
  body: unknown;
  /** The status the fake answered with. */
  status?: number;
}

export interface FailureMatcher {
  method?: string;
  /** A string matches the path exactly; a RegExp is tested against it. */
  path: RegExp | string;
}

export interface InjectedFailure {
  status: number;
  /** Default: the platform's own error envelope for `status` (429s carry Retry-After). */
  body?: unknown;
  headers?: Record<string, string>;
  /** How many matching requests fail. Default 1. */
  times?: number;
}

/** Chat or channel ids the fake knows; 'any' accepts every id. */
export type KnownIds = 'any' | readonly (string | number)[];

/** What every fake has. */
export interface FakeChatServer {
  /** 'http://127.0.0.1:PORT', no trailing slash. */
  url: string;
  calls: RecordedCall[];
  /** The next matching calls (checked before authentication) answer `failure` instead. */
  failNext(matcher: FailureMatcher, failure: InjectedFailure): void;
  close(): Promise<void>;
}

/** A signed request, ready to POST: the platform's signature headers and the exact body signed. */
export interface SignedRequest {
  headers: Record<string, string>;
  body: string;
}

/** What a webhook target answered to a request the fake made. */
export interface DeliveryResult {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
}

// ─── Shared: server plumbing ─────────────────────────────────────────────────────────────────

interface Exchange {
  method: string;
  path: string;
  url: URL;
  headers: http.IncomingHttpHeaders;
  contentType: string;
  raw: string;
  body: unknown;
  /** False when a body was sent that is neither JSON nor a form, or is malformed JSON. */
  parsed: boolean;
}

interface Reply {
  status: number;
  /** A string is sent as is; anything else as JSON. */
  body?: unknown;
  headers?: Record<string, string>;
}

/** Thrown by a handler to answer with `reply` (a platform error). */
class Refusal extends Error {
  constructor(readonly reply: Reply) {
    super(`refused with ${reply.status}`);
  }
}

/** One node:http server on 127.0.0.1:0 that records calls, injects failures and routes the rest. */
abstract class FakeHttpServer implements FakeChatServer {
  url = '';
  calls: RecordedCall[] = [];
  private readonly failures: { matcher: FailureMatcher; failure: InjectedFailure; left: number }[] = [];
  private readonly inflight = new Set<http.ClientRequest>();
  private readonly server = http.createServer((req, res) => void this.handle(req, res).catch(() => res.destroy()));

  protected abstract route(x: Exchange): Reply;
  /** The platform's error envelope for an injected failure that brings no body. */
  protected abstract failureReply(status: number): Reply;

  async listen(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async close(): Promise<void> {
    for (const req of this.inflight) req.destroy();
    await new Promise<void>((resolve) => {
      this.server.closeAllConnections();
      this.server.close(() => resolve());
    });
  }

  failNext(matcher: FailureMatcher, failure: InjectedFailure): void {
    this.failures.push({ matcher, failure, left: failure.times ?? 1 });
  }

  /** One POST on a fresh connection (no keep-alive, so the target can close promptly). */
  protected deliver(target: string, headers: Record<string, string>, body: string, timeoutMs = 10_000): Promise<DeliveryResult> {
    const url = new URL(target);
    const transport = url.protocol === 'https:' ? https : http;
    return new Promise((resolve, reject) => {
      const req = transport.request(url, { method: 'POST', headers: { ...headers, 'Content-Length': String(Buffer.byteLength(body)) }, agent: false, timeout: timeoutMs }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', reject);
      });
      this.inflight.add(req);
      req.on('close', () => this.inflight.delete(req));
      req.on('timeout', () => req.destroy(new Error(`delivery to ${target} timed out after ${timeoutMs} ms`)));
      req.on('error', reject);
      req.end(body);
    });
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const raw = Buffer.concat(chunks).toString('utf8');
    const url = new URL(req.url ?? '/', 'http://fake.invalid');
    let path: string;
    try {
      path = decodeURIComponent(url.pathname);
    } catch {
      path = url.pathname;
    }
    const method = req.method ?? 'GET';
    const contentType = (req.headers['content-type'] ?? '').toLowerCase();
    const { body, parsed } = parseBody(raw, contentType);
    const call: RecordedCall = { method, path, query: queryObject(url.searchParams), headers: req.headers, body };
    this.calls.push(call);
    let reply: Reply;
    try {
      const x: Exchange = { method, path, url, headers: req.headers, contentType, raw, body, parsed };
      reply = this.injectedFailure(x) ?? this.route(x);
    } catch (err) {
      reply = err instanceof Refusal ? err.reply : { status: 500, body: `fake-chat: ${(err as Error).message}`, headers: { 'content-type': 'text/plain' } };
    }
    call.status = reply.status;
    const headers: Record<string, string> = { ...reply.headers };
    let text = '';
    if (reply.body !== undefined) {
      text = typeof reply.body === 'string' ? reply.body : JSON.stringify(reply.body);
      headers['content-type'] ??= 'application/json';
    }
    res.writeHead(reply.status, headers);
    res.end(text);
  }

  private injectedFailure(x: Exchange): Reply | undefined {
    const i = this.failures.findIndex(({ matcher: m }) =>
      (!m.method || m.method.toUpperCase() === x.method) && (typeof m.path === 'string' ? m.path === x.path : m.path.test(x.path)));
    if (i < 0) return undefined;
    const entry = this.failures[i]!;
    if (--entry.left <= 0) this.failures.splice(i, 1);
    const { status, body, headers } = entry.failure;
    const fallback = this.failureReply(status);
    return { status, body: body ?? fallback.body, headers: { ...fallback.headers, ...headers } };
  }
}

/** A set of ids, or 'any'. Ids compare as strings, so 123 and '123' (a form field) are one chat. */
class IdSet {
  private ids: Set<string> | 'any' = 'any';
  constructor(ids: KnownIds = 'any') {
    this.set(ids);
  }
  set(ids: KnownIds): void {
    this.ids = ids === 'any' ? 'any' : new Set(ids.map(String));
  }
  has(id: string): boolean {
    return this.ids === 'any' || this.ids.has(id);
  }
}

// ─── Telegram Bot API (https://core.telegram.org/bots/api) ──────────────────────────────────

export interface TelegramBot {
  token: string;
  id: number;
  username: string;
  firstName: string;
}

/** What setWebhook registered; `secretToken` is never shown by getWebhookInfo, only here. */
export interface TelegramWebhook {
  url: string;
  secretToken: string | undefined;
  allowedUpdates: string[] | undefined;
  maxConnections: number;
  lastErrorDate?: number;
  lastErrorMessage?: string;
}

export interface TelegramUser {
  id: number;
  is_bot: boolean;
  first_name: string;
  username?: string;
}

export interface TelegramChat {
  id: number;
  type: 'private' | 'group' | 'supergroup' | 'channel';
  username?: string;
}

export interface TelegramMessage {
  message_id: number;
  from: TelegramUser;
  chat: TelegramChat;
  /** Unix seconds. */
  date: number;
  text: string;
}

export interface SentTelegramMessage {
  token: string;
  /** chat_id as sent, as a string. */
  chatId: string;
  text: string;
  /** Every parameter of the call (query and body). */
  params: Record<string, unknown>;
  message: TelegramMessage;
}

export interface TelegramDelivery {
  token: string;
  url: string;
  update: Record<string, unknown>;
  status?: number;
  error?: string;
}

export interface FakeTelegramOptions {
  /** The default bot. Default: a random token, username 'gatehouse_test_bot'. */
  bot?: { token?: string; username?: string; firstName?: string };
  /** Chats sendMessage knows. Default 'any'. */
  chats?: KnownIds;
}

export interface FakeTelegram extends FakeChatServer {
  /** The default bot's token: `${url}/bot${token}/getMe` works. */
  token: string;
  bot: TelegramBot;
  sent: SentTelegramMessage[];
  deliveries: TelegramDelivery[];
  addBot(token: string, profile: { username: string; firstName?: string }): TelegramBot;
  /** The webhook setWebhook registered for a bot (default: the default bot), with its secret_token. */
  registeredWebhook(token?: string): TelegramWebhook | undefined;
  /** sendMessage answers 'Bad Request: chat not found' for any other chat_id. */
  setKnownChats(ids: KnownIds): void;
  /**
   * POSTs `update` (update_id added unless given) to the bot's webhook as Telegram does: JSON,
   * with X-Telegram-Bot-Api-Secret-Token when a secret_token was set. Resolves with the status;
   * a non-2xx status or network error is kept as getWebhookInfo's last_error_*. No retries.
   */
  deliverUpdate(token: string, update: Record<string, unknown>): Promise<number>;
}

export async function startFakeTelegram(options: FakeTelegramOptions = {}): Promise<FakeTelegram> {
  const fake = new FakeTelegramServer(options);
  await fake.listen();
  return fake;
}

/** '<bot id>:<secret>', as BotFather issues them. */
const TELEGRAM_TOKEN = /^(\d+):[A-Za-z0-9_-]+$/;
const TELEGRAM_SECRET_TOKEN = /^[A-Za-z0-9_-]{1,256}$/;
/** Telegram answers webhooks only on these ports. */
const TELEGRAM_WEBHOOK_PORTS = ['443', '80', '88', '8443'];

interface TelegramBotState extends TelegramBot {
  webhook?: TelegramWebhook;
  nextUpdateId: number;
  /** message_id counts per chat, as in Telegram. */
  messageIds: Map<string, number>;
}

const tgOk = (result: unknown, description?: string): Reply => ({ status: 200, body: { ok: true, result, ...(description ? { description } : {}) } });
const tgError = (code: number, description: string, extra: Record<string, unknown> = {}): Reply => ({ status: code, body: { ok: false, error_code: code, description, ...extra } });
const tgRefusal = (code: number, description: string) => new Refusal(tgError(code, description));

class FakeTelegramServer extends FakeHttpServer implements FakeTelegram {
  token: string;
  bot: TelegramBot;
  sent: SentTelegramMessage[] = [];
  deliveries: TelegramDelivery[] = [];
  private readonly bots = new Map<string, TelegramBotState>();
  private readonly chats: IdSet;

  constructor(options: FakeTelegramOptions) {
    super();
    const b = options.bot ?? {};
    this.token = b.token ?? `${randomInt(1_000_000_000, 8_000_000_000)}:AA${randomBytes(25).toString('base64url').slice(0, 33)}`;
    this.bot = this.addBot(this.token, { username: b.username ?? 'gatehouse_test_bot', firstName: b.firstName });
    this.chats = new IdSet(options.chats);
  }

  addBot(token: string, profile: { username: string; firstName?: string }): TelegramBot {
    const id = TELEGRAM_TOKEN.exec(token)?.[1];
    if (!id) throw new Error(`fake-telegram: a bot token is '<digits>:<secret>', got ${token}`);
    const bot: TelegramBotState = {
      token, id: Number(id), username: profile.username, firstName: profile.firstName ?? 'Gatehouse',
      nextUpdateId: randomInt(100_000_000, 900_000_000), messageIds: new Map(),
    };
    this.bots.set(token, bot);
    return { token, id: bot.id, username: bot.username, firstName: bot.firstName };
  }

  registeredWebhook(token = this.token): TelegramWebhook | undefined {
    const hook = this.bots.get(token)?.webhook;
    return hook && structuredClone(hook);
  }

  setKnownChats(ids: KnownIds): void {
    this.chats.set(ids);
  }

  protected route(x: Exchange): Reply {
    // https://api.telegram.org/bot<token>/<method>; method names are case-insensitive.
    const m = /^\/bot([^/]+)\/([A-Za-z]+)$/.exec(x.path);
    if (!m || !TELEGRAM_TOKEN.test(m[1]!)) return tgError(404, 'Not Found');
    const bot = this.bots.get(m[1]!);
    if (!bot) return tgError(401, 'Unauthorized');
    if (!x.parsed && x.contentType.includes('json')) return tgError(400, "Bad Request: can't parse JSON object"); // fake's wording
    // Parameters come from the query string, a JSON body or a form; all may be mixed.
    const params: Record<string, unknown> = { ...Object.fromEntries(x.url.searchParams), ...(isRecord(x.body) ? x.body : {}) };
    switch (m[2]!.toLowerCase()) {
      case 'getme':
        return tgOk({
          id: bot.id, is_bot: true, first_name: bot.firstName, username: bot.username, can_join_groups: true,
          can_read_all_group_messages: false, supports_inline_queries: false, can_connect_to_business: false, has_main_web_app: false,
        });
      case 'setwebhook':
        return this.setWebhook(bot, params);
      case 'deletewebhook':
        return this.removeWebhook(bot);
      case 'getwebhookinfo':
        return tgOk(webhookInfo(bot.webhook));
      case 'getupdates':
        if (bot.webhook) return tgError(409, "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first");
        return tgOk([]);
      case 'sendmessage':
        return this.sendMessage(bot, params);
      default:
        return tgError(404, 'Not Found');
    }
  }

  protected failureReply(status: number): Reply {
    if (status === 429) return tgError(429, 'Too Many Requests: retry after 1', { parameters: { retry_after: 1 } });
    return tgError(status, http.STATUS_CODES[status] ?? 'Error');
  }

  private setWebhook(bot: TelegramBotState, p: Record<string, unknown>): Reply {
    const url = scalar(p.url) ?? '';
    // "Use an empty string to remove webhook integration"; a missing url does the same.
    if (url === '') return this.removeWebhook(bot);
    checkTelegramWebhookUrl(url);
    const secret = scalar(p.secret_token) || undefined;
    if (secret !== undefined && !TELEGRAM_SECRET_TOKEN.test(secret)) {
      throw tgRefusal(400, secret.length > 256 ? 'Bad Request: secret token is too long' : 'Bad Request: secret token contains unallowed characters');
    }
    // "If not specified, the previous setting will be used."
    const allowedUpdates = p.allowed_updates === undefined ? bot.webhook?.allowedUpdates : parseAllowedUpdates(p.allowed_updates);
    const maxConnections = p.max_connections === undefined ? 40 : Math.min(100, Math.max(1, Number(scalar(p.max_connections)) || 40));
    const next: TelegramWebhook = { url, secretToken: secret, allowedUpdates, maxConnections };
    const previous = bot.webhook;
    if (previous && previous.url === url && previous.secretToken === secret && previous.maxConnections === maxConnections
      && JSON.stringify(previous.allowedUpdates) === JSON.stringify(allowedUpdates)) {
      return tgOk(true, 'Webhook is already set');
    }
    bot.webhook = next;
    return tgOk(true, 'Webhook was set');
  }

  private removeWebhook(bot: TelegramBotState): Reply {
    if (!bot.webhook) return tgOk(true, 'Webhook is already deleted');
    bot.webhook = undefined;
    return tgOk(true, 'Webhook was deleted');
  }

  private sendMessage(bot: TelegramBotState, p: Record<string, unknown>): Reply {
    const chatId = scalar(p.chat_id);
    if (!chatId) throw tgRefusal(400, 'Bad Request: chat_id is empty');
    if (!this.chats.has(chatId)) throw tgRefusal(400, 'Bad Request: chat not found');
    const text = scalar(p.text) ?? '';
    if (!text.trim()) throw tgRefusal(400, 'Bad Request: message text is empty');
    if (text.length > 4096) throw tgRefusal(400, 'Bad Request: message is too long');
    const messageId = (bot.messageIds.get(chatId) ?? 0) + 1;
    bot.messageIds.set(chatId, messageId);
    const message: TelegramMessage = {
      message_id: messageId,
      from: { id: bot.id, is_bot: true, first_name: bot.firstName, username: bot.username },
      chat: telegramChat(chatId),
      date: Math.floor(Date.now() / 1000),
      text,
    };
    this.sent.push({ token: bot.token, chatId, text, params: p, message });
    return tgOk(message);
  }

  async deliverUpdate(token: string, update: Record<string, unknown>): Promise<number> {
    const bot = this.bots.get(token);
    if (!bot) throw new Error(`fake-telegram: no bot with token ${token}`);
    const hook = bot.webhook;
    if (!hook) throw new Error(`fake-telegram: bot ${bot.username} has no webhook; call setWebhook first`);
    const body = { update_id: bot.nextUpdateId++, ...update };
    const headers: Record<string, string> = { 'Content-Type': 'application/json' };
    if (hook.secretToken) headers['X-Telegram-Bot-Api-Secret-Token'] = hook.secretToken;
    const record: TelegramDelivery = { token, url: hook.url, update: body };
    this.deliveries.push(record);
    try {
      const { status } = await this.deliver(hook.url, headers, JSON.stringify(body));
      record.status = status;
      if (status < 200 || status > 299) {
        hook.lastErrorDate = Math.floor(Date.now() / 1000);
        hook.lastErrorMessage = `Wrong response from the webhook: ${status} ${http.STATUS_CODES[status] ?? ''}`.trim();
      }
      return status;
    } catch (err) {
      record.error = (err as Error).message;
      hook.lastErrorDate = Math.floor(Date.now() / 1000);
      hook.lastErrorMessage = (err as NodeJS.ErrnoException).code === 'ECONNREFUSED' ? 'Connection refused' : (err as Error).message;
      throw err;
    }
  }
}

/**
 * Telegram wants https on 443, 80, 88 or 8443. The fake also takes plain http to a loopback host
 * on any port, so tests can receive deliveries; the real Telegram refuses loopback addresses.
 */
function checkTelegramWebhookUrl(raw: string): void {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw tgRefusal(400, "Bad Request: bad webhook: can't parse URL"); // fake's wording
  }
  if (url.protocol === 'http:' && isLoopback(url.hostname)) return;
  if (url.protocol !== 'https:') throw tgRefusal(400, 'Bad Request: bad webhook: An HTTPS URL must be provided for webhook');
  if (!TELEGRAM_WEBHOOK_PORTS.includes(url.port || '443')) throw tgRefusal(400, 'Bad Request: bad webhook: Webhook can be set up only on ports 80, 88, 443 or 8443');
}

/** allowed_updates: an array in JSON, a JSON-serialized array in a form or query. */
function parseAllowedUpdates(value: unknown): string[] {
  let list = value;
  if (typeof value === 'string') {
    try {
      list = value === '' ? [] : JSON.parse(value);
    } catch {
      list = undefined;
    }
  }
  if (!Array.isArray(list) || !list.every((u) => typeof u === 'string')) throw tgRefusal(400, "Bad Request: can't parse allowed updates"); // fake's wording
  return list;
}

/** getWebhookInfo's WebhookInfo: url '' when none is set; the secret_token is never shown. */
function webhookInfo(hook: TelegramWebhook | undefined): Record<string, unknown> {
  if (!hook) return { url: '', has_custom_certificate: false, pending_update_count: 0 };
  const host = new URL(hook.url).hostname;
  return {
    url: hook.url,
    has_custom_certificate: false,
    pending_update_count: 0,
    ...(/^[\d.]+$/.test(host) ? { ip_address: host } : {}),
    ...(hook.lastErrorDate ? { last_error_date: hook.lastErrorDate, last_error_message: hook.lastErrorMessage } : {}),
    max_connections: hook.maxConnections,
    ...(hook.allowedUpdates?.length ? { allowed_updates: hook.allowedUpdates } : {}),
  };
}

/** A Chat for a chat_id: -100… supergroups, other negatives groups, positives users, '@name' channels. */
function telegramChat(chatId: string): TelegramChat {
  if (chatId.startsWith('@')) {
    const id = -(1_000_000_000_000 + (parseInt(createHash('sha256').update(chatId).digest('hex').slice(0, 8), 16) % 1_000_000_000));
    return { id, type: 'channel', username: chatId.slice(1) };
  }
  const id = Number(chatId);
  return { id, type: chatId.startsWith('-100') ? 'supergroup' : id < 0 ? 'group' : 'private' };
}

// ─── Discord (https://discord.com/developers/docs) ──────────────────────────────────────────

export interface FakeDiscordClient {
  /** The application id (a snowflake); also the bot user's id. */
  clientId: string;
  clientSecret: string;
  /** Registered redirect URIs, matched exactly. Omitted: any http(s) URI (the fake's leniency). */
  redirectUris?: string[];
}

export interface DiscordGuild {
  id: string;
  name: string;
}

export interface DiscordUser {
  id: string;
  username: string;
  discriminator: string;
  global_name: string | null;
  avatar: string | null;
  bot?: boolean;
}

export interface DiscordMessage {
  id: string;
  type: number;
  channel_id: string;
  content: string;
  author: DiscordUser;
  timestamp: string;
  edited_timestamp: null;
  tts: boolean;
  mention_everyone: boolean;
  mentions: unknown[];
  mention_roles: string[];
  attachments: unknown[];
  embeds: unknown[];
  components: unknown[];
  pinned: boolean;
  flags: number;
  nonce?: string | number;
}

export interface SentDiscordMessage {
  channelId: string;
  content: string;
  /** The request body as sent. */
  body: Record<string, unknown>;
  message: DiscordMessage;
}

export interface FakeDiscordOptions {
  /** Default: [DISCORD_CLIENT]. */
  clients?: FakeDiscordClient[];
  /** Default: a random token in Discord's shape. */
  botToken?: string;
  /** Channels the bot can post to. Default 'any'. */
  channels?: KnownIds;
  /** The guild the consenting user picks. Default: a fresh snowflake, 'Gatehouse Test'. */
  guild?: DiscordGuild;
  /** expires_in of access tokens (Discord: 604800 s, one week). */
  accessTokenTtlSeconds?: number;
}

export interface FakeDiscord extends FakeChatServer {
  /** The first configured client. */
  client: FakeDiscordClient;
  /** The bot token that `Authorization: Bot <token>` must carry. */
  botToken: string;
  botUser: DiscordUser;
  /** The interactions public key as the Developer Portal shows it: 32 raw bytes, 64 hex chars. */
  publicKeyHex: string;
  sent: SentDiscordMessage[];
  addClient(client: FakeDiscordClient): void;
  /** Replaces the bot token (as "Reset Token" does): the old one answers 401 from now on. */
  setBotToken(token: string): void;
  setKnownChannels(ids: KnownIds): void;
  /** What the next visit to the authorize page does: approve (into `guild`), or deny. */
  setConsent(consent: { deny?: boolean; guildId?: string; guildName?: string }): void;
  /** Every issued access token answers 401 from now on. */
  expireAccessTokens(): void;
  /** Every refresh token answers invalid_grant from now on. */
  revokeRefreshTokens(): void;
  /** Signs like Discord signs interactions: Ed25519 over `timestamp + body`, hex. */
  signInteraction(body: string | object, timestamp?: number | string): SignedRequest;
  /** Signs `body` and POSTs it to an interactions endpoint as Discord does. */
  deliverInteraction(url: string, body: string | object): Promise<DeliveryResult>;
}

export const DISCORD_CLIENT: FakeDiscordClient = {
  clientId: '1187654321098765432',
  clientSecret: 'fake-discord-client-secret-0123456789',
};

export async function startFakeDiscord(options: FakeDiscordOptions = {}): Promise<FakeDiscord> {
  const fake = new FakeDiscordServer(options);
  await fake.listen();
  return fake;
}

const DISCORD_EPOCH = 1_420_070_400_000n;
const SNOWFLAKE = /^\d{17,20}$/;

const discordError = (status: number, message: string, code: number, extra: Record<string, unknown> = {}): Reply => ({ status, body: { message, code, ...extra } });
const discordUnauthorized = () => new Refusal(discordError(401, '401: Unauthorized', 0));
/** OAuth2 endpoints answer RFC 6749 errors. */
const oauthRefusal = (status: number, error: string, description?: string) =>
  new Refusal({ status, body: { error, ...(description ? { error_description: description } : {}) } });

interface DiscordCode {
  clientId: string;
  redirectUri: string;
  scopes: string[];
  guild: DiscordGuild;
  challenge?: string;
  expiresAt: number;
  used: boolean;
}

interface DiscordGrant {
  clientId: string;
  scopes: string[];
  guild: DiscordGuild;
  expiresAt: number;
  revoked: boolean;
}

class FakeDiscordServer extends FakeHttpServer implements FakeDiscord {
  client: FakeDiscordClient;
  botToken: string;
  botUser: DiscordUser;
  publicKeyHex: string;
  sent: SentDiscordMessage[] = [];
  private readonly clients = new Map<string, FakeDiscordClient>();
  private readonly channels: IdSet;
  private readonly accessTokenTtl: number;
  private readonly privateKey: KeyObject;
  private consent: { deny: boolean; guild: DiscordGuild };
  private readonly codes = new Map<string, DiscordCode>();
  private readonly accessTokens = new Map<string, DiscordGrant>();
  private readonly refreshTokens = new Map<string, DiscordGrant>();
  /** The Discord user who clicks "Authorize". */
  private readonly installer: DiscordUser = { id: '1000000000000000001', username: 'alice', discriminator: '0', global_name: 'Alice', avatar: null };
  private sequence = 0n;

  constructor(options: FakeDiscordOptions) {
    super();
    const clients = options.clients ?? [DISCORD_CLIENT];
    for (const c of clients) this.clients.set(c.clientId, c);
    this.client = clients[0]!;
    this.botUser = { id: this.client.clientId, username: 'Gatehouse', discriminator: '0000', global_name: null, avatar: null, bot: true };
    // Discord's shape: base64(bot user id) . timestamp . HMAC.
    this.botToken = options.botToken ?? `${Buffer.from(this.botUser.id).toString('base64url')}.${randomBytes(4).toString('base64url')}.${randomBytes(28).toString('base64url')}`;
    this.channels = new IdSet(options.channels);
    this.accessTokenTtl = options.accessTokenTtlSeconds ?? 604_800;
    this.consent = { deny: false, guild: options.guild ?? { id: this.snowflake(), name: 'Gatehouse Test' } };
    const { publicKey, privateKey } = generateKeyPairSync('ed25519');
    this.privateKey = privateKey;
    this.publicKeyHex = Buffer.from(publicKey.export({ format: 'jwk' }).x!, 'base64url').toString('hex');
  }

  addClient(client: FakeDiscordClient): void {
    this.clients.set(client.clientId, client);
  }

  setBotToken(token: string): void {
    this.botToken = token;
  }

  setKnownChannels(ids: KnownIds): void {
    this.channels.set(ids);
  }

  setConsent(consent: { deny?: boolean; guildId?: string; guildName?: string }): void {
    const guild = { id: consent.guildId ?? this.consent.guild.id, name: consent.guildName ?? this.consent.guild.name };
    this.consent = { deny: consent.deny ?? false, guild };
  }

  expireAccessTokens(): void {
    for (const g of this.accessTokens.values()) g.revoked = true;
  }

  revokeRefreshTokens(): void {
    for (const g of this.refreshTokens.values()) g.revoked = true;
  }

  signInteraction(body: string | object, timestamp: number | string = Math.floor(Date.now() / 1000)): SignedRequest {
    const text = typeof body === 'string' ? body : JSON.stringify(body);
    const signature = sign(null, Buffer.from(`${timestamp}${text}`), this.privateKey).toString('hex');
    return { headers: { 'X-Signature-Ed25519': signature, 'X-Signature-Timestamp': String(timestamp) }, body: text };
  }

  deliverInteraction(url: string, body: string | object): Promise<DeliveryResult> {
    const signed = this.signInteraction(body);
    return this.deliver(url, { 'Content-Type': 'application/json', 'User-Agent': 'Discord-Interactions/1.0 (+https://discord.com)', ...signed.headers }, signed.body);
  }

  protected route(x: Exchange): Reply {
    // discord.com serves the API under /api, with or without a version (/api/v10/…).
    const api = /^\/api(?:\/v\d+)?(\/.*)$/.exec(x.path)?.[1];
    if (x.method === 'GET' && (x.path === '/oauth2/authorize' || api === '/oauth2/authorize')) return this.authorize(x);
    if (api === undefined) return htmlPage(404, 'Not Found');
    if (x.method === 'POST' && api === '/oauth2/token') return this.token(x);
    if (x.method === 'GET' && api === '/oauth2/@me') return this.currentAuthorization(x);
    if (x.method === 'GET' && api === '/users/@me') return this.currentUser(x);
    const channel = /^\/channels\/([^/]+)\/messages$/.exec(api)?.[1];
    if (channel !== undefined && x.method === 'POST') return this.createMessage(x, channel);
    if (channel !== undefined) return discordError(405, '405: Method Not Allowed', 0);
    return discordError(404, '404: Not Found', 0);
  }

  protected failureReply(status: number): Reply {
    if (status === 429) return { status, body: { message: 'You are being rate limited.', retry_after: 1, global: false }, headers: { 'retry-after': '1', 'x-ratelimit-scope': 'user' } };
    return discordError(status, `${status}: ${http.STATUS_CODES[status] ?? 'Error'}`, 0);
  }

  // ── OAuth2: the bot install ("advanced bot authorization") and tokens ──

  /** The consent page, already clicked: 302 back with code, state, guild_id and permissions. */
  private authorize(x: Exchange): Reply {
    const q = x.url.searchParams;
    const client = this.clients.get(q.get('client_id') ?? '');
    if (!client) return htmlPage(400, 'Unknown Application');
    const redirectUri = q.get('redirect_uri') ?? '';
    // A bad redirect_uri gets an error page, never a redirect.
    if (!redirectAllowed(client.redirectUris, redirectUri)) return htmlPage(400, 'Invalid OAuth2 redirect_uri');
    const back = new URL(redirectUri);
    const state = q.get('state');
    const refuse = (error: string, description: string): Reply => {
      back.searchParams.set('error', error);
      back.searchParams.set('error_description', description);
      if (state !== null) back.searchParams.set('state', state);
      return redirectTo(back);
    };
    if (q.get('response_type') !== 'code') return refuse('unsupported_response_type', 'The authorization server does not support obtaining an authorization code using this method.');
    const scopes = (q.get('scope') ?? '').split(' ').filter(Boolean);
    if (!scopes.length) return refuse('invalid_scope', 'The requested scope is invalid, unknown, or malformed.');
    const challenge = q.get('code_challenge') ?? undefined;
    if (challenge && q.get('code_challenge_method') !== 'S256') return refuse('invalid_request', 'Unsupported "code_challenge_method"');
    if (this.consent.deny) return refuse('access_denied', 'The resource owner or authorization server denied the request');

    const code = randomAlnum(30);
    this.codes.set(code, { clientId: client.clientId, redirectUri, scopes, guild: { ...this.consent.guild }, challenge, expiresAt: Date.now() + 600_000, used: false });
    back.searchParams.set('code', code);
    if (state !== null) back.searchParams.set('state', state);
    if (scopes.includes('bot')) {
      back.searchParams.set('guild_id', this.consent.guild.id);
      back.searchParams.set('permissions', q.get('permissions') ?? '0');
    }
    return redirectTo(back);
  }

  /** POST /api/oauth2/token, form-encoded; the client by client_secret_post or HTTP Basic. */
  private token(x: Exchange): Reply {
    const form = x.contentType.startsWith('application/x-www-form-urlencoded') && isRecord(x.body) ? (x.body as Record<string, string>) : {};
    const creds = clientCredentials(x.headers, form);
    const client = this.clients.get(creds.id ?? '');
    if (!client || creds.secret !== client.clientSecret) throw oauthRefusal(401, 'invalid_client');

    if (form.grant_type === 'authorization_code') {
      const pending = this.codes.get(form.code ?? '');
      if (!pending || pending.used || pending.expiresAt <= Date.now() || pending.clientId !== client.clientId) {
        throw oauthRefusal(400, 'invalid_grant', 'Invalid "code" in request.');
      }
      pending.used = true;
      if (form.redirect_uri !== pending.redirectUri) throw oauthRefusal(400, 'invalid_grant', 'Invalid "redirect_uri" in request.');
      if (pending.challenge) {
        const verifier = form.code_verifier;
        if (!verifier) throw oauthRefusal(400, 'invalid_request', 'Missing "code_verifier"');
        // RFC 7636 §4.1: 43-128 unreserved characters; Discord enforces the length.
        if (!/^[A-Za-z0-9\-._~]{43,128}$/.test(verifier)) throw oauthRefusal(400, 'invalid_request', 'Invalid "code_verifier"');
        if (createHash('sha256').update(verifier).digest('base64url') !== pending.challenge) throw oauthRefusal(400, 'invalid_grant', 'Invalid "code_verifier"');
      }
      const tokens = this.issueTokens(client.clientId, pending.scopes, pending.guild);
      return { status: 200, body: { ...tokens, ...(pending.scopes.includes('bot') ? { guild: guildObject(pending.guild, this.installer.id) } : {}) } };
    }
    if (form.grant_type === 'refresh_token') {
      const grant = this.refreshTokens.get(form.refresh_token ?? '');
      if (!grant || grant.revoked || grant.clientId !== client.clientId) throw oauthRefusal(400, 'invalid_grant', 'Invalid "refresh_token" in request.');
      // The fake rotates refresh tokens: the one just used is spent.
      this.refreshTokens.delete(form.refresh_token!);
      return { status: 200, body: this.issueTokens(client.clientId, grant.scopes, grant.guild) };
    }
    throw oauthRefusal(400, 'unsupported_grant_type');
  }

  private issueTokens(clientId: string, scopes: string[], guild: DiscordGuild): Record<string, unknown> {
    const accessToken = randomAlnum(30);
    const refreshToken = randomAlnum(30);
    const grant: DiscordGrant = { clientId, scopes, guild, expiresAt: Date.now() + this.accessTokenTtl * 1000, revoked: false };
    this.accessTokens.set(accessToken, grant);
    this.refreshTokens.set(refreshToken, { ...grant, expiresAt: Infinity });
    return { token_type: 'Bearer', access_token: accessToken, expires_in: this.accessTokenTtl, refresh_token: refreshToken, scope: scopes.join(' ') };
  }

  /** Authorization: Bearer <access token>, unexpired. */
  private bearer(x: Exchange): DiscordGrant | undefined {
    const token = /^Bearer (.+)$/.exec(x.headers.authorization ?? '')?.[1];
    const grant = token ? this.accessTokens.get(token) : undefined;
    return grant && !grant.revoked && grant.expiresAt > Date.now() ? grant : undefined;
  }

  /** Authorization: Bot <token>. */
  private requireBot(x: Exchange): void {
    if (x.headers.authorization !== `Bot ${this.botToken}`) throw discordUnauthorized();
  }

  /** GET /oauth2/@me: what an access token grants. */
  private currentAuthorization(x: Exchange): Reply {
    const grant = this.bearer(x);
    if (!grant) throw discordUnauthorized();
    return {
      status: 200,
      body: {
        application: { id: grant.clientId, name: 'Gatehouse', icon: null, description: '', bot_public: true, bot_require_code_grant: false, verify_key: this.publicKeyHex },
        scopes: grant.scopes,
        expires: new Date(grant.expiresAt).toISOString(),
        ...(grant.scopes.includes('identify') ? { user: this.installer } : {}),
      },
    };
  }

  /** GET /users/@me: the bot user for a bot token; the installer for a Bearer token with `identify`. */
  private currentUser(x: Exchange): Reply {
    if ((x.headers.authorization ?? '').startsWith('Bearer ')) {
      const grant = this.bearer(x);
      if (!grant || !grant.scopes.includes('identify')) throw discordUnauthorized();
      return { status: 200, body: this.installer };
    }
    this.requireBot(x);
    return { status: 200, body: { ...this.botUser, public_flags: 0, flags: 0, banner: null, accent_color: null, mfa_enabled: false, verified: true } };
  }

  /** POST /channels/{channel.id}/messages. */
  private createMessage(x: Exchange, channelId: string): Reply {
    this.requireBot(x);
    if (!SNOWFLAKE.test(channelId)) {
      throw new Refusal(discordError(400, 'Invalid Form Body', 50035, { errors: { channel_id: { _errors: [{ code: 'NUMBER_TYPE_COERCE', message: `Value "${channelId}" is not snowflake.` }] } } }));
    }
    if (!this.channels.has(channelId)) throw new Refusal(discordError(404, 'Unknown Channel', 10003));
    if (!x.parsed) throw new Refusal(discordError(400, 'The request body contains invalid JSON.', 50109));
    const body = isRecord(x.body) ? x.body : {};
    const content = typeof body.content === 'string' ? body.content : '';
    const hasOther = ['embeds', 'components', 'sticker_ids', 'attachments', 'poll'].some((k) => Array.isArray(body[k]) ? body[k].length > 0 : body[k] !== undefined);
    if (!content && !hasOther) throw new Refusal(discordError(400, 'Cannot send an empty message', 50006));
    if (content.length > 2000) {
      throw new Refusal(discordError(400, 'Invalid Form Body', 50035, { errors: { content: { _errors: [{ code: 'BASE_TYPE_MAX_LENGTH', message: 'Must be 2000 or fewer in length.' }] } } }));
    }
    const message: DiscordMessage = {
      id: this.snowflake(), type: 0, channel_id: channelId, content, author: this.botUser,
      timestamp: new Date().toISOString().replace(/\.(\d{3})Z$/, '.$1000+00:00'), edited_timestamp: null,
      tts: body.tts === true, mention_everyone: false, mentions: [], mention_roles: [], attachments: [],
      embeds: Array.isArray(body.embeds) ? body.embeds : [], components: Array.isArray(body.components) ? body.components : [],
      pinned: false, flags: 0,
      ...(typeof body.nonce === 'string' || typeof body.nonce === 'number' ? { nonce: body.nonce } : {}),
    };
    this.sent.push({ channelId, content, body, message });
    return { status: 200, body: message };
  }

  /** A snowflake: milliseconds since the Discord epoch << 22, then worker, process and increment bits. */
  private snowflake(): string {
    return (((BigInt(Date.now()) - DISCORD_EPOCH) << 22n) | (1n << 17n) | (this.sequence++ & 0xfffn)).toString();
  }
}

/** The Guild object in the token response of a bot install (the fields a channel might read). */
function guildObject(guild: DiscordGuild, ownerId: string): Record<string, unknown> {
  return {
    id: guild.id, name: guild.name, icon: null, description: null, splash: null, banner: null, owner_id: ownerId,
    features: [], roles: [], emojis: [], stickers: [], verification_level: 0, nsfw_level: 0, premium_tier: 0,
    preferred_locale: 'en-US', system_channel_id: null,
  };
}

// ─── Slack (https://api.slack.com) ───────────────────────────────────────────────────────────

export interface FakeSlackClient {
  clientId: string;
  clientSecret: string;
  /** The app's signing secret (Basic Information page), for signEvent / deliverEvent. */
  signingSecret: string;
  appId: string;
  /** Registered Redirect URLs, matched exactly. Omitted: any http(s) URL (the fake's leniency). */
  redirectUris?: string[];
}

export interface SlackTeam {
  id: string;
  name: string;
  /** The workspace's subdomain: auth.test's url is https://<domain>.slack.com/. */
  domain: string;
}

export interface SentSlackMessage {
  token: string;
  channel: string;
  text: string | undefined;
  /** Every parameter of the call (query and body). */
  params: Record<string, unknown>;
  ts: string;
}

export interface FakeSlackOptions {
  /** Default: [SLACK_CLIENT]. */
  clients?: FakeSlackClient[];
  /** The workspace the consenting user installs into. */
  team?: SlackTeam;
  /** Channels chat.postMessage knows. Default 'any'. */
  channels?: KnownIds;
}

export interface FakeSlack extends FakeChatServer {
  /** The first configured client. */
  client: FakeSlackClient;
  team: SlackTeam;
  sent: SentSlackMessage[];
  addClient(client: FakeSlackClient): void;
  /** What the next visit to the authorize page does: approve (into `team`, as `userId`), or deny. */
  setConsent(consent: { deny?: boolean; team?: SlackTeam; userId?: string }): void;
  setKnownChannels(ids: KnownIds): void;
  /** A bot token as oauth.v2.access would issue it (default client, current team), without the dance. */
  issueBotToken(scopes?: string[]): string;
  /** Every issued token answers token_revoked from now on (the app was uninstalled). */
  revokeTokens(): void;
  /** Signs like Slack signs requests: v0=HMAC-SHA256(secret, `v0:${ts}:${body}`), hex. */
  signEvent(body: string | object, signingSecret: string, timestamp?: number): SignedRequest;
  /** Signs `body` and POSTs it to an Events API request URL as Slack does. */
  deliverEvent(url: string, body: string | object, signingSecret: string): Promise<DeliveryResult>;
}

export const SLACK_CLIENT: FakeSlackClient = {
  clientId: '1234567890123.4567890123456',
  clientSecret: '0123456789abcdef0123456789abcdef',
  signingSecret: 'fedcba9876543210fedcba9876543210',
  appId: 'A0FAKEAPP01',
};

export async function startFakeSlack(options: FakeSlackOptions = {}): Promise<FakeSlack> {
  const fake = new FakeSlackServer(options);
  await fake.listen();
  return fake;
}

/** A Web API error: always HTTP 200 with ok:false, as Slack answers. */
class SlackError extends Error {
  constructor(readonly error: string, readonly extra: Record<string, unknown> = {}) {
    super(error);
  }
}

interface SlackCode {
  clientId: string;
  redirectUri: string | undefined;
  scopes: string[];
  team: SlackTeam;
  userId: string;
  expiresAt: number;
  used: boolean;
}

interface SlackInstall {
  clientId: string;
  appId: string;
  team: SlackTeam;
  scopes: string[];
  botUserId: string;
  botId: string;
  revoked: boolean;
}

class FakeSlackServer extends FakeHttpServer implements FakeSlack {
  client: FakeSlackClient;
  team: SlackTeam;
  sent: SentSlackMessage[] = [];
  private readonly clients = new Map<string, FakeSlackClient>();
  private readonly channels: IdSet;
  private consent: { deny: boolean; team: SlackTeam; userId: string };
  private readonly codes = new Map<string, SlackCode>();
  private readonly tokens = new Map<string, SlackInstall>();
  private lastTs = 0;

  constructor(options: FakeSlackOptions) {
    super();
    const clients = options.clients ?? [SLACK_CLIENT];
    for (const c of clients) this.clients.set(c.clientId, c);
    this.client = clients[0]!;
    this.team = options.team ?? { id: 'T0FAKETEAM1', name: 'Gatehouse Test', domain: 'gatehouse-test' };
    this.consent = { deny: false, team: this.team, userId: 'U0FAKEUSER1' };
    this.channels = new IdSet(options.channels);
  }

  addClient(client: FakeSlackClient): void {
    this.clients.set(client.clientId, client);
  }

  setConsent(consent: { deny?: boolean; team?: SlackTeam; userId?: string }): void {
    this.consent = { deny: consent.deny ?? false, team: consent.team ?? this.consent.team, userId: consent.userId ?? this.consent.userId };
  }

  setKnownChannels(ids: KnownIds): void {
    this.channels.set(ids);
  }

  issueBotToken(scopes = ['chat:write']): string {
    return this.install(this.client, this.consent.team, scopes).token;
  }

  revokeTokens(): void {
    for (const t of this.tokens.values()) t.revoked = true;
  }

  signEvent(body: string | object, signingSecret: string, timestamp = Math.floor(Date.now() / 1000)): SignedRequest {
    const text = typeof body === 'string' ? body : JSON.stringify(body);
    const signature = `v0=${createHmac('sha256', signingSecret).update(`v0:${timestamp}:${text}`).digest('hex')}`;
    return { headers: { 'X-Slack-Signature': signature, 'X-Slack-Request-Timestamp': String(timestamp) }, body: text };
  }

  deliverEvent(url: string, body: string | object, signingSecret: string): Promise<DeliveryResult> {
    const signed = this.signEvent(body, signingSecret);
    return this.deliver(url, { 'Content-Type': 'application/json', 'User-Agent': 'Slackbot 1.0 (+https://api.slack.com/robots)', ...signed.headers }, signed.body);
  }

  protected route(x: Exchange): Reply {
    if (x.method === 'GET' && x.path === '/oauth/v2/authorize') return this.authorize(x);
    const method = /^\/api\/([A-Za-z0-9.]+)$/.exec(x.path)?.[1];
    if (method === undefined) return htmlPage(404, 'Not Found');
    const warnings = charsetWarnings(x.contentType);
    let body: Record<string, unknown>;
    try {
      if (!x.parsed && x.contentType.includes('json')) throw new SlackError('invalid_json');
      // Arguments come from the query or a form; a JSON body carries them too, except the token.
      const params: Record<string, unknown> = { ...Object.fromEntries(x.url.searchParams), ...(isRecord(x.body) ? x.body : {}) };
      if (x.contentType.includes('json')) delete params.token;
      switch (method) {
        case 'oauth.v2.access': body = this.oauthAccess(x, params); break;
        case 'auth.test': body = this.authTest(x, params); break;
        case 'chat.postMessage': body = this.postMessage(x, params); break;
        default: return { status: 404, body: { ok: false, error: 'unknown_method', req_method: method } };
      }
    } catch (err) {
      if (!(err instanceof SlackError)) throw err;
      body = { ok: false, error: err.error, ...err.extra };
    }
    // Slack's warnings ride along on successes and errors alike.
    if (warnings.length) Object.assign(body, { warning: warnings.join(','), response_metadata: { warnings } });
    return { status: 200, body };
  }

  protected failureReply(status: number): Reply {
    if (status === 429) return { status, body: { ok: false, error: 'ratelimited' }, headers: { 'retry-after': '1' } };
    return { status, body: { ok: false, error: 'fatal_error' } };
  }

  // ── OAuth v2 ──

  /** The install page, already clicked: 302 back with code and state, or error=access_denied. */
  private authorize(x: Exchange): Reply {
    const q = x.url.searchParams;
    const client = this.clients.get(q.get('client_id') ?? '');
    if (!client) return htmlPage(400, 'Invalid client_id parameter');
    const given = q.get('redirect_uri') ?? undefined;
    // Without redirect_uri Slack uses the app's first Redirect URL.
    const redirectUri = given ?? client.redirectUris?.[0];
    if (!redirectUri || !redirectAllowed(client.redirectUris, redirectUri)) return htmlPage(400, 'redirect_uri did not match any configured URIs');
    const scopes = (q.get('scope') ?? '').split(/[,\s]+/).filter(Boolean);
    if (!scopes.length && !q.get('user_scope')) return htmlPage(400, 'Invalid permissions requested');
    const back = new URL(redirectUri);
    const state = q.get('state');
    if (this.consent.deny) {
      back.searchParams.set('error', 'access_denied');
    } else {
      const code = `${randomDigits(13)}.${randomDigits(13)}.${randomBytes(32).toString('hex')}`;
      this.codes.set(code, { clientId: client.clientId, redirectUri: given, scopes, team: this.consent.team, userId: this.consent.userId, expiresAt: Date.now() + 600_000, used: false });
      back.searchParams.set('code', code);
    }
    if (state !== null) back.searchParams.set('state', state);
    return redirectTo(back);
  }

  /** oauth.v2.access: a form with code (+ redirect_uri); the client by body or HTTP Basic. */
  private oauthAccess(x: Exchange, p: Record<string, unknown>): Record<string, unknown> {
    const creds = clientCredentials(x.headers, { client_id: scalar(p.client_id), client_secret: scalar(p.client_secret) });
    const client = this.clients.get(creds.id ?? '');
    if (!client) throw new SlackError('invalid_client_id');
    if (creds.secret !== client.clientSecret) throw new SlackError('bad_client_secret');
    // Token rotation (grant_type=refresh_token) is not faked.
    if ((scalar(p.grant_type) ?? 'authorization_code') !== 'authorization_code') throw new SlackError('invalid_grant_type');
    const pending = this.codes.get(scalar(p.code) ?? '');
    if (!pending || pending.used || pending.expiresAt <= Date.now() || pending.clientId !== client.clientId) throw new SlackError('invalid_code');
    pending.used = true;
    // "This must match the originally submitted URI (if one was sent)."
    if (pending.redirectUri !== undefined && scalar(p.redirect_uri) !== pending.redirectUri) throw new SlackError('bad_redirect_uri');
    const install = this.install(client, pending.team, pending.scopes);
    return {
      ok: true, access_token: install.token, token_type: 'bot', scope: pending.scopes.join(','), bot_user_id: install.botUserId,
      app_id: client.appId, team: { name: pending.team.name, id: pending.team.id }, enterprise: null,
      authed_user: { id: pending.userId }, is_enterprise_install: false,
    };
  }

  private install(client: FakeSlackClient, team: SlackTeam, scopes: string[]): SlackInstall & { token: string } {
    // One bot user per app and workspace, stable across reinstalls.
    const seed = createHash('sha256').update(`${client.appId}/${team.id}`).digest('hex').toUpperCase();
    const install: SlackInstall = { clientId: client.clientId, appId: client.appId, team, scopes, botUserId: `U0${seed.slice(0, 9)}`, botId: `B0${seed.slice(9, 18)}`, revoked: false };
    const token = `xoxb-${randomDigits(13)}-${randomDigits(13)}-${randomAlnum(24)}`;
    this.tokens.set(token, install);
    return { ...install, token };
  }

  // ── Web API ──

  /** The token from `Authorization: Bearer` or, in a form or query, `token`. */
  private authenticate(x: Exchange, p: Record<string, unknown>): SlackInstall & { token: string } {
    const header = x.headers.authorization;
    const token = header ? /^Bearer (.+)$/.exec(header)?.[1] : scalar(p.token);
    if (!token) throw new SlackError('not_authed');
    const install = this.tokens.get(token);
    if (!install) throw new SlackError('invalid_auth');
    if (install.revoked) throw new SlackError('token_revoked');
    return { ...install, token };
  }

  private authTest(x: Exchange, p: Record<string, unknown>): Record<string, unknown> {
    const a = this.authenticate(x, p);
    return {
      ok: true, url: `https://${a.team.domain}.slack.com/`, team: a.team.name, user: 'gatehouse', team_id: a.team.id,
      user_id: a.botUserId, bot_id: a.botId, is_enterprise_install: false,
    };
  }

  private postMessage(x: Exchange, p: Record<string, unknown>): Record<string, unknown> {
    const a = this.authenticate(x, p);
    if (!a.scopes.includes('chat:write')) throw new SlackError('missing_scope', { needed: 'chat:write', provided: a.scopes.join(',') });
    const channel = scalar(p.channel);
    if (!channel || !this.channels.has(channel)) throw new SlackError('channel_not_found');
    const text = scalar(p.text) || undefined;
    if (!text && p.blocks === undefined && p.attachments === undefined) throw new SlackError('no_text');
    if (text && text.length > 40_000) throw new SlackError('msg_too_long');
    const ts = this.nextTs();
    this.sent.push({ token: a.token, channel, text, params: p, ts });
    return {
      ok: true, channel, ts,
      message: {
        user: a.botUserId, type: 'message', ts, bot_id: a.botId, app_id: a.appId, text: text ?? '', team: a.team.id,
        bot_profile: { id: a.botId, app_id: a.appId, name: 'gatehouse', icons: {}, deleted: false, updated: Math.floor(Date.now() / 1000), team_id: a.team.id },
        ...(p.blocks !== undefined ? { blocks: p.blocks } : {}),
      },
    };
  }

  /** A message ts: unix seconds '.' microseconds, unique and increasing. */
  private nextTs(): string {
    this.lastTs = Math.max(Date.now() * 1000, this.lastTs + 1);
    return `${Math.floor(this.lastTs / 1_000_000)}.${String(this.lastTs % 1_000_000).padStart(6, '0')}`;
  }
}

/** Slack's content-type warnings: JSON wants '; charset=utf-8', a form wants none. */
function charsetWarnings(contentType: string): string[] {
  if (contentType.startsWith('application/json') && !contentType.includes('charset')) return ['missing_charset'];
  if (contentType.startsWith('application/x-www-form-urlencoded') && contentType.includes('charset')) return ['superfluous_charset'];
  return [];
}

// ─── Plumbing ─────────────────────────────────────────────────────────────────────────────────

function parseBody(raw: string, contentType: string): { body: unknown; parsed: boolean } {
  if (!raw) return { body: undefined, parsed: true };
  if (contentType.startsWith('application/x-www-form-urlencoded')) return { body: Object.fromEntries(new URLSearchParams(raw)), parsed: true };
  if (contentType.includes('json')) {
    try {
      return { body: JSON.parse(raw), parsed: true };
    } catch {
      return { body: raw, parsed: false };
    }
  }
  return { body: raw, parsed: false };
}

function queryObject(params: URLSearchParams): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  for (const key of new Set(params.keys())) {
    const all = params.getAll(key);
    out[key] = all.length === 1 ? all[0]! : all;
  }
  return out;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** A parameter as a string: JSON numbers and booleans become their text, as in a form. */
function scalar(value: unknown): string | undefined {
  if (typeof value === 'string') return value;
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  return undefined;
}

/** client_id and client_secret from HTTP Basic (preferred) or the form. */
function clientCredentials(headers: http.IncomingHttpHeaders, form: { client_id?: string; client_secret?: string }): { id?: string; secret?: string } {
  const basic = /^Basic\s+(.+)$/i.exec(headers.authorization ?? '')?.[1];
  if (basic) {
    const decoded = Buffer.from(basic, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    return colon < 0 ? { id: decoded } : { id: decoded.slice(0, colon), secret: decoded.slice(colon + 1) };
  }
  return { id: form.client_id, secret: form.client_secret };
}

function redirectAllowed(registered: string[] | undefined, uri: string): boolean {
  if (registered) return registered.includes(uri);
  try {
    return ['http:', 'https:'].includes(new URL(uri).protocol);
  } catch {
    return false;
  }
}

function redirectTo(location: URL): Reply {
  return { status: 302, headers: { location: location.toString() } };
}

/** An error page a browser would show (text is the fake's own, never request data). */
function htmlPage(status: number, text: string): Reply {
  return { status, body: `<!doctype html><title>${text}</title><p>${text}</p>`, headers: { 'content-type': 'text/html; charset=utf-8' } };
}

function isLoopback(hostname: string): boolean {
  return hostname === 'localhost' || hostname === '[::1]' || /^127(\.\d{1,3}){3}$/.test(hostname);
}

const ALNUM = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789';

function randomAlnum(length: number): string {
  return Array.from({ length }, () => ALNUM[randomInt(ALNUM.length)]).join('');
}

function randomDigits(length: number): string {
  return String(randomInt(1, 10)) + Array.from({ length: length - 1 }, () => randomInt(10)).join('');
}
