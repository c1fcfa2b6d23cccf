import { secretEquals, sha256 } from './hmac.js';
import { headerValue, type WebhookVerifier } from './types.js';

/** Delivery id headers a generic sender may give, in order of preference. */
const DELIVERY_ID_HEADERS = ['idempotency-key', 'webhook-id', 'x-github-delivery'] as const;

/** `X-Webhook-Secret` equals the endpoint's secret (hashed, compared in constant time). The default. */
export function secretVerifier(config: { secret: string }): WebhookVerifier {
  const expected = sha256(config.secret);
  return {
    checkHeaders(headers) {
      const presented = headerValue(headers, 'x-webhook-secret');
      if (secretEquals(presented, expected)) return { ok: true };
      return { ok: false, reason: presented === undefined ? 'no X-Webhook-Secret' : 'wrong X-Webhook-Secret' };
    },
    deliveryId(headers) {
      for (const name of DELIVERY_ID_HEADERS) {
        const value = headers[name];
        if (typeof value === 'string') return value;
      }
      return undefined;
    },
  };
}
