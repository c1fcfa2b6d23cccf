import { createPublicKey, verify, type KeyObject } from 'node:crypto';
import { fromHex } from './hmac.js';
import { headerValue, saneId, withinTolerance, type WebhookVerifier } from './types.js';

/** A raw 32-byte Ed25519 public key (Discord gives it as hex) as a KeyObject. */
function ed25519PublicKey(hex: string): KeyObject {
  return createPublicKey({
    key: { kty: 'OKP', crv: 'Ed25519', x: Buffer.from(hex, 'hex').toString('base64url') },
    format: 'jwk',
  });
}

/** Deferred responses by interaction type: components and modals update, autocomplete offers nothing, commands think. */
function deferredResponse(type: unknown): Record<string, unknown> {
  if (type === 3 || type === 5) return { type: 6 }; // DEFERRED_UPDATE_MESSAGE
  if (type === 4) return { type: 8, data: { choices: [] } }; // APPLICATION_COMMAND_AUTOCOMPLETE_RESULT
  return { type: 5 }; // DEFERRED_CHANNEL_MESSAGE_WITH_SOURCE
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
      if (!fromHex(headerValue(headers, 'x-signature-ed25519'), 64))
        return { ok: false, reason: 'missing or malformed X-Signature-Ed25519' };
      return withinTolerance(headerValue(headers, 'x-signature-timestamp'), now, config.toleranceSeconds);
    },
    verifyBody(headers, rawBody) {
      const signature = fromHex(headerValue(headers, 'x-signature-ed25519'), 64)!;
      const signed = Buffer.concat([Buffer.from(headerValue(headers, 'x-signature-timestamp')!, 'utf8'), rawBody]);
      return verify(null, signed, key, signature)
        ? { ok: true }
        : { ok: false, reason: 'X-Signature-Ed25519 does not verify' };
    },
    deliveryId: (_headers, body) => saneId(body.id),
    handshake(body) {
      return body.type === 1 ? { status: 200, contentType: 'application/json', body: '{"type":1}' } : undefined;
    },
    // Discord wants an interaction response within 3 s, not a 202: gatehouse defers it, and the
    // target answers later through Discord's follow-up webhook with the interaction's token.
    acceptedAnswer(body) {
      return { status: 200, contentType: 'application/json', body: JSON.stringify(deferredResponse(body.type)) };
    },
  };
}
