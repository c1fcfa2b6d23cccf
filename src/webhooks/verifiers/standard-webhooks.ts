import { digestEquals, hmacSha256 } from './hmac.js';
import { headerValue, withinTolerance, type WebhookVerifier } from './types.js';

/** A Standard Webhooks secret: `whsec_<base64>` → the bytes it encodes. */
export function standardWebhooksKey(secret: string): Buffer {
  return Buffer.from(secret.startsWith('whsec_') ? secret.slice(6) : secret, 'base64');
}

/**
 * Standard Webhooks (Svix and others): `webhook-signature: v1,<b64 HMAC-SHA256(key, "id.ts.body")> …`
 * (space-separated), `webhook-id`, `webhook-timestamp` within 5 minutes; any of `secrets`.
 * https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md
 */
export function standardWebhooksVerifier(config: { secrets: string[]; toleranceSeconds: number }): WebhookVerifier {
  const keys = config.secrets.map(standardWebhooksKey);
  return {
    checkHeaders(headers, now) {
      if (headerValue(headers, 'webhook-id') === undefined) return { ok: false, reason: 'no webhook-id' };
      if (headerValue(headers, 'webhook-signature') === undefined) return { ok: false, reason: 'no webhook-signature' };
      return withinTolerance(headerValue(headers, 'webhook-timestamp'), now, config.toleranceSeconds);
    },
    verifyBody(headers, rawBody) {
      const id = headerValue(headers, 'webhook-id')!;
      const timestamp = headerValue(headers, 'webhook-timestamp')!;
      const presented = headerValue(headers, 'webhook-signature')!
        .split(' ')
        .filter((s) => s.startsWith('v1,'))
        .map((s) => Buffer.from(s.slice(3), 'base64'));
      let ok = false;
      for (const key of keys) {
        const expected = hmacSha256(key, `${id}.${timestamp}.`, rawBody);
        for (const sig of presented) ok = digestEquals(sig, expected) || ok;
      }
      return ok ? { ok: true } : { ok: false, reason: 'no v1 signature in webhook-signature matches the body' };
    },
    deliveryId: (headers) => headerValue(headers, 'webhook-id'),
  };
}
