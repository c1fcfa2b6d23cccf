import type { Command } from 'commander';
import { loadConfig } from '../config/load.js';
import type { Config } from '../config/schema.js';
import { configWarnings } from '../config/warnings.js';

export const DEFAULT_CONFIG_FILE = 'gateway.json5';

/** `gatehouse config check --config F`: exit 0 with a one-line summary, or 1 with every problem. */
export function registerConfigCommands(program: Command): void {
  program
    .command('config')
    .description('work with the configuration file')
    .command('check')
    .description('validate a config file and print a one-line summary')
    .option('-c, --config <file>', 'config file', DEFAULT_CONFIG_FILE)
    .action((options: { config: string }) => {
      const { config, file } = loadConfig(options.config);
      for (const warning of configWarnings(config)) process.stderr.write(`warning: ${warning}\n`);
      process.stdout.write(`ok: ${file}: ${summarizeConfig(config)}\n`);
    });
}

export function summarizeConfig(config: Config): string {
  const { gateway, webhooks } = config;
  const { auth } = gateway;
  const keys = auth.apiKeys.length + (auth.apiKey !== undefined ? 1 : 0);
  const methods = [
    keys > 0 ? `api-key (${keys})` : undefined,
    auth.bearer ? `bearer jwt (${auth.bearer.jwt.jwksUri ? 'jwks' : auth.bearer.jwt.secret ? 'secret' : 'public key'})` : undefined,
  ].filter(Boolean);
  const authText = auth.enabled ? `auth ${methods.join(' + ') || 'none configured'}, require ${auth.require}` : 'auth disabled';
  const ips = auth.allowedIPs ? `${auth.allowedIPs.length} allowed IP range(s)` : 'any IP';
  const hooks = webhooks.enabled ? `webhooks on ${webhooks.listen.host}:${webhooks.listen.port} (${webhooks.endpoints.length} endpoint(s))` : 'webhooks off';
  return `gateway ${gateway.listen.host}:${gateway.listen.port} -> ${gateway.upstream.target}, ${authText}, ${ips}; ${hooks}`;
}
