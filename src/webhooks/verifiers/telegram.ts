import { headerSecret } from './secret.js';
import { saneId, type WebhookVerifier } from './types.js';

/**
 * Telegram: `X-Telegram-Bot-Api-Secret-Token` equals the `secret_token` given to setWebhook.
 * https://core.telegram.org/bots/api#setwebhook
 */
export function telegramVerifier(config: { secretToken: string }): WebhookVerifier {
  return {
    checkHeaders: headerSecret('x-telegram-bot-api-secret-token', config.secretToken),
    deliveryId: (_headers, body) => saneId(body.update_id),
  };
}
