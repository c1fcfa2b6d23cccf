import { hubSignature } from './github.js';
import { secretEquals, sha256 } from './hmac.js';
import { dig, saneId, type WebhookVerifier } from './types.js';

/**
 * Meta (WhatsApp Cloud API, Messenger, Instagram): POST `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(appSecret, body)>`;
 * GET `hub.mode=subscribe&hub.verify_token=…&hub.challenge=…` echoes the challenge when the token matches, else 403.
 * Deduped on the ids below and on the signature (a replay after those ids left the idempotency window).
 * https://developers.facebook.com/docs/graph-api/webhooks/getting-started
 */
/** `a:b` from primitive parts; none when a part is an object (String() of a JSON object with its own `toString` throws). */
function composedId(...parts: unknown[]): string | undefined {
  return parts.some((p) => p !== null && typeof p === 'object') ? undefined : saneId(parts.map(String).join(':'));
}

export function metaVerifier(config: { appSecret: string; verifyToken: string }): WebhookVerifier {
  const verifyToken = sha256(config.verifyToken);
  return {
    ...hubSignature([config.appSecret]),
    // WhatsApp or Messenger message id; a WhatsApp status update's id and status; else the entry's id and time.
    deliveryId(_headers, body) {
      const entry = dig(body, 'entry', 0);
      const messageId =
        dig(entry, 'changes', 0, 'value', 'messages', 0, 'id') ?? dig(entry, 'messaging', 0, 'message', 'mid');
      if (messageId !== undefined) return saneId(messageId);
      // Status updates (sent, delivered, read) share the message's id: the status tells them apart.
      const status = dig(entry, 'changes', 0, 'value', 'statuses', 0);
      if (dig(status, 'id') !== undefined) return composedId(dig(status, 'id'), dig(status, 'status'));
      const entryId = dig(entry, 'id');
      const time = dig(entry, 'time');
      return entryId !== undefined && time !== undefined ? composedId(entryId, time) : undefined;
    },
    answerGet(query) {
      const challenge = query.get('hub.challenge') ?? '';
      if (
        query.get('hub.mode') === 'subscribe' &&
        secretEquals(query.get('hub.verify_token') ?? undefined, verifyToken) &&
        /^[\x21-\x7e]{1,512}$/.test(challenge)
      ) {
        return { answer: { status: 200, contentType: 'text/plain; charset=utf-8', body: challenge } };
      }
      return { failed: 'Meta subscription check with a wrong or missing hub.verify_token' };
    },
  };
}
