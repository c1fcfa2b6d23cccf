import { z } from 'zod';
import { hookSecret, httpUrl } from './common.js';

const rotatingSecrets = {
  secret: hookSecret('secret')
    .optional()
    .describe(
      'The signing secret shared with the sender, 16 or more characters (`${VAR}` or `{ file }`). Give `secret` or `secrets`.',
    ),
  secrets: z
    .array(hookSecret('each secret'))
    .min(1)
    .optional()
    .describe(
      'Several signing secrets, any of which passes: old and new together while the sender rotates. Give `secret` or `secrets`.',
    ),
};
const tolerance = {
  toleranceSeconds: z
    .number()
    .int()
    .min(1)
    .max(3600)
    .default(300)
    .describe(
      'How many seconds the signed timestamp may differ from now; older or newer requests are refused (replays).',
    ),
};
const standardWebhooksSecret = z
  .string()
  .regex(/^(whsec_)?[A-Za-z0-9+/]{16,}={0,2}$/, 'a Standard Webhooks secret is "whsec_" + base64');

/** `verify` on an endpoint: how its sender proves a webhook is theirs (src/webhooks/verifiers/, one file a type). */
export const verifySchema = z.discriminatedUnion(
  'type',
  [
    z.strictObject({
      type: z
        .literal('secret')
        .describe('`"secret"`: `X-Webhook-Secret` must equal `secret` (the same as `secret` on the endpoint).'),
      secret: hookSecret('secret').describe(
        'The value `X-Webhook-Secret` must carry, 16 or more characters (`${VAR}` or `{ file }`).',
      ),
    }),
    z.strictObject({
      type: z
        .literal('github')
        .describe(
          '`"github"`: `X-Hub-Signature-256`, an HMAC-SHA256 of the body; deduplicated by `X-GitHub-Delivery`, and a replayed signature is a duplicate.',
        ),
      ...rotatingSecrets,
    }),
    z.strictObject({
      type: z
        .literal('stripe')
        .describe(
          '`"stripe"`: `Stripe-Signature` (`t=…,v1=…`), an HMAC-SHA256 of `t.body` signed within `toleranceSeconds`; deduplicated by the body\'s `id`.',
        ),
      ...rotatingSecrets,
      ...tolerance,
    }),
    z.strictObject({
      type: z
        .literal('slack')
        .describe(
          '`"slack"`: `X-Slack-Signature` (v0) and `X-Slack-Request-Timestamp` within `toleranceSeconds`; `url_verification` is answered, events deduplicated by `event_id`.',
        ),
      signingSecret: hookSecret('signingSecret').describe(
        "The Slack app's Signing Secret, 16 or more characters (`${VAR}` or `{ file }`).",
      ),
      ...tolerance,
    }),
    z.strictObject({
      type: z
        .literal('standard-webhooks')
        .describe(
          '`"standard-webhooks"` (Svix and others): `webhook-signature` over `id.timestamp.body`, `webhook-timestamp` within `toleranceSeconds`; deduplicated by `webhook-id`.',
        ),
      secret: standardWebhooksSecret
        .optional()
        .describe(
          'The signing secret, `whsec_` and base64 as the sender shows it (`${VAR}` or `{ file }`). Give `secret` or `secrets`.',
        ),
      secrets: z
        .array(standardWebhooksSecret)
        .min(1)
        .optional()
        .describe(
          'Several `whsec_` secrets, any of which passes: old and new together while the sender rotates. Give `secret` or `secrets`.',
        ),
      ...tolerance,
    }),
    z.strictObject({
      type: z
        .literal('telegram')
        .describe(
          '`"telegram"`: `X-Telegram-Bot-Api-Secret-Token` must equal `secretToken`; deduplicated by `update_id`.',
        ),
      secretToken: z
        .string()
        .regex(
          /^[A-Za-z0-9_-]{16,256}$/,
          'secretToken: 16-256 characters of A-Z a-z 0-9 _ - (Telegram allows only these)',
        )
        .describe("The `secret_token` given to Telegram's setWebhook: 16-256 characters of `A-Z a-z 0-9 _ -`."),
    }),
    z.strictObject({
      type: z
        .literal('discord')
        .describe(
          '`"discord"`: an Ed25519 `X-Signature-Ed25519` over `X-Signature-Timestamp` and the body; PING is answered, events deduplicated by their `id`.',
        ),
      publicKey: z
        .string()
        .regex(/^[0-9a-fA-F]{64}$/, 'publicKey must be the 32-byte Ed25519 key as 64 hex digits')
        .describe("The application's public key from the Discord Developer Portal, 64 hex digits."),
      ...tolerance,
    }),
    z.strictObject({
      type: z
        .literal('meta')
        .describe(
          '`"meta"` (WhatsApp, Messenger, Instagram): `X-Hub-Signature-256`, an HMAC-SHA256 of the body; the GET subscription check is answered. A replayed signature is a duplicate.',
        ),
      appSecret: hookSecret('appSecret').describe(
        "The Meta app's App Secret, 16 or more characters (`${VAR}` or `{ file }`).",
      ),
      verifyToken: z
        .string()
        .min(8, 'verifyToken must be at least 8 characters')
        .describe(
          "The Verify Token typed into Meta's webhook setup, 8 or more characters: the GET check must send it as `hub.verify_token`.",
        ),
    }),
    z.strictObject({
      type: z
        .literal('pubsub-oidc')
        .describe(
          '`"pubsub-oidc"`: a Google Pub/Sub push with an OIDC token in `Authorization: Bearer`; the payload delivered is the decoded message.',
        ),
      audience: z
        .string()
        .min(1)
        .describe(
          'The `aud` the push subscription puts in its tokens (set on the subscription; often the endpoint URL).',
        ),
      serviceAccountEmail: z
        .email()
        .describe(
          "The service account the push subscription signs its tokens as; the token's verified `email` must be it.",
        ),
      jwksUri: httpUrl('jwksUri')
        .default('https://www.googleapis.com/oauth2/v3/certs')
        .describe("The key set the tokens are checked against: Google's by default."),
    }),
  ],
  {
    error: (issue) =>
      issue.code === 'invalid_union'
        ? 'verify.type must be one of secret, github, stripe, slack, standard-webhooks, telegram, discord, meta, pubsub-oidc'
        : undefined,
  },
);

type RawVerify = z.output<typeof verifySchema>;
type WithSecrets<T> = Omit<T, 'secret' | 'secrets'> & { secrets: string[] };
/** The normalised `verify` every endpoint has after parsing (`secret` alone becomes `{ type: "secret" }`). */
export type VerifyConfig =
  | Exclude<RawVerify, { type: 'github' | 'stripe' | 'standard-webhooks' }>
  | WithSecrets<Extract<RawVerify, { type: 'github' }>>
  | WithSecrets<Extract<RawVerify, { type: 'stripe' }>>
  | WithSecrets<Extract<RawVerify, { type: 'standard-webhooks' }>>;

export function normalizeVerify(verify: RawVerify): VerifyConfig {
  if (verify.type === 'github' || verify.type === 'stripe' || verify.type === 'standard-webhooks') {
    const { secret, secrets, ...rest } = verify;
    return { ...rest, secrets: secrets ?? [secret!] } as VerifyConfig;
  }
  return verify;
}
