import { createRemoteJWKSet, errors, jwtVerify } from 'jose';
import { isKeySetOutage } from '../../gateway/credentials/jwt.js';
import { jsonNestsDeeperThan } from '../json-depth.js';
import { dig, headerValue, saneId, type WebhookVerifier } from './types.js';

const GOOGLE_ISSUERS = ['https://accounts.google.com', 'accounts.google.com'];

/**
 * Google Pub/Sub push with OIDC: `Authorization: Bearer <Google-signed JWT>` verified with jose
 * against Google's JWKS: iss Google, aud = `audience`, `email` = the push service account,
 * `email_verified` true, not expired. https://cloud.google.com/pubsub/docs/authenticate-push-subscriptions
 */
export function pubsubOidcVerifier(config: {
  audience: string;
  serviceAccountEmail: string;
  jwksUri: string;
}): WebhookVerifier {
  const jwks = createRemoteJWKSet(new URL(config.jwksUri), {
    cooldownDuration: 30_000,
    cacheMaxAge: 600_000,
    timeoutDuration: 5_000,
  });
  return {
    async checkHeaders(headers) {
      const match = /^bearer +([A-Za-z0-9\-._~+/]+=*) *$/i.exec(headerValue(headers, 'authorization') ?? '');
      if (!match) return { ok: false, reason: 'no bearer token' };
      try {
        const { payload } = await jwtVerify(match[1]!, jwks, {
          issuer: GOOGLE_ISSUERS,
          audience: config.audience,
          algorithms: ['RS256'],
          requiredClaims: ['exp'],
        });
        if (payload.email !== config.serviceAccountEmail)
          return { ok: false, reason: 'token email is not the push service account' };
        if (payload.email_verified !== true) return { ok: false, reason: 'token email is not verified' };
        return { ok: true };
      } catch (err) {
        const reason =
          err instanceof errors.JOSEError
            ? `${err.code}: ${err.message}`
            : `key set unreachable: ${(err as Error).message}`;
        return { ok: false, reason, unavailable: isKeySetOutage(err) };
      }
    },
    deliveryId: (_headers, body) => saneId(dig(body, 'message', 'messageId') ?? dig(body, 'message', 'message_id')),
    payload(body, limits) {
      const message = (dig(body, 'message') ?? {}) as Record<string, unknown>;
      const text = typeof message.data === 'string' ? Buffer.from(message.data, 'base64').toString('utf8') : undefined;
      let data: unknown = text;
      // Nested deeper than the body may be: kept as text (the sender is not at fault, and a 4xx
      // would only make Pub/Sub retry it).
      if (text !== undefined && !jsonNestsDeeperThan(text, limits.maxJsonDepth)) {
        try {
          data = JSON.parse(text);
        } catch {
          // not JSON: the decoded text as it is
        }
      }
      return {
        data,
        attributes: message.attributes ?? {},
        messageId: message.messageId ?? message.message_id,
        publishTime: message.publishTime ?? message.publish_time,
        subscription: body.subscription,
      };
    },
  };
}
