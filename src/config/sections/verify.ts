import { z } from 'zod';
import { hookSecret, httpUrl } from './common.js';

const rotatingSecrets = {
  secret: hookSecret('secret').optional(),
  /** Several secrets at once: old and new both pass while a sender rotates. */
  secrets: z.array(hookSecret('each secret')).min(1).optional(),
};
const tolerance = { toleranceSeconds: z.number().int().min(1).max(3600).default(300) };

/** `verify` on an endpoint: how its sender proves a webhook is theirs (see src/webhooks/verifiers/). */
export const verifySchema = z.discriminatedUnion('type', [
  z.strictObject({ type: z.literal('secret'), secret: hookSecret('secret') }),
  z.strictObject({ type: z.literal('github'), ...rotatingSecrets }),
  z.strictObject({ type: z.literal('stripe'), ...rotatingSecrets, ...tolerance }),
  z.strictObject({ type: z.literal('slack'), signingSecret: hookSecret('signingSecret'), ...tolerance }),
  z.strictObject({
    type: z.literal('standard-webhooks'),
    secret: z.string().regex(/^(whsec_)?[A-Za-z0-9+/]{16,}={0,2}$/, 'a Standard Webhooks secret is "whsec_" + base64').optional(),
    secrets: z.array(z.string().regex(/^(whsec_)?[A-Za-z0-9+/]{16,}={0,2}$/, 'a Standard Webhooks secret is "whsec_" + base64')).min(1).optional(),
    ...tolerance,
  }),
  z.strictObject({ type: z.literal('telegram'), secretToken: z.string().regex(/^[A-Za-z0-9_-]{16,256}$/, 'secretToken: 16-256 characters of A-Z a-z 0-9 _ - (Telegram allows only these)') }),
  z.strictObject({ type: z.literal('discord'), publicKey: z.string().regex(/^[0-9a-fA-F]{64}$/, 'publicKey must be the 32-byte Ed25519 key as 64 hex digits'), ...tolerance }),
  z.strictObject({ type: z.literal('meta'), appSecret: hookSecret('appSecret'), verifyToken: z.string().min(8, 'verifyToken must be at least 8 characters') }),
  z.strictObject({
    type: z.literal('pubsub-oidc'),
    audience: z.string().min(1),
    serviceAccountEmail: z.email(),
    jwksUri: httpUrl('jwksUri').default('https://www.googleapis.com/oauth2/v3/certs'),
  }),
], { error: (issue) => (issue.code === 'invalid_union' ? 'verify.type must be one of secret, github, stripe, slack, standard-webhooks, telegram, discord, meta, pubsub-oidc' : undefined) });

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
