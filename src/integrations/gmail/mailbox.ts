import type { gmail_v1 } from '@googleapis/gmail';
import type { Logger } from 'pino';
import type { GmailConfig } from '../../config/schema.js';
import type { NewEvent } from '../../webhooks/store.js';
import { buildEnvelope, compileTemplate, type CompiledTemplate } from '../../webhooks/translate.js';
import { isGoogleNotFound } from './google.js';
import { historyIdAfter, type GmailStore } from './state.js';

/** What the target gets as `payload` for each new email. */
export interface EmailPayload {
  account: string;
  id: string;
  threadId: string;
  from: string;
  to: string;
  subject: string;
  date: string;
  snippet: string;
  body?: string;
  bodyTruncated?: boolean;
  labels: string[];
}

/** Gmail's Pub/Sub notification: "the mailbox changed up to historyId". */
export interface MailboxNotification {
  emailAddress: string;
  historyId: string;
  /** The traceparent of the push that brought it (tracing on): the emails' events join that trace. */
  traceContext?: string;
}

/** A resync after a lost cursor looks back from the last cursor move, with this margin. */
const RESYNC_MARGIN_MS = 10 * 60 * 1000;
const RESYNC_MAX_MESSAGES = 500;
const HEADERS = ['From', 'To', 'Subject', 'Date'];

/**
 * Turns notifications into events: reads the history since the stored cursor (all pages),
 * fetches each new email, and commits the events and the cursor move in one transaction. Only
 * once that resolves may the notification be acknowledged; if anything throws, it is not, and
 * Pub/Sub delivers it again. Notifications are handled one at a time (the cursor is one), by
 * one instance at a time when several share the storage.
 */
export class Mailbox {
  private readonly template: CompiledTemplate;
  private readonly endpoint: string;
  private queue: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly config: GmailConfig,
    private readonly deps: {
      gmail: gmail_v1.Gmail;
      state: GmailStore;
      logger: Logger;
      onAccepted: () => void;
      now?: () => number;
    },
  ) {
    this.template = compileTemplate(config.template);
    this.endpoint = `gmail:${config.account}`;
  }

  /** Resolves with the number of emails enqueued once they and the cursor are committed. */
  handle(notification: MailboxNotification): Promise<number> {
    // In this process one at a time (the queue); across instances sharing the storage, too (exclusively).
    const run = this.queue.then(() =>
      this.deps.state.exclusively(this.config.account, () => this.process(notification)),
    );
    this.queue = run.catch(() => undefined);
    return run;
  }

  /** Resolves once the notifications handed over so far are done (shutdown). */
  idle(): Promise<void> {
    return this.queue.then(() => undefined);
  }

  private async process(notification: MailboxNotification): Promise<number> {
    const { account } = this.config;
    const now = this.deps.now ?? Date.now;
    const current = await this.deps.state.get(account);
    if (!current?.cursor)
      throw new Error(`no mailbox cursor for ${account}: run \`gatehouse webhooks gmail setup --account ${account}\``);
    // A notification already covered by the cursor (a redelivery after a commit) changes nothing.
    if (!historyIdAfter(notification.historyId, current.cursor)) return 0;

    let found: { ids: { id: string; threadId: string }[]; cursor: string };
    try {
      found = await this.newMessagesSince(current.cursor);
    } catch (err) {
      // Google's own 404 only: an HTML 404 (a wrong URL, a misrouting proxy) is an error, not a lost cursor.
      if (!isGoogleNotFound(err)) throw err;
      // Gmail keeps about a week of history: past that, the cursor is unknown to it.
      found = await this.resync(current.cursorAt ?? now());
      this.deps.logger.warn(
        { account, from: current.cursor, to: found.cursor, candidates: found.ids.length },
        'gmail history id too old: resynced from the recent messages',
      );
    }

    const seen = await this.deps.state.seen(
      account,
      found.ids.map((m) => m.id),
    );
    const emails: { messageId: string; event: NewEvent }[] = [];
    for (const { id } of found.ids) {
      if (seen.has(id)) continue;
      const payload = await this.readEmail(id);
      if (payload) emails.push({ messageId: id, event: this.toEvent(payload, now(), notification.traceContext) });
    }
    const enqueued = await this.deps.state.commitEmails(account, emails, found.cursor, now());
    if (enqueued > 0) this.deps.onAccepted();
    this.deps.logger.info({ account, enqueued, cursor: found.cursor }, 'gmail notification handled');
    return enqueued;
  }

  /** history.list from the cursor, every page: the added messages (in a watched label) and the new cursor. */
  private async newMessagesSince(cursor: string): Promise<{ ids: { id: string; threadId: string }[]; cursor: string }> {
    const { labels } = this.config;
    const ids = new Map<string, string>();
    let pageToken: string | undefined;
    let latest = cursor;
    do {
      const { data } = await this.deps.gmail.users.history.list({
        userId: 'me',
        startHistoryId: cursor,
        historyTypes: ['messageAdded'],
        // One label can be filtered by Gmail; several are filtered here.
        labelId: labels.length === 1 ? labels[0] : undefined,
        pageToken,
        maxResults: 500,
      });
      for (const record of data.history ?? []) {
        for (const added of record.messagesAdded ?? []) {
          const message = added.message;
          if (!message?.id) continue;
          if (labels.length > 1 && !(message.labelIds ?? []).some((l) => labels.includes(l))) continue;
          ids.set(message.id, message.threadId ?? message.id);
        }
      }
      if (data.historyId && historyIdAfter(data.historyId, latest)) latest = data.historyId;
      pageToken = data.nextPageToken ?? undefined;
    } while (pageToken);
    return { ids: [...ids].map(([id, threadId]) => ({ id, threadId })), cursor: latest };
  }

  /**
   * The cursor is lost: the mailbox's current historyId becomes the cursor (read first, so
   * nothing arriving meanwhile falls between), and the messages received since the last
   * cursor move (minus a margin) are the candidates; the seen list drops those already sent.
   */
  private async resync(since: number): Promise<{ ids: { id: string; threadId: string }[]; cursor: string }> {
    const profile = await this.deps.gmail.users.getProfile({ userId: 'me' });
    const cursor = profile.data.historyId!;
    const ids: { id: string; threadId: string }[] = [];
    let pageToken: string | undefined;
    do {
      const { data } = await this.deps.gmail.users.messages.list({
        userId: 'me',
        labelIds: this.config.labels.length === 1 ? this.config.labels : undefined,
        q: `after:${Math.floor((since - RESYNC_MARGIN_MS) / 1000)}`,
        maxResults: 100,
        pageToken,
      });
      for (const m of data.messages ?? []) if (m.id) ids.push({ id: m.id, threadId: m.threadId ?? m.id });
      pageToken = data.nextPageToken ?? undefined;
    } while (pageToken && ids.length < RESYNC_MAX_MESSAGES);
    return { ids: ids.reverse(), cursor }; // oldest first, as history gives them
  }

  /** The email as the target gets it; undefined when it was deleted before it could be read. */
  private async readEmail(id: string): Promise<EmailPayload | undefined> {
    const { config } = this;
    let message: gmail_v1.Schema$Message;
    try {
      ({ data: message } = await this.deps.gmail.users.messages.get(
        config.includeBody
          ? { userId: 'me', id, format: 'full' }
          : { userId: 'me', id, format: 'metadata', metadataHeaders: HEADERS },
      ));
    } catch (err) {
      // Only Google's JSON 404 means the message is gone; any other failure leaves it for the retry.
      if (isGoogleNotFound(err)) {
        this.deps.logger.info({ account: config.account, id }, 'gmail message gone before it was read: skipped');
        return undefined;
      }
      throw err;
    }
    const labels = message.labelIds ?? [];
    if (config.labels.length > 1 && !labels.some((l) => config.labels.includes(l))) return undefined;
    const header = (name: string) =>
      message.payload?.headers?.find((h) => h.name?.toLowerCase() === name.toLowerCase())?.value ?? '';
    const payload: EmailPayload = {
      account: config.account,
      id,
      threadId: message.threadId ?? id,
      from: header('From'),
      to: header('To'),
      subject: header('Subject'),
      date: header('Date'),
      snippet: decodeEntities(message.snippet ?? ''),
      labels,
    };
    if (config.includeBody) Object.assign(payload, cutToBytes(textBody(message.payload), config.maxBytes));
    return payload;
  }

  private toEvent(payload: EmailPayload, receivedAt: number, traceContext: string | undefined): NewEvent {
    const { action } = this.config;
    const text = JSON.stringify(payload);
    return {
      endpoint: this.endpoint,
      action,
      idempotencyKey: payload.id,
      receivedAt,
      traceContext,
      envelope: (id) =>
        buildEnvelope(
          id,
          { action, endpoint: this.endpoint, receivedAt, template: this.template },
          payload as unknown as Record<string, unknown>,
          text,
        ),
    };
  }
}

