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
  return warnings;
}
