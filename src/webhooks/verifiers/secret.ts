import { secretEquals, sha256 } from './hmac.js';
import { headerValue, type WebhookVerifier } from './types.js';

/** Delivery id headers a generic sender may give, in order of preference. */
const DELIVERY_ID_HEADERS = ['idempotency-key', 'webhook-id', 'x-github-delivery'] as const;

/** A header that must equal a secret (hashed, compared in constant time): X-Webhook-Secret, Telegram's token. */
export function headerSecret(header: string, secret: string): WebhookVerifier['checkHeaders'] {
  const expected = sha256(secret);
  return (headers) => {
    const presented = headerValue(headers, header);
    if (secretEquals(presented, expected)) return { ok: true };
    return { ok: false, reason: presented === undefined ? `no ${header}` : `wrong ${header}` };
  };
}

/** `X-Webhook-Secret` equals the endpoint's secret. The default. */
export function secretVerifier(config: { secret: string }): WebhookVerifier {
  return {
    checkHeaders: headerSecret('x-webhook-secret', config.secret),
    deliveryId(headers) {
      for (const name of DELIVERY_ID_HEADERS) {
        const value = headers[name];
        if (typeof value === 'string') return value;
      }
      return undefined;
    },
  };
}
