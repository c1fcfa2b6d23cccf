import { digestEquals, fromHex, hmacSha256 } from './hmac.js';
import { headerValue, saneId, withinTolerance, type WebhookVerifier } from './types.js';

/**
 * Slack: `X-Slack-Signature: v0=<hex HMAC-SHA256(signingSecret, "v0:ts:body")>` with
 * `X-Slack-Request-Timestamp` within 5 minutes. Answers the `url_verification` challenge.
 * https://api.slack.com/authentication/verifying-requests-from-slack
 */
export function slackVerifier(config: { signingSecret: string; toleranceSeconds: number }): WebhookVerifier {
  return {
    checkHeaders(headers, now) {
      const signature = headerValue(headers, 'x-slack-signature');
      if (signature === undefined) return { ok: false, reason: 'no X-Slack-Signature' };
      if (!signature.startsWith('v0=') || !fromHex(signature.slice(3), 32))
        return { ok: false, reason: 'malformed X-Slack-Signature' };
      return withinTolerance(headerValue(headers, 'x-slack-request-timestamp'), now, config.toleranceSeconds);
    },
    verifyBody(headers, rawBody) {
      const presented = fromHex(headerValue(headers, 'x-slack-signature')!.slice(3), 32)!;
      const expected = hmacSha256(
        config.signingSecret,
        `v0:${headerValue(headers, 'x-slack-request-timestamp')}:`,
        rawBody,
      );
      return digestEquals(presented, expected)
        ? { ok: true }
        : { ok: false, reason: 'X-Slack-Signature does not match the body' };
    },
    deliveryId: (_headers, body) => saneId(body.event_id),
    handshake(body) {
      if (body.type !== 'url_verification' || typeof body.challenge !== 'string') return undefined;
      return {
        status: 200,
        contentType: 'application/json; charset=utf-8',
        body: JSON.stringify({ challenge: body.challenge }),
      };
    },
  };
}
