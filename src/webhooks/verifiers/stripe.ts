import { digestEquals, fromHex, hmacSha256 } from './hmac.js';
import { headerValue, saneId, withinTolerance, type WebhookVerifier } from './types.js';

function parseStripeSignature(header: string | undefined): { t: string | undefined; v1: string[] } {
  const out = { t: undefined as string | undefined, v1: [] as string[] };
  for (const item of (header ?? '').split(',')) {
    const eq = item.indexOf('=');
    const key = item.slice(0, eq).trim();
    const value = item.slice(eq + 1).trim();
    if (key === 't') out.t = value;
    else if (key === 'v1') out.v1.push(value);
  }
  return out;
}

/**
 * Stripe: `Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256(secret, "t.body")>[,v1=…]`, any v1 of any secret,
 * and |now − t| ≤ toleranceSeconds. https://docs.stripe.com/webhooks#verify-manually
 */
export function stripeVerifier(config: { secrets: string[]; toleranceSeconds: number }): WebhookVerifier {
  return {
    checkHeaders(headers, now) {
      const header = headerValue(headers, 'stripe-signature');
      if (header === undefined) return { ok: false, reason: 'no Stripe-Signature' };
      const { t, v1 } = parseStripeSignature(header);
      if (v1.length === 0) return { ok: false, reason: 'Stripe-Signature has no v1 signature' };
      return withinTolerance(t, now, config.toleranceSeconds);
    },
    verifyBody(headers, rawBody) {
      const { t, v1 } = parseStripeSignature(headerValue(headers, 'stripe-signature'));
      const presented = v1.map((sig) => fromHex(sig, 32)).filter((b): b is Buffer => b !== undefined);
      let ok = false;
      for (const secret of config.secrets) {
        const expected = hmacSha256(secret, `${t}.`, rawBody);
        for (const sig of presented) ok = digestEquals(sig, expected) || ok;
      }
      return ok ? { ok: true } : { ok: false, reason: 'no v1 signature in Stripe-Signature matches the body' };
    },
    deliveryId: (_headers, body) => saneId(body.id),
  };
}
