/**
 * Local stand-ins for the chat platforms gatehouse's channels talk to: the Telegram Bot API,
 * Discord (OAuth2 bot install, REST v10, signed interactions) and Slack (OAuth v2, Web API,
 * signed Events API requests). Each fake is its own node:http server on 127.0.0.1:0; a test
 * points a channel at `fake.url` instead of api.telegram.org, discord.com or slack.com.
 *
 * Built from each platform's published reference, not from gatehouse's code: every route is a
 * row of TELEGRAM_METHODS, DISCORD_ROUTES or SLACK_METHODS with the page and section it comes
 * from, and a call the reference does not allow (wrong HTTP method or path, a content type the
 * route does not take, the wrong Authorization scheme, a missing required parameter, a value
 * outside a documented enum or limit) is refused with the platform's own error and noted in the
 * call's `violations`. Where the platform silently ignores a mistake (an unknown Telegram update
 * type, Slack's charset warnings), the fake answers as the platform does and still notes it, so a
 * test can tell "the platform would accept this" from "this is what the reference says".
 *
 * Sources of error texts, most authoritative first: the reference page; the platforms' own open
 * source (Telegram's Bot API server, github.com/tdlib/telegram-bot-api, Client.cpp and
 * HttpConnection.cpp); answers the platforms have been seen to give. The few the fake had to
 * invent are marked "fake's wording"; where the reference leaves the platform's reaction open,
 * the comment says so.
 */
import http from 'node:http';
import https from 'node:https';
import { createHash, createHmac, generateKeyPairSync, randomBytes, randomInt, sign, type KeyObject } from 'node:crypto';
import type { AddressInfo } from 'node:net';

// ─── Shared: what every fake records and accepts ─────────────────────────────────────────────

/** One documented call of a platform: the row a recorded call is checked against. */
export interface DocumentedRoute {
  platform: 'telegram' | 'discord' | 'slack';
  /** As the reference names it: 'sendMessage', 'POST /channels/{channel.id}/messages', 'chat.postMessage'. */
  name: string;
  /** The HTTP methods the reference allows. */
  methods: readonly string[];
  /** Media types the reference allows for a body; empty when the call takes none. */
  bodyTypes: readonly string[];
  /** How the caller proves itself. */
  auth: string;
  /** Parameters the reference marks required. */
  required: readonly string[];
  /** The reference page and section. */
  source: string;
}

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
  /** The documented route this call reached (method and path), or undefined when the reference has none. */
  route?: DocumentedRoute;
  /**
   * Where the call breaks the platform's published contract, each with its source: refused as the
   * platform refuses it, or (where the platform silently ignores the mistake) only noted here.
   * Empty for a call the reference allows, even one the platform answers with an error for other
   * reasons (an unknown chat, a revoked token).
   */
  violations: string[];
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
  /** The next matching calls to a documented route (checked before authentication) answer `failure` instead. */
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
  /** How long the answer took. */
  elapsedMs: number;
  /** Where the answer breaks what the platform documents for it (each with its source); empty when it does not. */
  violations: string[];
}

// ─── Shared: server plumbing ─────────────────────────────────────────────────────────────────

interface Exchange {
  method: string;
  path: string;
  url: URL;
  headers: http.IncomingHttpHeaders;
  /** The Content-Type header, lower-cased; '' when absent. */
  contentType: string;
  /** Its media type alone ('application/json'). */
  mediaType: string;
  /** Its charset parameter, lower-cased, or undefined. */
  charset: string | undefined;
  raw: string;
  body: unknown;
  /** False when a body was sent that is neither JSON nor a form, or is malformed JSON. */
  parsed: boolean;
  /** The record of this call: handlers add violations to it. */
  call: RecordedCall;
}

interface Reply {
  status: number;
  /** A string is sent as is; anything else as JSON. */
  body?: unknown;
  headers?: Record<string, string>;
}

/**
 * Thrown by a handler to answer with `reply` (a platform error). `violation` says which part of
 * the reference the call broke; without it the refusal is the platform's answer to a call the
 * reference allows (an unknown chat, a bad token).
 */
class Refusal extends Error {
  constructor(
    readonly reply: Reply,
    readonly violation?: string,
  ) {
    super(`refused with ${reply.status}`);
  }
}

/** A documented route the fake serves. */
interface Resolved {
  route: DocumentedRoute;
  handle: () => Reply;
}

/** One node:http server on 127.0.0.1:0 that records calls, injects failures and routes the rest. */
abstract class FakeHttpServer implements FakeChatServer {
  url = '';
  calls: RecordedCall[] = [];
  private readonly failures: { matcher: FailureMatcher; failure: InjectedFailure; left: number }[] = [];
  private readonly inflight = new Set<http.ClientRequest>();
  private readonly server = http.createServer((req, res) => void this.handle(req, res).catch(() => res.destroy()));

  /** The documented route for the method and path, or a Refusal (unknown path, wrong method) as the platform answers it. */
  protected abstract resolve(x: Exchange): Resolved;
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
  protected deliver(
    target: string,
    headers: Record<string, string>,
    body: string,
    timeoutMs = 10_000,
  ): Promise<Omit<DeliveryResult, 'violations'>> {
    const url = new URL(target);
    const transport = url.protocol === 'https:' ? https : http;
    const started = performance.now();
    return new Promise((resolve, reject) => {
      const req = transport.request(
        url,
        {
          method: 'POST',
          headers: { ...headers, 'Content-Length': String(Buffer.byteLength(body)) },
          agent: false,
          timeout: timeoutMs,
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () =>
            resolve({
              status: res.statusCode!,
              headers: res.headers,
              body: Buffer.concat(chunks).toString('utf8'),
              elapsedMs: performance.now() - started,
            }),
          );
          res.on('error', reject);
        },
      );
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
    const call: RecordedCall = {
      method,
      path,
      query: queryObject(url.searchParams),
      headers: req.headers,
      body,
      violations: [],
    };
    this.calls.push(call);
    const [mediaType = '', ...parameters] = contentType.split(';').map((p) => p.trim());
    const charset = parameters.map((p) => /^charset="?([^"]*)"?$/.exec(p)?.[1]).find((c) => c !== undefined);
    let reply: Reply;
    try {
      const x: Exchange = {
        method,
        path,
        url,
        headers: req.headers,
        contentType,
        mediaType,
        charset,
        raw,
        body,
        parsed,
        call,
      };
      const { route, handle } = this.resolve(x);
      call.route = route;
      reply = this.injectedFailure(x) ?? handle();
    } catch (err) {
      if (err instanceof Refusal) {
        reply = err.reply;
        if (err.violation) call.violations.push(err.violation);
      } else {
        reply = {
          status: 500,
          body: `fake-chat: ${(err as Error).message}`,
          headers: { 'content-type': 'text/plain' },
        };
      }
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
    const i = this.failures.findIndex(
      ({ matcher: m }) =>
        (!m.method || m.method.toUpperCase() === x.method) &&
        (typeof m.path === 'string' ? m.path === x.path : m.path.test(x.path)),
    );
    if (i < 0) return undefined;
    const entry = this.failures[i]!;
    if (--entry.left <= 0) this.failures.splice(i, 1);
    const { status, body, headers } = entry.failure;
    const fallback = this.failureReply(status);
    return { status, body: body ?? fallback.body, headers: { ...fallback.headers, ...headers } };
  }
}

/** The fake does not parse multipart bodies: a call that sends one fails loudly instead of being judged. */
function refuseMultipart(x: Exchange): void {
  if (x.mediaType === 'multipart/form-data') throw new Error('multipart/form-data bodies are not parsed by the fake');
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

/** Unicode code points: the references count "characters" without saying which; see each use. */
const characters = (text: string) => [...text].length;

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

const TELEGRAM_API = 'https://core.telegram.org/bots/api';
/** "We support four ways of passing parameters": the query string and these bodies (#making-requests). */
const TELEGRAM_BODY_TYPES = ['application/x-www-form-urlencoded', 'application/json', 'multipart/form-data'] as const;

const telegramMethod = (name: string, required: string[] = []): DocumentedRoute => ({
  platform: 'telegram',
  name,
  methods: ['GET', 'POST'],
  bodyTypes: TELEGRAM_BODY_TYPES,
  auth: 'the bot token in the path: /bot<token>/<method>',
  required,
  source: `${TELEGRAM_API}#${name.toLowerCase()}`,
});

/** The Bot API methods the fake serves, as https://core.telegram.org/bots/api documents them. */
export const TELEGRAM_METHODS: readonly DocumentedRoute[] = [
  telegramMethod('getMe'),
  telegramMethod('setWebhook', ['url']),
  telegramMethod('deleteWebhook'),
  telegramMethod('getWebhookInfo'),
  telegramMethod('getUpdates'),
  telegramMethod('sendMessage', ['chat_id', 'text']),
];

/**
 * The Update fields allowed_updates may name (https://core.telegram.org/bots/api#update; the
 * server's list is get_update_type_name in tdlib/telegram-bot-api Client.cpp, which also has
 * managed_bot and guest_message). Any other name is silently dropped by the server.
 */
export const TELEGRAM_UPDATE_TYPES: readonly string[] = [
  'message',
  'edited_message',
  'channel_post',
  'edited_channel_post',
  'business_connection',
  'business_message',
  'edited_business_message',
  'deleted_business_messages',
  'message_reaction',
  'message_reaction_count',
  'inline_query',
  'chosen_inline_result',
  'callback_query',
  'shipping_query',
  'pre_checkout_query',
  'purchased_paid_media',
  'poll',
  'poll_answer',
  'my_chat_member',
  'chat_member',
  'chat_join_request',
  'chat_boost',
  'removed_chat_boost',
  'managed_bot',
  'guest_message',
];

/** sendMessage's parse_mode (https://core.telegram.org/bots/api#formatting-options); the server compares lower-cased and also takes "none". */
const TELEGRAM_PARSE_MODES = ['markdownv2', 'html', 'markdown', 'none'];

/** '<bot id>:<secret>', as BotFather issues them. */
const TELEGRAM_TOKEN = /^(\d+):[A-Za-z0-9_-]+$/;
/** setWebhook's secret_token: "1-256 characters. Only characters A-Z, a-z, 0-9, _ and - are allowed." */
const TELEGRAM_SECRET_TOKEN = /^[A-Za-z0-9_-]{1,256}$/;
/** "Ports currently supported for webhooks: 443, 80, 88, 8443." (#setwebhook) */
const TELEGRAM_WEBHOOK_PORTS = ['443', '80', '88', '8443'];

interface TelegramBotState extends TelegramBot {
  webhook?: TelegramWebhook;
  nextUpdateId: number;
  /** message_id counts per chat, as in Telegram. */
  messageIds: Map<string, number>;
}

const tgOk = (result: unknown, description?: string): Reply => ({
  status: 200,
  body: { ok: true, result, ...(description ? { description } : {}) },
});
const tgError = (code: number, description: string, extra: Record<string, unknown> = {}): Reply => ({
  status: code,
  body: { ok: false, error_code: code, description, ...extra },
});
/** A refusal for a call the reference does not allow; `why` names the rule and its section. */
const tgViolation = (code: number, description: string, why: string) =>
  new Refusal(tgError(code, description), `telegram: ${why}`);

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
    this.token =
      b.token ?? `${randomInt(1_000_000_000, 8_000_000_000)}:AA${randomBytes(25).toString('base64url').slice(0, 33)}`;
    this.bot = this.addBot(this.token, { username: b.username ?? 'gatehouse_test_bot', firstName: b.firstName });
    this.chats = new IdSet(options.chats);
  }

