import { createHmac } from 'node:crypto';
import { standardWebhooksKey } from '../verifiers/standard-webhooks.js';

/**
 * Standard Webhooks signature (https://www.standardwebhooks.com): `v1,<base64 HMAC-SHA256 of id.timestamp.body>`.
 * A `whsec_<base64>` secret is used as the key bytes it encodes; any other secret as its UTF-8 bytes.
 */
export function signStandardWebhook(secret: string, id: string, timestampSeconds: number, body: string): string {
  return signWithKey(signingKey(secret), id, timestampSeconds, body);
}

/** The HMAC key a target's secret stands for (see signStandardWebhook). */
export function signingKey(secret: string): Buffer {
  return secret.startsWith('whsec_') ? standardWebhooksKey(secret) : Buffer.from(secret, 'utf8');
}

/** signStandardWebhook with the key already worked out (once per target, not per attempt). */
export function signWithKey(key: Buffer, id: string, timestampSeconds: number, body: string): string {
  return 'v1,' + createHmac('sha256', key).update(`${id}.${timestampSeconds}.${body}`).digest('base64');
}
