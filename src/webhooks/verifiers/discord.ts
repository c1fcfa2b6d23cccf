import { createPublicKey, verify, type KeyObject } from 'node:crypto';
import { fromHex } from './hmac.js';
import { headerValue, saneId, withinTolerance, type WebhookVerifier } from './types.js';

/** A raw 32-byte Ed25519 public key (Discord gives it as hex) as a KeyObject. */
function ed25519PublicKey(hex: string): KeyObject {
  return createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: Buffer.from(hex, 'hex').toString('base64url') }, format: 'jwk' });
}

/**
 * Discord interactions: `X-Signature-Ed25519` (hex) over `timestamp + body` with the application's
 * public key, `X-Signature-Timestamp` within 5 minutes. Answers PING (type 1) with `{"type":1}`.
 * https://discord.com/developers/docs/interactions/overview#setting-up-an-endpoint-validating-security-request-headers
 */
export function discordVerifier(config: { publicKey: string; toleranceSeconds: number }): WebhookVerifier {
  const key = ed25519PublicKey(config.publicKey);
  return {
    checkHeaders(headers, now) {
      if (!fromHex(headerValue(headers, 'x-signature-ed25519'), 64)) return { ok: false, reason: 'missing or malformed X-Signature-Ed25519' };
      return withinTolerance(headerValue(headers, 'x-signature-timestamp'), now, config.toleranceSeconds);
    },
    verifyBody(headers, rawBody) {
      const signature = fromHex(headerValue(headers, 'x-signature-ed25519'), 64)!;
      const signed = Buffer.concat([Buffer.from(headerValue(headers, 'x-signature-timestamp')!, 'utf8'), rawBody]);
      return verify(null, signed, key, signature) ? { ok: true } : { ok: false, reason: 'X-Signature-Ed25519 does not verify' };
    },
    deliveryId: (_headers, body) => saneId(body.id),
    handshake(body) {
      return body.type === 1 ? { status: 200, contentType: 'application/json', body: '{"type":1}' } : undefined;
    },
  };
}