  addBot(token: string, profile: { username: string; firstName?: string }): TelegramBot {
    const id = TELEGRAM_TOKEN.exec(token)?.[1];
    if (!id) throw new Error(`fake-telegram: a bot token is '<digits>:<secret>', got ${token}`);
    const bot: TelegramBotState = {
      token,
      id: Number(id),
      username: profile.username,
      firstName: profile.firstName ?? 'Gatehouse',
      nextUpdateId: randomInt(100_000_000, 900_000_000),
      messageIds: new Map(),
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

  protected resolve(x: Exchange): Resolved {
    // "https://api.telegram.org/bot<token>/METHOD_NAME" (#making-requests). Anything else is the
    // server's plain 404 (HttpConnection.cpp); api.telegram.org says "Not Found" for an unknown
    // method too (the open-source server says "Not Found: method not found").
    const m = /^\/bot([^/]+)\/([^/]*)$/.exec(x.path);
    if (!m || !TELEGRAM_TOKEN.test(m[1]!))
      throw tgViolation(404, 'Not Found', `${x.path} is not /bot<token>/<method> (${TELEGRAM_API}#making-requests)`);
    // "We support GET and POST HTTP methods." What the server does with others is not documented.
    if (x.method !== 'GET' && x.method !== 'POST') {
      throw tgViolation(
        405,
        'Method Not Allowed',
        `${x.method}: the Bot API takes GET and POST (${TELEGRAM_API}#making-requests)`,
      ); // fake's wording
    }
    // "Bot API method names are case-insensitive."
    const route = TELEGRAM_METHODS.find((r) => r.name.toLowerCase() === m[2]!.toLowerCase());
    if (!route) throw tgViolation(404, 'Not Found', `no Bot API method "${m[2]}" (${TELEGRAM_API}#available-methods)`);
    return { route, handle: () => this.call(route, m[1]!, x) };
  }

  protected failureReply(status: number): Reply {
    if (status === 429) return tgError(429, 'Too Many Requests: retry after 1', { parameters: { retry_after: 1 } });
    return tgError(status, http.STATUS_CODES[status] ?? 'Error');
  }

  private call(route: DocumentedRoute, token: string, x: Exchange): Reply {
    const bot = this.bots.get(token);
    if (!bot) return tgError(401, 'Unauthorized');
    refuseMultipart(x);
    let body: Record<string, unknown> = {};
    if (x.raw !== '') {
      if (!(TELEGRAM_BODY_TYPES as readonly string[]).includes(x.mediaType)) {
        // The server reads no parameters from such a body: the call goes on without them.
        x.call.violations.push(
          `telegram: a ${x.mediaType || 'untyped'} body is not one of the ways to pass parameters (${TELEGRAM_API}#making-requests)`,
        );
      } else if (!x.parsed || !isRecord(x.body)) {
        throw tgViolation(
          400,
          "Bad Request: can't parse JSON object",
          `the body is not a JSON object (${TELEGRAM_API}#making-requests)`,
        ); // fake's wording
      } else {
        body = x.body;
      }
    }
    // Parameters come from the query string and the body; both may be mixed.
    const params: Record<string, unknown> = { ...Object.fromEntries(x.url.searchParams), ...body };
    switch (route.name) {
      case 'getMe':
        return tgOk({
          id: bot.id,
          is_bot: true,
          first_name: bot.firstName,
          username: bot.username,
          can_join_groups: true,
          can_read_all_group_messages: false,
          supports_inline_queries: false,
          can_connect_to_business: false,
          has_main_web_app: false,
        });
      case 'setWebhook':
        return this.setWebhook(bot, params, x);
      case 'deleteWebhook':
        return this.removeWebhook(bot);
      case 'getWebhookInfo':
        return tgOk(webhookInfo(bot.webhook));
      case 'getUpdates':
        if (bot.webhook)
          return tgError(
            409,
            "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first",
          );
        return tgOk([]);
      case 'sendMessage':
        return this.sendMessage(bot, params);
      default:
        throw new Error(`no handler for ${route.name}`);
    }
  }

  /** https://core.telegram.org/bots/api#setwebhook; checks and texts as do_set_webhook (Client.cpp) and WebhookActor.cpp. */
  private setWebhook(bot: TelegramBotState, p: Record<string, unknown>, x: Exchange): Reply {
    // url is "Required"; the server treats a missing one as "" (delete), so the call works but breaks the contract.
    if (p.url === undefined)
      x.call.violations.push(
        `telegram: setWebhook without its required "url" (${TELEGRAM_API}#setwebhook); the server deletes the webhook`,
      );
    const url = scalar(p.url) ?? '';
    // "Use an empty string to remove webhook integration."
    if (url === '') return this.removeWebhook(bot);
    checkTelegramWebhookUrl(url);
    const secret = scalar(p.secret_token) || undefined;
    if (secret !== undefined && !TELEGRAM_SECRET_TOKEN.test(secret)) {
      const why = `secret_token must be 1-256 characters of A-Z a-z 0-9 _ - (${TELEGRAM_API}#setwebhook)`;
      throw tgViolation(
        400,
        secret.length > 256
          ? 'Bad Request: secret token is too long'
          : 'Bad Request: secret token contains unallowed characters',
        why,
      );
    }
    // "If not specified, the previous setting will be used."
    const allowedUpdates =
      p.allowed_updates === undefined
        ? bot.webhook?.allowedUpdates
        : allowedUpdateTypes(p.allowed_updates, x, bot.webhook?.allowedUpdates);
    // "max_connections: … 1-100. Defaults to 40."
    const requested = p.max_connections === undefined ? 40 : Number(scalar(p.max_connections));
    if (p.max_connections !== undefined && !(Number.isInteger(requested) && requested >= 1 && requested <= 100)) {
      x.call.violations.push(
        `telegram: max_connections must be 1-100 (${TELEGRAM_API}#setwebhook); the server clamps it`,
      );
    }
    const maxConnections = Math.min(100, Math.max(1, Number.isFinite(requested) ? requested : 40));
    const next: TelegramWebhook = { url, secretToken: secret, allowedUpdates, maxConnections };
    const previous = bot.webhook;
    if (
      previous &&
      previous.url === url &&
      previous.secretToken === secret &&
      previous.maxConnections === maxConnections &&
      JSON.stringify(previous.allowedUpdates) === JSON.stringify(allowedUpdates)
    ) {
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

  /** https://core.telegram.org/bots/api#sendmessage */
  private sendMessage(bot: TelegramBotState, p: Record<string, unknown>): Reply {
    const chatId = scalar(p.chat_id);
    if (!chatId)
      throw tgViolation(
        400,
        'Bad Request: chat_id is empty',
        `sendMessage without its required "chat_id" (${TELEGRAM_API}#sendmessage)`,
      );
    const text = scalar(p.text) ?? '';
    // "Text of the message to be sent, 1-4096 characters after entities parsing"; entity parsing trims.
    if (!text.trim())
      throw tgViolation(
        400,
        'Bad Request: message text is empty',
        `sendMessage needs a "text" of 1-4096 characters (${TELEGRAM_API}#sendmessage)`,
      );
    if (characters(text) > 4096)
      throw tgViolation(
        400,
        'Bad Request: message is too long',
        `sendMessage's text is at most 4096 characters (${TELEGRAM_API}#sendmessage)`,
      );
    const parseMode = scalar(p.parse_mode);
    if (parseMode && !TELEGRAM_PARSE_MODES.includes(parseMode.toLowerCase())) {
      throw tgViolation(
        400,
        'Bad Request: unsupported parse_mode',
        `parse_mode is one of MarkdownV2, HTML, Markdown (${TELEGRAM_API}#formatting-options)`,
      );
    }
    if (!this.chats.has(chatId)) throw new Refusal(tgError(400, 'Bad Request: chat not found'));
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
    // "A secret token to be sent in a header “X-Telegram-Bot-Api-Secret-Token” in every webhook request."
    if (hook.secretToken) headers['X-Telegram-Bot-Api-Secret-Token'] = hook.secretToken;
    const record: TelegramDelivery = { token, url: hook.url, update: body };
    this.deliveries.push(record);
    try {
      const { status } = await this.deliver(hook.url, headers, JSON.stringify(body));
      record.status = status;
      // "In case of an unsuccessful request (a request with response HTTP status code different from 2XY), we will repeat the request."
      if (status < 200 || status > 299) {
        hook.lastErrorDate = Math.floor(Date.now() / 1000);
        hook.lastErrorMessage = `Wrong response from the webhook: ${status} ${http.STATUS_CODES[status] ?? ''}`.trim();
      }
      return status;
    } catch (err) {
      record.error = (err as Error).message;
      hook.lastErrorDate = Math.floor(Date.now() / 1000);
      hook.lastErrorMessage =
        (err as NodeJS.ErrnoException).code === 'ECONNREFUSED' ? 'Connection refused' : (err as Error).message;
      throw err;
    }
  }
}

/**
 * Telegram wants https on 443, 80, 88 or 8443 (#setwebhook). The fake also takes plain http to a
 * loopback host on any port, so tests can receive deliveries: the one place it is more lenient
 * than Telegram, which refuses http and loopback addresses.
 */
function checkTelegramWebhookUrl(raw: string): void {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw tgViolation(
      400,
      'Bad Request: invalid webhook URL specified',
      `url must be an HTTPS URL (${TELEGRAM_API}#setwebhook)`,
    );
  }
  if (url.protocol === 'http:' && isLoopback(url.hostname)) return;
  if (url.protocol !== 'https:')
    throw tgViolation(
      400,
      'Bad Request: bad webhook: An HTTPS URL must be provided for webhook',
      `url must be an HTTPS URL (${TELEGRAM_API}#setwebhook)`,
    );
  if (!TELEGRAM_WEBHOOK_PORTS.includes(url.port || '443')) {
    throw tgViolation(
      400,
      'Bad Request: bad webhook: Webhook can be set up only on ports 80, 88, 443 or 8443',
      `webhook ports are 443, 80, 88, 8443 (${TELEGRAM_API}#setwebhook)`,
    );
  }
}

/**
 * allowed_updates as the server reads it (get_allowed_update_types, Client.cpp): a JSON array of
 * Update type names (an array in a JSON body, its serialization in a form or query), compared
 * lower-cased. Unknown names are dropped and a malformed value is ignored (the previous setting
 * stays); neither is an error, so both are only noted. None known: every type but the opt-in ones.
 */
function allowedUpdateTypes(value: unknown, x: Exchange, previous: string[] | undefined): string[] | undefined {
  let list = value;
  if (typeof value === 'string') {
    try {
      list = value === '' ? [] : JSON.parse(value);
    } catch {
      list = undefined;
    }
  }
  if (!Array.isArray(list) || !list.every((u) => typeof u === 'string')) {
    x.call.violations.push(
      `telegram: allowed_updates must be a JSON-serialized list of update types (${TELEGRAM_API}#setwebhook); the server ignores it`,
    );
    return previous;
  }
  const names = list.map((u: string) => u.toLowerCase());
  const unknown = names.filter((u) => !TELEGRAM_UPDATE_TYPES.includes(u));
  if (unknown.length)
    x.call.violations.push(
      `telegram: allowed_updates names no such update type: ${unknown.join(', ')} (${TELEGRAM_API}#update); the server drops it`,
    );
  const known = [...new Set(names.filter((u) => TELEGRAM_UPDATE_TYPES.includes(u)))];
  return known.length ? known : undefined;
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
    const id = -(
      1_000_000_000_000 +
      (parseInt(createHash('sha256').update(chatId).digest('hex').slice(0, 8), 16) % 1_000_000_000)
    );
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
  /**
   * Signs `body` and POSTs it to an interactions endpoint as Discord does; `violations` says where
   * the answer breaks what Discord documents (status, Content-Type, a callback type the
   * interaction's type allows).
   */
  deliverInteraction(url: string, body: string | object): Promise<DeliveryResult>;
  /**
   * What the Developer Portal does when the Interactions Endpoint URL is saved, and Discord's
   * routine checks after: a signed PING must be answered `{"type": 1}`, the same PING with a bad
   * signature 401. Resolves with each answer and the violations found.
   */
  checkInteractionsEndpoint(
    url: string,
  ): Promise<{ ping: DeliveryResult; forged: DeliveryResult; violations: string[] }>;
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

const DISCORD_DOCS = 'https://discord.com/developers/docs';
/** "either application/json, application/x-www-form-urlencoded, or multipart/form-data" (reference#content-type). */
const DISCORD_REST_BODY_TYPES = [
  'application/json',
  'application/x-www-form-urlencoded',
  'multipart/form-data',
] as const;
/** "User-Agent: DiscordBot ($url, $versionNumber)"; "clients may append more information". */
const DISCORD_USER_AGENT = /^DiscordBot \([^,()]+, [^,()]+\)/;

interface DiscordRoute extends DocumentedRoute {
  /** Matched against the path after /api[/v{n}] (the authorize page also without /api). */
  pattern: RegExp;
  /** A REST resource (versioned), as opposed to the OAuth2 URLs the docs give without a version. */
  resource: boolean;
}

const discordRoute = (
  name: string,
  pattern: RegExp,
  resource: boolean,
  auth: string,
  source: string,
  extra: Partial<DocumentedRoute> = {},
): DiscordRoute => {
  const [method] = name.split(' ');
  return {
    platform: 'discord',
    name,
    methods: [method!],
    bodyTypes: [],
    auth,
    required: [],
    source,
    pattern,
    resource,
    ...extra,
  };
};

/** The Discord routes the fake serves, each as https://discord.com/developers/docs documents it. */
export const DISCORD_ROUTES: readonly DocumentedRoute[] = [
  discordRoute(
    'GET /oauth2/authorize',
    /^\/oauth2\/authorize$/,
    false,
    "none: the user's browser",
    `${DISCORD_DOCS}/topics/oauth2#shared-resources-oauth2-urls`,
    { required: ['client_id'] },
  ),
  discordRoute(
    'POST /oauth2/token',
    /^\/oauth2\/token$/,
    false,
    'the client: HTTP Basic, or client_id and client_secret in the form (topics/oauth2#authorization-code-grant)',
    `${DISCORD_DOCS}/topics/oauth2#authorization-code-grant-access-token-exchange-example`,
    {
      bodyTypes: ['application/x-www-form-urlencoded'],
      required: ['grant_type', 'code and redirect_uri (authorization_code)', 'refresh_token (refresh_token)'],
    },
  ),
  discordRoute(
    'GET /oauth2/@me',
    /^\/oauth2\/@me$/,
    false,
    'Bearer <access token>',
    `${DISCORD_DOCS}/topics/oauth2#get-current-authorization-information`,
  ),
  discordRoute(
    'GET /users/@me',
    /^\/users\/@me$/,
    true,
    'Bot <bot token>, or Bearer <access token> with identify',
    `${DISCORD_DOCS}/resources/user#get-current-user`,
  ),
  discordRoute(
    'GET /channels/{channel.id}/messages',
    /^\/channels\/[^/]+\/messages$/,
    true,
    'Bot <bot token>',
    `${DISCORD_DOCS}/resources/message#get-channel-messages`,
  ),
  discordRoute(
    'POST /channels/{channel.id}/messages',
    /^\/channels\/[^/]+\/messages$/,
    true,
    'Bot <bot token>',
    `${DISCORD_DOCS}/resources/message#create-message`,
    {
      bodyTypes: DISCORD_REST_BODY_TYPES,
      required: ['one of content, embeds, sticker_ids, components, files[n], poll'],
    },
  ),
];

/**
 * The interaction callback types each interaction type may be answered with
 * (interactions/receiving-and-responding#interaction-response-object-interaction-callback-type):
 * PONG only for PING; 6 and 7 "only valid for component-based interactions"; 8 answers
 * autocomplete; MODAL (9) "not available for MODAL_SUBMIT and PING". Whether a modal submit
 * counts as component-based for 6 and 7 is not said; the fake allows them.
 */
const DISCORD_CALLBACK_TYPES: Record<number, number[]> = {
  1: [1],
  2: [4, 5, 9, 10, 12],
  3: [4, 5, 6, 7, 9, 10, 12],
  4: [8],
  5: [4, 5, 6, 7],
};

const DISCORD_EPOCH = 1_420_070_400_000n;

const discordError = (status: number, message: string, code: number, extra: Record<string, unknown> = {}): Reply => ({
  status,
  body: { message, code, ...extra },
});
/** 401 as Discord answers it; `why` (a broken rule) makes it a violation, without it a token Discord does not know. */
const discordUnauthorized = (why?: string) =>
  new Refusal(discordError(401, '401: Unauthorized', 0), why && `discord: ${why}`);
const invalidFormBody = (field: string, code: string, message: string, why: string) =>
  new Refusal(
    discordError(400, 'Invalid Form Body', 50035, { errors: { [field]: { _errors: [{ code, message }] } } }),
    `discord: ${why}`,
  );
/** OAuth2 endpoints answer RFC 6749 errors. */
const oauthRefusal = (status: number, error: string, description?: string, why?: string) =>
  new Refusal(
    { status, body: { error, ...(description ? { error_description: description } : {}) } },
    why && `discord: ${why}`,
  );

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
  private readonly installer: DiscordUser = {
    id: '1000000000000000001',
    username: 'alice',
    discriminator: '0',
    global_name: 'Alice',
    avatar: null,
  };
  private sequence = 0n;

  constructor(options: FakeDiscordOptions) {
    super();
    const clients = options.clients ?? [DISCORD_CLIENT];
    for (const c of clients) this.clients.set(c.clientId, c);
    this.client = clients[0]!;
    this.botUser = {
      id: this.client.clientId,
      username: 'Gatehouse',
      discriminator: '0000',
      global_name: null,
      avatar: null,
      bot: true,
    };
    // Discord's shape: base64(bot user id) . timestamp . HMAC.
    this.botToken =
      options.botToken ??
      `${Buffer.from(this.botUser.id).toString('base64url')}.${randomBytes(4).toString('base64url')}.${randomBytes(28).toString('base64url')}`;
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

  async deliverInteraction(url: string, body: string | object): Promise<DeliveryResult> {
    const signed = this.signInteraction(body);
    const answer = await this.postInteraction(url, signed);
    const interaction = JSON.parse(signed.body) as { type?: unknown };
    return { ...answer, violations: interactionAnswerProblems(interaction.type, answer) };
  }

  async checkInteractionsEndpoint(
    url: string,
  ): Promise<{ ping: DeliveryResult; forged: DeliveryResult; violations: string[] }> {
    const ping = {
      id: this.snowflake(),
      application_id: this.client.clientId,
      type: 1,
      token: randomAlnum(40),
      version: 1,
    };
    const answer = await this.deliverInteraction(url, ping);
    const violations = [...answer.violations];
    // "If the signature fails validation, your app should respond with a 401 error code"; Discord
    // sends such requests on purpose and removes the URL of an endpoint that accepts them.
    const signed = this.signInteraction(ping);
    const flipped = signed.headers['X-Signature-Ed25519']!.replace(/^./, (c) => (c === '0' ? '1' : '0'));
    const forgedAnswer = await this.postInteraction(url, {
      ...signed,
      headers: { ...signed.headers, 'X-Signature-Ed25519': flipped },
    });
    const forged = {
      ...forgedAnswer,
      violations:
        forgedAnswer.status === 401
          ? []
          : [
              `discord: a PING with an invalid signature was answered ${forgedAnswer.status}, not 401 (${DISCORD_DOCS}/interactions/overview#setting-up-an-endpoint-validating-security-request-headers)`,
            ],
    };
    return { ping: answer, forged, violations: [...violations, ...forged.violations] };
  }

  private postInteraction(url: string, signed: SignedRequest) {
    return this.deliver(
      url,
      {
        'Content-Type': 'application/json',
        'User-Agent': 'Discord-Interactions/1.0 (+https://discord.com)',
        ...signed.headers,
      },
      signed.body,
    );
  }

  protected resolve(x: Exchange): Resolved {
    // https://discord.com/api, optionally /v{version} (reference#api-versioning); the authorize
    // page is https://discord.com/oauth2/authorize (the fake also serves it under /api).
    const api = /^\/api(?:\/v(\d+))?(\/.*)$/.exec(x.path);
    const rest = api ? api[2]! : x.path;
    const version = api?.[1] === undefined ? undefined : Number(api[1]);
    const candidates = (DISCORD_ROUTES as readonly DiscordRoute[]).filter(
      (r) => r.pattern.test(rest) && (api || !r.resource) && (api || r.name === 'GET /oauth2/authorize'),
    );
    if (!candidates.length) {
      const why = `discord: no route ${x.method} ${x.path} in the reference (${DISCORD_DOCS}/reference)`;
      throw new Refusal(api ? discordError(404, '404: Not Found', 0) : htmlPage(404, 'Not Found'), why);
    }
    if (version !== undefined && version <= 5) {
      // "Trying to use these versions will fail and return 400 Bad Request." (body: fake's wording)
      throw new Refusal(
        discordError(400, '400: Bad Request', 0),
        `discord: API v${version} is discontinued (${DISCORD_DOCS}/reference#api-versioning)`,
      );
    }
    if (version !== undefined && version > 10)
      throw new Refusal(
        discordError(404, '404: Not Found', 0),
        `discord: there is no API v${version} (${DISCORD_DOCS}/reference#api-versioning)`,
      ); // fake's guess
    const route = candidates.find((r) => r.methods.includes(x.method));
    if (!route) {
      const why = `discord: ${x.method} ${rest}: the reference has ${candidates.map((r) => r.name).join(', ')} (${DISCORD_DOCS}/topics/opcodes-and-status-codes#http)`;
      throw new Refusal(
        api ? discordError(405, '405: Method Not Allowed', 0) : htmlPage(405, 'Method Not Allowed'),
        why,
      );
    }
    // 6, 7 and 8 still answer but are deprecated; no version at all routes to the default, 6.
    if (version !== undefined && version < 9)
      x.call.violations.push(`discord: API v${version} is deprecated (${DISCORD_DOCS}/reference#api-versioning)`);
    if (version === undefined && route.resource)
      x.call.violations.push(
        `discord: ${rest} without a version goes to the deprecated default, v6 (${DISCORD_DOCS}/reference#api-versioning)`,
      );
    return { route, handle: () => this.serve(route, x, rest, api !== null) };
  }

  protected failureReply(status: number): Reply {
    if (status === 429)
      return {
        status,
        body: { message: 'You are being rate limited.', retry_after: 1, global: false },
        headers: { 'retry-after': '1', 'x-ratelimit-scope': 'user' },
      };
    return discordError(status, `${status}: ${http.STATUS_CODES[status] ?? 'Error'}`, 0);
  }

  private serve(route: DiscordRoute, x: Exchange, rest: string, api: boolean): Reply {
    if (route.name === 'GET /oauth2/authorize') return this.authorize(x);
    if (api) checkDiscordUserAgent(x);
    switch (route.name) {
      case 'POST /oauth2/token':
        checkDiscordContentType(route, x);
        return this.token(x);
      case 'GET /oauth2/@me':
        return this.currentAuthorization(x);
      case 'GET /users/@me':
        return this.currentUser(x);
      case 'POST /channels/{channel.id}/messages':
        return this.createMessage(route, x, /^\/channels\/([^/]+)\/messages$/.exec(rest)![1]!);
      default:
        throw new Error(`${route.name} is documented but not implemented by the fake`);
    }
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
    if (q.get('response_type') !== 'code')
      return refuse(
        'unsupported_response_type',
        'The authorization server does not support obtaining an authorization code using this method.',
      );
    // "scope is a list of OAuth2 scopes separated by url encoded spaces (%20)."
    const scopes = (q.get('scope') ?? '').split(' ').filter(Boolean);
    if (!scopes.length) return refuse('invalid_scope', 'The requested scope is invalid, unknown, or malformed.');
    // PKCE is documented with the Social SDK (discord-social-sdk/development-guides/account-linking-on-mobile): S256.
    const challenge = q.get('code_challenge') ?? undefined;
    if (challenge && q.get('code_challenge_method') !== 'S256')
      return refuse('invalid_request', 'Unsupported "code_challenge_method"');
    if (this.consent.deny)
      return refuse('access_denied', 'The resource owner or authorization server denied the request');

    const code = randomAlnum(30);
    this.codes.set(code, {
      clientId: client.clientId,
      redirectUri,
      scopes,
      guild: { ...this.consent.guild },
      challenge,
      expiresAt: Date.now() + 600_000,
      used: false,
    });
    back.searchParams.set('code', code);
    if (state !== null) back.searchParams.set('state', state);
    // "When receiving the access code on redirect, there will be additional querystring parameters of guild_id and permissions."
    if (scopes.includes('bot')) {
      back.searchParams.set('guild_id', this.consent.guild.id);
      back.searchParams.set('permissions', q.get('permissions') ?? '0');
    }
    return redirectTo(back);
  }

  /**
   * POST /api/oauth2/token, form-encoded only; "All calls to the OAuth2 endpoints require either
   * HTTP Basic authentication or client_id and client_secret supplied in the form data body."
   */
  private token(x: Exchange): Reply {
    const form = isRecord(x.body) ? (x.body as Record<string, string>) : {};
    const creds = clientCredentials(x.headers, form);
    const client = this.clients.get(creds.id ?? '');
    if (creds.id === undefined)
      throw oauthRefusal(
        401,
        'invalid_client',
        undefined,
        `the token URL needs the client, by HTTP Basic or client_id and client_secret in the form (${DISCORD_DOCS}/topics/oauth2#authorization-code-grant)`,
      );
    if (!client || creds.secret !== client.clientSecret) throw oauthRefusal(401, 'invalid_client');

    if (form.grant_type === 'authorization_code') {
      const why = (field: string) =>
        `grant_type authorization_code needs "${field}" (${DISCORD_DOCS}/topics/oauth2#authorization-code-grant-redirect-url-example)`;
      if (!form.code) throw oauthRefusal(400, 'invalid_request', 'Missing "code" in request.', why('code')); // description: fake's wording
      if (!form.redirect_uri)
        throw oauthRefusal(400, 'invalid_grant', 'Invalid "redirect_uri" in request.', why('redirect_uri'));
      const pending = this.codes.get(form.code);
      if (!pending || pending.used || pending.expiresAt <= Date.now() || pending.clientId !== client.clientId) {
        throw oauthRefusal(400, 'invalid_grant', 'Invalid "code" in request.');
      }
      pending.used = true;
      if (form.redirect_uri !== pending.redirectUri)
        throw oauthRefusal(400, 'invalid_grant', 'Invalid "redirect_uri" in request.');
      if (pending.challenge) {
        const verifier = form.code_verifier;
        const pkce = `${DISCORD_DOCS}/discord-social-sdk/development-guides/account-linking-on-mobile`;
        if (!verifier)
          throw oauthRefusal(
            400,
            'invalid_request',
            'Missing "code_verifier"',
            `a code issued with a code_challenge needs its code_verifier (${pkce})`,
          );
        // RFC 7636 §4.1: 43-128 unreserved characters.
        if (!/^[A-Za-z0-9\-._~]{43,128}$/.test(verifier))
          throw oauthRefusal(
            400,
            'invalid_request',
            'Invalid "code_verifier"',
            `code_verifier is 43-128 unreserved characters (RFC 7636 §4.1, ${pkce})`,
          );
        if (createHash('sha256').update(verifier).digest('base64url') !== pending.challenge)
          throw oauthRefusal(400, 'invalid_grant', 'Invalid "code_verifier"');
      }
      const tokens = this.issueTokens(client.clientId, pending.scopes, pending.guild);
      return {
        status: 200,
        body: {
          ...tokens,
          ...(pending.scopes.includes('bot') ? { guild: guildObject(pending.guild, this.installer.id) } : {}),
        },
      };
    }
    if (form.grant_type === 'refresh_token') {
      if (!form.refresh_token) {
        throw oauthRefusal(
          400,
          'invalid_request',
          'Missing "refresh_token" in request.',
          `grant_type refresh_token needs "refresh_token" (${DISCORD_DOCS}/topics/oauth2#authorization-code-grant-refresh-token-exchange-example)`,
        ); // description: fake's wording
      }
      const grant = this.refreshTokens.get(form.refresh_token);
      if (!grant || grant.revoked || grant.clientId !== client.clientId)
        throw oauthRefusal(400, 'invalid_grant', 'Invalid "refresh_token" in request.');
      // The fake rotates refresh tokens: the one just used is spent.
      this.refreshTokens.delete(form.refresh_token);
      return { status: 200, body: this.issueTokens(client.clientId, grant.scopes, grant.guild) };
    }
    if (form.grant_type === 'client_credentials')
      throw new Error('grant_type client_credentials is documented but not implemented by the fake');
    throw oauthRefusal(
      400,
      'unsupported_grant_type',
      undefined,
      `grant_type is authorization_code, refresh_token or client_credentials, got ${JSON.stringify(form.grant_type ?? null)} (${DISCORD_DOCS}/topics/oauth2#authorization-code-grant)`,
    );
  }

  private issueTokens(clientId: string, scopes: string[], guild: DiscordGuild): Record<string, unknown> {
    const accessToken = randomAlnum(30);
    const refreshToken = randomAlnum(30);
    const grant: DiscordGrant = {
      clientId,
      scopes,
      guild,
      expiresAt: Date.now() + this.accessTokenTtl * 1000,
      revoked: false,
    };
    this.accessTokens.set(accessToken, grant);
    this.refreshTokens.set(refreshToken, { ...grant, expiresAt: Infinity });
    return {
      token_type: 'Bearer',
      access_token: accessToken,
      expires_in: this.accessTokenTtl,
      refresh_token: refreshToken,
      scope: scopes.join(' '),
    };
  }

  /** `Authorization: TOKEN_TYPE TOKEN` with Bot or Bearer (reference#authentication); a missing or other scheme breaks the contract. */
  private authorization(
    x: Exchange,
    allowed: readonly ('Bot' | 'Bearer')[],
    route: string,
  ): { scheme: 'Bot' | 'Bearer'; token: string } {
    const header = x.headers.authorization;
    if (!header)
      throw discordUnauthorized(`${route} without an Authorization header (${DISCORD_DOCS}/reference#authentication)`);
    const m = /^(Bot|Bearer) (\S+)$/.exec(header);
    if (!m)
      throw discordUnauthorized(
        `Authorization must be "Bot <token>" or "Bearer <token>", got "${header.split(' ')[0]} …" (${DISCORD_DOCS}/reference#authentication)`,
      );
    const scheme = m[1] as 'Bot' | 'Bearer';
    if (!allowed.includes(scheme))
      throw discordUnauthorized(
        `${route} takes ${allowed.map((s) => `${s} <token>`).join(' or ')}, not ${scheme} (${DISCORD_DOCS}/reference#authentication)`,
      );
    return { scheme, token: m[2]! };
  }

  /** Authorization: Bearer <access token>, unexpired. */
  private grantOf(token: string): DiscordGrant | undefined {
    const grant = this.accessTokens.get(token);
    return grant && !grant.revoked && grant.expiresAt > Date.now() ? grant : undefined;
  }

  /** GET /oauth2/@me: what an access token grants. */
  private currentAuthorization(x: Exchange): Reply {
    const grant = this.grantOf(this.authorization(x, ['Bearer'], 'GET /oauth2/@me').token);
    if (!grant) throw discordUnauthorized();
    return {
      status: 200,
      body: {
        application: {
          id: grant.clientId,
          name: 'Gatehouse',
          icon: null,
          description: '',
          bot_public: true,
          bot_require_code_grant: false,
          verify_key: this.publicKeyHex,
        },
        scopes: grant.scopes,
        expires: new Date(grant.expiresAt).toISOString(),
        ...(grant.scopes.includes('identify') ? { user: this.installer } : {}),
      },
    };
  }

  /** GET /users/@me: the bot user for a bot token; the installer for a Bearer token with `identify`. */
  private currentUser(x: Exchange): Reply {
    const { scheme, token } = this.authorization(x, ['Bot', 'Bearer'], 'GET /users/@me');
    if (scheme === 'Bearer') {
      const grant = this.grantOf(token);
      if (!grant || !grant.scopes.includes('identify')) throw discordUnauthorized();
      return { status: 200, body: this.installer };
    }
    if (token !== this.botToken) throw discordUnauthorized();
    return {
      status: 200,
      body: {
        ...this.botUser,
        public_flags: 0,
        flags: 0,
        banner: null,
        accent_color: null,
        mfa_enabled: false,
        verified: true,
      },
    };
  }

  /** POST /channels/{channel.id}/messages (resources/message#create-message). */
  private createMessage(route: DocumentedRoute, x: Exchange, channelId: string): Reply {
    const { token } = this.authorization(x, ['Bot'], 'Create Message');
    if (token !== this.botToken) throw discordUnauthorized();
    checkDiscordContentType(route, x);
    // A snowflake is a uint64 (reference#snowflakes); anything else fails coercion.
    if (!/^\d{1,20}$/.test(channelId) || BigInt(channelId) >= 1n << 64n) {
      throw invalidFormBody(
        'channel_id',
        'NUMBER_TYPE_COERCE',
        `Value "${channelId}" is not snowflake.`,
        `channel.id must be a snowflake (${DISCORD_DOCS}/reference#snowflakes)`,
      );
    }
    if (!this.channels.has(channelId)) throw new Refusal(discordError(404, 'Unknown Channel', 10003));
    refuseMultipart(x);
    if (!x.parsed)
      throw new Refusal(
        discordError(400, 'The request body contains invalid JSON.', 50109),
        `discord: the body is not JSON (${DISCORD_DOCS}/topics/opcodes-and-status-codes#json-json-error-codes)`,
      );
    const body = isRecord(x.body) ? x.body : {};
    const source = `${DISCORD_DOCS}/resources/message#create-message`;
    const content = typeof body.content === 'string' ? body.content : '';
    const hasOther = ['embeds', 'components', 'sticker_ids', 'attachments', 'poll'].some((k) =>
      Array.isArray(body[k]) ? body[k].length > 0 : body[k] !== undefined,
    );
    // "apps must provide a value for at least one of content, embeds, sticker_ids, components,
    // files[n], or poll". Discord trims content; a blank one counting as empty is what it has been
    // seen to do, not a documented rule.
    if (!content.trim() && !hasOther)
      throw new Refusal(
        discordError(400, 'Cannot send an empty message', 50006),
        `discord: a message needs content, embeds, sticker_ids, components, files or a poll (${source})`,
      );
    // "Message contents (up to 2000 characters)"; characters counted as code points (not defined there).
    if (characters(content) > 2000)
      throw invalidFormBody(
        'content',
        'BASE_TYPE_MAX_LENGTH',
        'Must be 2000 or fewer in length.',
        `content is up to 2000 characters (${source})`,
      );
    if (body.nonce !== undefined && String(body.nonce).length > 25)
      throw invalidFormBody(
        'nonce',
        'BASE_TYPE_MAX_LENGTH',
        'Must be 25 or fewer in length.',
        `nonce is up to 25 characters (${source})`,
      );
    const message: DiscordMessage = {
      id: this.snowflake(),
      type: 0,
      channel_id: channelId,
      content,
      author: this.botUser,
      timestamp: new Date().toISOString().replace(/\.(\d{3})Z$/, '.$1000+00:00'),
      edited_timestamp: null,
      tts: body.tts === true,
      mention_everyone: false,
      mentions: [],
      mention_roles: [],
      attachments: [],
      embeds: Array.isArray(body.embeds) ? body.embeds : [],
      components: Array.isArray(body.components) ? body.components : [],
      pinned: false,
      flags: 0,
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

/**
 * "Clients using the HTTP API must provide a valid User Agent … User-Agent: DiscordBot ($url,
 * $versionNumber)"; otherwise they "may be blocked and return a Cloudflare error", JSON code
 * 40333 (reference#user-agent). The fake always blocks; the message is what Discord has been seen to say.
 */
function checkDiscordUserAgent(x: Exchange): void {
  const agent = String(x.headers['user-agent'] ?? '');
  if (!DISCORD_USER_AGENT.test(agent)) {
    throw new Refusal(
      discordError(403, 'internal network error', 40333),
      `discord: User-Agent "${agent}" is not "DiscordBot ($url, $versionNumber)" (${DISCORD_DOCS}/reference#user-agent)`,
    );
  }
}

/**
 * Bodies: "Clients using the HTTP API must provide a valid Content-Type header, either
 * application/json, application/x-www-form-urlencoded, or multipart/form-data, except where
 * specified. Failing to do so will result in a 50035 "Invalid form body" error"
 * (reference#content-type). The token URLs "will only accept a content type of
 * application/x-www-form-urlencoded. JSON content is not permitted and will return an error"
 * (topics/oauth2#shared-resources-oauth2-urls): which error is not said; the fake answers what
 * Discord has been seen to answer a JSON body.
 */
function checkDiscordContentType(route: DocumentedRoute, x: Exchange): void {
  if (route.bodyTypes.includes(x.mediaType)) return;
  const got = x.mediaType || 'no Content-Type';
  if (route.name === 'POST /oauth2/token') {
    throw oauthRefusal(
      400,
      'unsupported_grant_type',
      'Grant type None is not supported',
      `the token URL takes only application/x-www-form-urlencoded, got ${got} (${DISCORD_DOCS}/topics/oauth2#shared-resources-oauth2-urls)`,
    );
  }
  throw new Refusal(
    discordError(400, 'Invalid Form Body', 50035),
    `discord: ${route.name} takes ${route.bodyTypes.join(', ')}, got ${got} (${DISCORD_DOCS}/reference#content-type)`,
  );
}

/** Where an endpoint's answer to an interaction breaks interactions/receiving-and-responding. */
function interactionAnswerProblems(type: unknown, answer: Omit<DeliveryResult, 'violations'>): string[] {
  const source = `${DISCORD_DOCS}/interactions/receiving-and-responding#responding-to-an-interaction`;
  const problems: string[] = [];
  // "you must send an initial response within 3 seconds of receiving the event"
  if (answer.elapsedMs > 3000)
    problems.push(
      `discord: the interaction was answered after ${Math.round(answer.elapsedMs)} ms, not within 3 s (${source})`,
    );
  if (answer.status < 200 || answer.status > 299)
    return [
      ...problems,
      `discord: a signed interaction was answered ${answer.status}: Discord shows "This interaction failed" (${source})`,
    ];
  // "You must provide a valid Content-Type when responding to PINGs" (interactions/overview); the response is a JSON object.
  const contentType = String(answer.headers['content-type'] ?? '')
    .split(';')[0]!
    .trim()
    .toLowerCase();
  if (contentType !== 'application/json')
    problems.push(
      `discord: the interaction response's Content-Type is "${contentType}", not application/json (${DISCORD_DOCS}/interactions/overview#acknowledging-ping-requests)`,
    );
  let callback: unknown;
  try {
    callback = (JSON.parse(answer.body) as { type?: unknown }).type;
  } catch {
    return [...problems, `discord: the interaction response is not JSON (${source})`];
  }
  const allowed = typeof type === 'number' ? DISCORD_CALLBACK_TYPES[type] : undefined;
  if (!allowed) problems.push(`discord: the fake sent an interaction of unknown type ${JSON.stringify(type)}`);
  else if (typeof callback !== 'number' || !allowed.includes(callback)) {
    problems.push(
      `discord: an interaction of type ${type} was answered with callback type ${JSON.stringify(callback)}; allowed: ${allowed.join(', ')} (${DISCORD_DOCS}/interactions/receiving-and-responding#interaction-response-object-interaction-callback-type)`,
    );
  }
  return problems;
}

/** The Guild object in the token response of a bot install (the fields a channel might read). */
function guildObject(guild: DiscordGuild, ownerId: string): Record<string, unknown> {
  return {
    id: guild.id,
    name: guild.name,
    icon: null,
    description: null,
    splash: null,
    banner: null,
    owner_id: ownerId,
    features: [],
    roles: [],
    emojis: [],
    stickers: [],
    verification_level: 0,
    nsfw_level: 0,
    premium_tier: 0,
    preferred_locale: 'en-US',
    system_channel_id: null,
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
  /**
   * Signs `body` and POSTs it to an Events API request URL as Slack does; `violations` says where
   * the answer breaks what Slack documents (a 2xx within 3 s; url_verification echoes the challenge).
   */
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

const SLACK_DOCS = 'https://docs.slack.dev';
/** The POST bodies the Web API reads ("invalid_post_type … Valid types are: application/json application/x-www-form-urlencoded multipart/form-data text/plain"). */
const SLACK_POST_TYPES = ['application/x-www-form-urlencoded', 'application/json', 'multipart/form-data', 'text/plain'];
/** "invalid_charset … Valid charset names are: utf-8 iso-8859-1." */
const SLACK_CHARSETS = ['utf-8', 'iso-8859-1'];

const slackMethod = (name: string, bodyTypes: string[], auth: string, required: string[]): DocumentedRoute => ({
  // "Pass arguments as GET querystring parameters, POST parameters …, or a mix of both" (apis/web-api#basics).
  platform: 'slack',
  name,
  methods: ['GET', 'POST'],
  bodyTypes,
  auth,
  required,
  source: `${SLACK_DOCS}/reference/methods/${name}`,
});

/** The Slack pages and Web API methods the fake serves, each as https://docs.slack.dev documents it. */
export const SLACK_METHODS: readonly DocumentedRoute[] = [
  {
    platform: 'slack',
    name: 'GET /oauth/v2/authorize',
    methods: ['GET'],
    bodyTypes: [],
    auth: "none: the user's browser",
    required: ['client_id', 'scope or user_scope'],
    source: `${SLACK_DOCS}/authentication/installing-with-oauth`,
  },
  // "Content types: application/x-www-form-urlencoded" only; the client "using the HTTP Basic authentication scheme" or as arguments.
  slackMethod(
    'oauth.v2.access',
    ['application/x-www-form-urlencoded'],
    'the client: HTTP Basic, or client_id and client_secret',
    ['code (grant_type authorization_code)'],
  ),
  slackMethod(
    'auth.test',
    ['application/x-www-form-urlencoded', 'application/json'],
    'Authorization: Bearer <token> (or token in a form or query)',
    [],
  ),
  slackMethod(
    'chat.postMessage',
    ['application/x-www-form-urlencoded', 'application/json'],
    'Authorization: Bearer <token> (or token in a form or query); JSON needs the header',
    ['channel', 'one of text, blocks, attachments'],
  ),
];

/** A Web API error: HTTP 200 with ok:false, as Slack answers. `violation`: the documented rule the call broke, if that is why. */
class SlackError extends Error {
  constructor(
    readonly error: string,
    readonly extra: Record<string, unknown> = {},
    readonly violation?: string,
  ) {
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
    this.consent = {
      deny: consent.deny ?? false,
      team: consent.team ?? this.consent.team,
      userId: consent.userId ?? this.consent.userId,
    };
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

  async deliverEvent(url: string, body: string | object, signingSecret: string): Promise<DeliveryResult> {
    const signed = this.signEvent(body, signingSecret);
    const answer = await this.deliver(
      url,
      {
        'Content-Type': 'application/json',
        'User-Agent': 'Slackbot 1.0 (+https://api.slack.com/robots)',
        ...signed.headers,
      },
      signed.body,
    );
    let event: Record<string, unknown> = {};
    try {
      event = JSON.parse(signed.body);
    } catch {
      // not JSON: judged on its status alone
    }
    return { ...answer, violations: eventAnswerProblems(event, answer) };
  }

  protected resolve(x: Exchange): Resolved {
    const authorize = SLACK_METHODS[0]!;
    if (x.path === '/oauth/v2/authorize') {
      if (x.method !== 'GET')
        throw new Refusal(
          htmlPage(405, 'Method Not Allowed'),
          `slack: the install page is opened with GET (${authorize.source})`,
        ); // fake's wording
      return { route: authorize, handle: () => this.authorize(x) };
    }
    // "all with URLs in the form https://slack.com/api/METHOD_FAMILY.method" (apis/web-api#basics)
    const name = /^\/api\/([A-Za-z0-9._]+)$/.exec(x.path)?.[1];
    if (name === undefined)
      throw new Refusal(
        htmlPage(404, 'Not Found'),
        `slack: ${x.path} is not /api/<method> (${SLACK_DOCS}/apis/web-api#basics)`,
      );
    const route = SLACK_METHODS.find((r) => r.name === name);
    // Slack's answer to a method it does not have; the 404 status is what it has been seen to send.
    if (!route)
      throw new Refusal(
        { status: 404, body: { ok: false, error: 'unknown_method', req_method: name } },
        `slack: no Web API method "${name}" (${SLACK_DOCS}/reference/methods)`,
      );
    if (!route.methods.includes(x.method)) {
      // The reference speaks of GET and POST only; what Slack answers to others is not documented.
      throw new Refusal(
        { status: 405, body: { ok: false, error: 'method_not_allowed' } },
        `slack: ${x.method}: Web API methods take GET or POST (${SLACK_DOCS}/apis/web-api#basics)`,
      ); // fake's wording
    }
    return { route, handle: () => this.webApi(route, x) };
  }

  protected failureReply(status: number): Reply {
    if (status === 429) return { status, body: { ok: false, error: 'ratelimited' }, headers: { 'retry-after': '1' } };
    return { status, body: { ok: false, error: 'fatal_error' } };
  }

  /** A Web API call: always HTTP 200, `ok: false` and an error code when it fails, warnings riding along. */
  private webApi(route: DocumentedRoute, x: Exchange): Reply {
    const warnings: string[] = [];
    let body: Record<string, unknown>;
    try {
      const params: Record<string, unknown> = {
        ...Object.fromEntries(x.url.searchParams),
        ...this.arguments(route, x, warnings),
      };
      switch (route.name) {
        case 'oauth.v2.access':
          body = this.oauthAccess(x, params);
          break;
        case 'auth.test':
          body = this.authTest(x, params);
          break;
        case 'chat.postMessage':
          body = this.postMessage(x, params);
          break;
        default:
          throw new Error(`${route.name} is documented but not implemented by the fake`);
      }
    } catch (err) {
      if (!(err instanceof SlackError)) throw err;
      if (err.violation) x.call.violations.push(`slack: ${err.violation}`);
      body = { ok: false, error: err.error, ...err.extra };
    }
    // Slack's warnings ride along on successes and errors alike.
    if (warnings.length) Object.assign(body, { warning: warnings.join(','), response_metadata: { warnings } });
    return { status: 200, body };
  }

  /**
   * The arguments a POST body carries (apis/web-api, "POST bodies"; the common errors every
   * method page lists). A token in a JSON body is not read: "To make use of sending JSON on write
   * operations, you must provide your token value using an Authorization HTTP header."
   */
  private arguments(route: DocumentedRoute, x: Exchange, warnings: string[]): Record<string, unknown> {
    if (x.method !== 'POST' || x.raw === '') return {};
    const source = `${route.source} (Errors)`;
    if (!x.contentType)
      throw new SlackError('missing_post_type', {}, `a POST with a body needs a Content-Type (${source})`);
    if (!SLACK_POST_TYPES.includes(x.mediaType))
      throw new SlackError('invalid_post_type', {}, `${x.mediaType} is not a Web API POST type (${source})`);
    if (x.charset !== undefined && !SLACK_CHARSETS.includes(x.charset))
      throw new SlackError('invalid_charset', {}, `charset ${x.charset} is not utf-8 or iso-8859-1 (${source})`);
    refuseMultipart(x);
    if (!route.bodyTypes.includes(x.mediaType)) {
      // Which error Slack gives is not documented; the fake reads no arguments from such a body.
      x.call.violations.push(
        `slack: ${route.name} does not take ${x.mediaType} (${route.source}, Content types); its arguments were not read`,
      );
      return {};
    }
    if (x.mediaType === 'application/json') {
      if (!x.parsed) throw new SlackError('invalid_json', {}, `the JSON body does not parse (${source})`);
      if (!isRecord(x.body)) throw new SlackError('json_not_object', {}, `the JSON body is not an object (${source})`);
      // "missing_charset: The method was called via a POST request, and recommended practice for the specified Content-Type is to include a charset parameter."
      if (x.charset === undefined) {
        warnings.push('missing_charset');
        x.call.violations.push(
          `slack: JSON without "; charset=utf-8" draws the missing_charset warning (${SLACK_DOCS}/apis/web-api#posting_json)`,
        );
      }
      const args = { ...x.body };
      if ('token' in args) {
        x.call.violations.push(
          `slack: a token in a JSON body is not read; JSON needs Authorization: Bearer (${SLACK_DOCS}/apis/web-api#posting_json)`,
        );
        delete args.token;
      }
      return args;
    }
    // "superfluous_charset: … the specified Content-Type does not expect a charset parameter."
    if (x.charset !== undefined) {
      warnings.push('superfluous_charset');
      x.call.violations.push(`slack: a form with a charset draws the superfluous_charset warning (${source})`);
    }
    return isRecord(x.body) ? x.body : {};
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
    if (!redirectUri || !redirectAllowed(client.redirectUris, redirectUri))
      return htmlPage(400, 'redirect_uri did not match any configured URIs');
    // "scope: A comma-separated list of scopes"
    const scopes = (q.get('scope') ?? '').split(/[,\s]+/).filter(Boolean);
    if (!scopes.length && !q.get('user_scope')) return htmlPage(400, 'Invalid permissions requested');
    const back = new URL(redirectUri);
    const state = q.get('state');
    if (this.consent.deny) {
      back.searchParams.set('error', 'access_denied');
    } else {
      const code = `${randomDigits(13)}.${randomDigits(13)}.${randomBytes(32).toString('hex')}`;
      this.codes.set(code, {
        clientId: client.clientId,
        redirectUri: given,
        scopes,
        team: this.consent.team,
        userId: this.consent.userId,
        expiresAt: Date.now() + 600_000,
        used: false,
      });
      back.searchParams.set('code', code);
    }
    if (state !== null) back.searchParams.set('state', state);
    return redirectTo(back);
  }

  /** oauth.v2.access (reference/methods/oauth.v2.access): a form with code (+ redirect_uri); the client by body or HTTP Basic. */
  private oauthAccess(x: Exchange, p: Record<string, unknown>): Record<string, unknown> {
    const source = `${SLACK_DOCS}/reference/methods/oauth.v2.access`;
    const creds = clientCredentials(x.headers, {
      client_id: scalar(p.client_id),
      client_secret: scalar(p.client_secret),
    });
    if (creds.id === undefined)
      throw new SlackError(
        'invalid_client_id',
        {},
        `oauth.v2.access needs the client, by HTTP Basic or client_id and client_secret (${source})`,
      );
    const client = this.clients.get(creds.id);
    if (!client) throw new SlackError('invalid_client_id');
    if (creds.secret !== client.clientSecret) throw new SlackError('bad_client_secret');
    // "grant_type: The grant_type param as described in the OAuth spec": authorization_code, or refresh_token with token rotation.
    const grantType = scalar(p.grant_type) ?? 'authorization_code';
    if (grantType === 'refresh_token')
      throw new Error('grant_type refresh_token (token rotation) is documented but not implemented by the fake');
    if (grantType !== 'authorization_code')
      throw new SlackError(
        'invalid_grant_type',
        {},
        `grant_type is authorization_code or refresh_token, got ${grantType} (${source})`,
      );
    const code = scalar(p.code);
    if (!code) throw new SlackError('invalid_code', {}, `oauth.v2.access without "code" (${source})`);
    const pending = this.codes.get(code);
    if (!pending || pending.used || pending.expiresAt <= Date.now() || pending.clientId !== client.clientId)
      throw new SlackError('invalid_code');
    pending.used = true;
    // "This must match the originally submitted URI (if one was sent)."
    if (pending.redirectUri !== undefined && scalar(p.redirect_uri) !== pending.redirectUri)
      throw new SlackError('bad_redirect_uri');
    const install = this.install(client, pending.team, pending.scopes);
    return {
      ok: true,
      access_token: install.token,
      token_type: 'bot',
      scope: pending.scopes.join(','),
      bot_user_id: install.botUserId,
      app_id: client.appId,
      team: { name: pending.team.name, id: pending.team.id },
      enterprise: null,
      authed_user: { id: pending.userId },
      is_enterprise_install: false,
    };
  }

  private install(client: FakeSlackClient, team: SlackTeam, scopes: string[]): SlackInstall & { token: string } {
    // One bot user per app and workspace, stable across reinstalls.
    const seed = createHash('sha256').update(`${client.appId}/${team.id}`).digest('hex').toUpperCase();
    const install: SlackInstall = {
      clientId: client.clientId,
      appId: client.appId,
      team,
      scopes,
      botUserId: `U0${seed.slice(0, 9)}`,
      botId: `B0${seed.slice(9, 18)}`,
      revoked: false,
    };
    const token = `xoxb-${randomDigits(13)}-${randomDigits(13)}-${randomAlnum(24)}`;
    this.tokens.set(token, install);
    return { ...install, token };
  }

  // ── Web API ──

  /** The token from `Authorization: Bearer` ("you must pre-pend Bearer") or, in a form or query, `token`. */
  private authenticate(x: Exchange, p: Record<string, unknown>, route: string): SlackInstall & { token: string } {
    const header = x.headers.authorization;
    const source = `${SLACK_DOCS}/apis/web-api#posting_json`;
    // How Slack answers another scheme is not documented; it reads no token from it.
    if (header !== undefined && !/^Bearer \S+$/.test(header))
      throw new SlackError(
        'not_authed',
        {},
        `Authorization must be "Bearer <token>", got "${header.split(' ')[0]} …" (${source})`,
      );
    const token = header ? header.slice('Bearer '.length) : scalar(p.token);
    if (!token) throw new SlackError('not_authed', {}, `${route} without a token (${source})`);
    const install = this.tokens.get(token);
    if (!install) throw new SlackError('invalid_auth');
    if (install.revoked) throw new SlackError('token_revoked');
    return { ...install, token };
  }

  private authTest(x: Exchange, p: Record<string, unknown>): Record<string, unknown> {
    const a = this.authenticate(x, p, 'auth.test');
    return {
      ok: true,
      url: `https://${a.team.domain}.slack.com/`,
      team: a.team.name,
      user: 'gatehouse',
      team_id: a.team.id,
      user_id: a.botUserId,
      bot_id: a.botId,
      is_enterprise_install: false,
    };
  }

  /** chat.postMessage (reference/methods/chat.postMessage). */
  private postMessage(x: Exchange, p: Record<string, unknown>): Record<string, unknown> {
    const source = `${SLACK_DOCS}/reference/methods/chat.postMessage`;
    const a = this.authenticate(x, p, 'chat.postMessage');
    if (!a.scopes.includes('chat:write'))
      throw new SlackError('missing_scope', { needed: 'chat:write', provided: a.scopes.join(',') });
    const channel = scalar(p.channel);
    if (!channel)
      throw new SlackError('channel_not_found', {}, `chat.postMessage without its required "channel" (${source})`);
    if (!this.channels.has(channel)) throw new SlackError('channel_not_found');
    const text = scalar(p.text) || undefined;
    if (!text && p.blocks === undefined && p.attachments === undefined)
      throw new SlackError('no_text', {}, `chat.postMessage needs text, blocks or attachments (${source})`);
    if (text && characters(text) > 40_000)
      throw new SlackError('msg_too_long', {}, `text is at most 40,000 characters (${source})`);
    const ts = this.nextTs();
    this.sent.push({ token: a.token, channel, text, params: p, ts });
    return {
      ok: true,
      channel,
      ts,
      message: {
        user: a.botUserId,
        type: 'message',
        ts,
        bot_id: a.botId,
        app_id: a.appId,
        text: text ?? '',
        team: a.team.id,
        bot_profile: {
          id: a.botId,
          app_id: a.appId,
          name: 'gatehouse',
          icons: {},
          deleted: false,
          updated: Math.floor(Date.now() / 1000),
          team_id: a.team.id,
        },
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

/**
 * Where a Request URL's answer breaks the Events API: "Your app should respond to the event
 * request with an HTTP 2xx within three seconds" (apis/events-api, "Responding to events"), and
 * url_verification is answered with the challenge as text/plain, a form or JSON
 * (reference/events/url_verification).
 */
function eventAnswerProblems(event: Record<string, unknown>, answer: Omit<DeliveryResult, 'violations'>): string[] {
  const problems: string[] = [];
  if (answer.elapsedMs > 3000)
    problems.push(
      `slack: the event was answered after ${Math.round(answer.elapsedMs)} ms, not within 3 s; Slack retries (${SLACK_DOCS}/apis/events-api)`,
    );
  if (answer.status < 200 || answer.status > 299)
    problems.push(
      `slack: the event was answered ${answer.status}, not 2xx; Slack retries (${SLACK_DOCS}/apis/events-api)`,
    );
  if (event.type === 'url_verification') {
    const contentType = String(answer.headers['content-type'] ?? '')
      .split(';')[0]!
      .trim()
      .toLowerCase();
    let echoed: unknown;
    try {
      echoed =
        contentType === 'application/json'
          ? (JSON.parse(answer.body) as { challenge?: unknown }).challenge
          : contentType === 'application/x-www-form-urlencoded'
            ? new URLSearchParams(answer.body).get('challenge')
            : answer.body;
    } catch {
      echoed = undefined;
    }
    if (answer.status !== 200 || echoed !== event.challenge)
      problems.push(
        `slack: url_verification was not answered 200 with the challenge (${SLACK_DOCS}/reference/events/url_verification)`,
      );
  }
  return problems;
}

// ─── Plumbing ─────────────────────────────────────────────────────────────────────────────────

function parseBody(raw: string, contentType: string): { body: unknown; parsed: boolean } {
  if (!raw) return { body: undefined, parsed: true };
  if (contentType.startsWith('application/x-www-form-urlencoded'))
    return { body: Object.fromEntries(new URLSearchParams(raw)), parsed: true };
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
function clientCredentials(
  headers: http.IncomingHttpHeaders,
  form: { client_id?: string; client_secret?: string },
): { id?: string; secret?: string } {
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
  return {
    status,
    body: `<!doctype html><title>${text}</title><p>${text}</p>`,
    headers: { 'content-type': 'text/html; charset=utf-8' },
  };
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
