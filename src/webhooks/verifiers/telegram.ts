import { secretEquals, sha256 } from './hmac.js';
import { headerValue, saneId, type WebhookVerifier } from './types.js';

/**
 * Telegram: `X-Telegram-Bot-Api-Secret-Token` equals the `secret_token` given to setWebhook.
 * https://core.telegram.org/bots/api#setwebhook
 */
export function telegramVerifier(config: { secretToken: string }): WebhookVerifier {
  const expected = sha256(config.secretToken);
  return {
    checkHeaders(headers) {
      const presented = headerValue(headers, 'x-telegram-bot-api-secret-token');
      if (secretEquals(presented, expected)) return { ok: true };
      return { ok: false, reason: presented === undefined ? 'no X-Telegram-Bot-Api-Secret-Token' : 'wrong X-Telegram-Bot-Api-Secret-Token' };
    },
    deliveryId: (_headers, body) => saneId(body.update_id),
  };
}
