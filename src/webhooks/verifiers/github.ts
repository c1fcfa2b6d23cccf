import { createHash } from 'node:crypto';
import { digestEquals, fromHex, hmacSha256 } from './hmac.js';
import { headerValue, type WebhookVerifier } from './types.js';

/**
 * The `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(secret, body)>` scheme GitHub and Meta share;
 * any of `secrets` passes (rotation). Every secret is tried, so timing does not tell which matched.
 * It signs no timestamp, so a captured request verifies forever: its replay key is the SHA-256 of
 * the signature's bytes (decoded, so the same signature in other-case hex is the same key; hashed,
 * so the file never holds a signature anyone could send again).
 */
export function hubSignature(
  secrets: readonly string[],
): Pick<WebhookVerifier, 'checkHeaders' | 'verifyBody' | 'replayKey'> {
  return {
    checkHeaders(headers) {
      const signature = headerValue(headers, 'x-hub-signature-256');
      if (signature === undefined) return { ok: false, reason: 'no X-Hub-Signature-256' };
      if (!signature.startsWith('sha256=') || !fromHex(signature.slice(7), 32))
        return { ok: false, reason: 'malformed X-Hub-Signature-256' };
      return { ok: true };
    },
    verifyBody(headers, rawBody) {
      const presented = fromHex(headerValue(headers, 'x-hub-signature-256')!.slice(7), 32)!;
      const matches = secrets.map((secret) => digestEquals(presented, hmacSha256(secret, rawBody)));
      return matches.includes(true)
        ? { ok: true }
        : { ok: false, reason: 'X-Hub-Signature-256 does not match the body' };
    },
    replayKey(headers) {
      const signature = fromHex(headerValue(headers, 'x-hub-signature-256')!.slice(7), 32)!;
      return `sha256:${createHash('sha256').update(signature).digest('hex')}`;
    },
  };
}

/**
 * GitHub: `X-Hub-Signature-256` over the body with any of `secrets`; deduped on `X-GitHub-Delivery`
 * and on the signature (a replay under a new delivery id).
 * https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
 */
export function githubVerifier(config: { secrets: string[] }): WebhookVerifier {
  return {
    ...hubSignature(config.secrets),
    deliveryId: (headers) => headerValue(headers, 'x-github-delivery'),
  };
}