/** A Map: an email's `&constructor;` must not find Object.prototype's. */
const NAMED_ENTITIES = new Map([
  ['amp', '&'],
  ['lt', '<'],
  ['gt', '>'],
  ['quot', '"'],
  ['apos', "'"],
  ['nbsp', '\u00a0'],
]);

/** Gmail sends `snippet` HTML-escaped (`&lt;`, `&#39;`); targets get plain text. */
export function decodeEntities(text: string): string {
  return text.replace(/&(#x[0-9a-f]+|#\d+|[a-z]+);/gi, (entity, body: string) => {
    if (body[0] !== '#') return NAMED_ENTITIES.get(body.toLowerCase()) ?? entity;
    const code = body[1] === 'x' || body[1] === 'X' ? parseInt(body.slice(2), 16) : Number(body.slice(1));
    return code > 0 && code <= 0x10ffff ? String.fromCodePoint(code) : entity;
  });
}

/** The text/plain part (depth-first), else the text/html part with its tags removed, else ''. */
export function textBody(part: gmail_v1.Schema$MessagePart | undefined): string {
  const find = (p: gmail_v1.Schema$MessagePart | undefined, mimeType: string): string | undefined => {
    if (!p) return undefined;
    if (p.mimeType === mimeType && p.body?.data) return Buffer.from(p.body.data, 'base64url').toString('utf8');
    for (const child of p.parts ?? []) {
      const found = find(child, mimeType);
      if (found !== undefined) return found;
    }
    return undefined;
  };
  const plain = find(part, 'text/plain');
  if (plain !== undefined) return plain;
  const html = find(part, 'text/html');
  return html === undefined
    ? ''
    : html
        .replace(/<(script|style)[^>]*>[\s\S]*?<\/\1>/gi, '')
        .replace(/<[^>]+>/g, ' ')
        .replace(/\s+/g, ' ')
        .trim();
}

/** At most `maxBytes` of UTF-8, never cutting a character in half. */
export function cutToBytes(text: string, maxBytes: number): { body: string; bodyTruncated?: true } {
  const bytes = Buffer.from(text, 'utf8');
  if (bytes.length <= maxBytes) return { body: text };
  let end = maxBytes;
  while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end--; // back to the start of a character
  return { body: bytes.subarray(0, end).toString('utf8'), bodyTruncated: true };
}
