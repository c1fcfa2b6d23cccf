import type { Config } from './schema.js';

/**
 * Likely mistakes in a valid config: `config check` prints them and the server logs them at
 * start (and after a reload); neither refuses to run. One line each, `path: what and why`.
 */
export function configWarnings(config: Config): string[] {
  const warnings: string[] = [];
  const jwt = config.gateway.auth.bearer?.jwt;
  // An identity provider signs tokens for every client it serves with the same keys: without an
  // audience, a token issued to any other application of that provider is accepted here.
  if (jwt?.jwksUri !== undefined && jwt.audience === undefined) {
    warnings.push('gateway.auth.bearer.jwt.audience: not set, so tokens the identity provider issued for any other client or API are accepted; set it to this API\'s audience');
  }
  // Rules and limits that can never apply as written (issue 16): valid, but surely not what was meant.
  const { auth, rateLimits } = config.gateway;
  auth.rules.forEach((rule, i) => {
    if (rule.claims !== undefined && Object.keys(rule.claims).length > 0 && auth.bearer === undefined) {
      warnings.push(`gateway.auth.rules[${i}].claims: no bearer JWT is configured, so no request has claims and this rule refuses every request it matches`);
    }
  });
  const hasKeys = auth.apiKey !== undefined || auth.apiKeys.length > 0;
  rateLimits.forEach((limit, i) => {
    if (limit.by === 'key' && !hasKeys) warnings.push(`gateway.rateLimits[${i}]: by "key" with no API key configured limits nothing`);
  });
  return warnings;
}
