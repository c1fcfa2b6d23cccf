import type { VerifyConfig } from '../../config/schema.js';
import { discordVerifier } from './discord.js';
import { githubVerifier } from './github.js';
import { metaVerifier } from './meta.js';
import { pubsubOidcVerifier } from './pubsub-oidc.js';
import { secretVerifier } from './secret.js';
import { slackVerifier } from './slack.js';
import { standardWebhooksVerifier } from './standard-webhooks.js';
import { stripeVerifier } from './stripe.js';
import { telegramVerifier } from './telegram.js';
import type { WebhookVerifier } from './types.js';

export type { DirectAnswer, Verdict, WebhookVerifier } from './types.js';

/**
 * The verifier registry: `verify.type` → how that sender is proven. A new sender is one file
 * and one line here (plus its schema entry in config/schema.ts).
 */
const registry: { [T in VerifyConfig['type']]: (config: Extract<VerifyConfig, { type: T }>) => WebhookVerifier } = {
  secret: secretVerifier,
  github: githubVerifier,
  stripe: stripeVerifier,
  slack: slackVerifier,
  'standard-webhooks': standardWebhooksVerifier,
  telegram: telegramVerifier,
  discord: discordVerifier,
  meta: metaVerifier,
  'pubsub-oidc': pubsubOidcVerifier,
};

export function createVerifier(config: VerifyConfig): WebhookVerifier {
  return (registry[config.type] as (c: VerifyConfig) => WebhookVerifier)(config);
}
