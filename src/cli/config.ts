import path from 'node:path';
import type { Command } from 'commander';
import { configJsonSchema } from '../config/json-schema.js';
import { loadConfig, resolveConfigFile } from '../config/load.js';
import type { Config } from '../config/schema.js';
import { configWarnings } from '../config/warnings.js';
import { ConfigError } from '../errors.js';
import { REDACTED, redactUrlCredentials } from '../config/redact.js';

/** Every command's `--config` default: GATEHOUSE_CONFIG when set, else ./gateway.json5. */
export const DEFAULT_CONFIG_FILE = resolveConfigFile(undefined);

/**
 * `gatehouse config check|print|schema`. check: exit 0 with a one-line summary (warnings on
 * stderr), or 1 with every problem; `--json` prints `{ ok, file, problems, warnings }` either way.
 */
export function registerConfigCommands(program: Command): void {
  const group = program.command('config').description('work with the configuration file');
  group
    .command('check')
    .description('validate a config file and print a one-line summary')
    .option('-c, --config <file>', 'config file', DEFAULT_CONFIG_FILE)
    .option('--json', 'problems and warnings as one JSON object')
    .action((options: { config: string; json?: boolean }) => {
      if (options.json) {
        const file = path.resolve(options.config);
        try {
          const { config } = loadConfig(options.config);
          process.stdout.write(
            JSON.stringify({ ok: true, file, problems: [], warnings: configWarnings(config).map(asProblem) }) + '\n',
          );
        } catch (err) {
          if (!(err instanceof ConfigError)) throw err;
          process.stdout.write(
            JSON.stringify({ ok: false, file, problems: err.problems.map(asProblem), warnings: [] }) + '\n',
          );
          process.exitCode = 1;
        }
        return;
      }
      const { config, file } = loadConfig(options.config);
      for (const warning of configWarnings(config)) process.stderr.write(`warning: ${warning}\n`);
      process.stdout.write(`ok: ${file}: ${summarizeConfig(config)}\n`);
    });
  group
    .command('print')
    .description('print the effective config (defaults filled in, references expanded) as JSON, secrets redacted')
    .option('-c, --config <file>', 'config file', DEFAULT_CONFIG_FILE)
    .action((options: { config: string }) => {
      const { config } = loadConfig(options.config);
      process.stdout.write(JSON.stringify(redactSecrets(config), null, 2) + '\n');
    });
  group
    .command('schema')
    .description('print the JSON Schema of the config file (for editors: "$schema" in gateway.json5)')
    .action(() => {
      process.stdout.write(JSON.stringify(configJsonSchema(), null, 2) + '\n');
    });
}

/** `path: reason` as data. */
function asProblem(line: string): { path: string; message: string } {
  const at = line.indexOf(': ');
  return at === -1 ? { path: '(root)', message: line } : { path: line.slice(0, at), message: line.slice(at + 2) };
}

/** Key names that hold a credential, wherever they appear (`apiKey`, `secrets`, `botToken`, `password`, …). */
const SECRET_KEY = /secret|token|password|passphrase|api_?key$|private_?key/i;

/**
 * A copy of the config with every credential replaced: values under secret-looking keys, and
 * the password of any URL (a postgres:// URL carries one). Works from the names, so sections
 * added later are covered without a list to keep up to date.
 */
export function redactSecrets(value: unknown, key = ''): unknown {
  if (typeof value === 'string') {
    if (SECRET_KEY.test(key)) return REDACTED;
    return /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(value) ? redactUrlCredentials(value) : value;
  }
  if (Array.isArray(value)) return value.map((item) => redactSecrets(item, key));
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, redactSecrets(v, k)]));
  }
  return value;
}

export function summarizeConfig(config: Config): string {
  const { gateway, webhooks } = config;
  const { auth } = gateway;
  const keys = auth.apiKeys.length + (auth.apiKey !== undefined ? 1 : 0);
  const methods = [
    keys > 0 ? `api-key (${keys})` : undefined,
    auth.bearer
      ? `bearer jwt (${auth.bearer.jwt.jwksUri ? 'jwks' : auth.bearer.jwt.secret ? 'secret' : 'public key'})`
      : undefined,
  ].filter(Boolean);
  const authText = auth.enabled
    ? `auth ${methods.join(' + ') || 'none configured'}, require ${auth.require}`
    : 'auth disabled';
  const ips = auth.allowedIPs ? `${auth.allowedIPs.length} allowed IP range(s)` : 'any IP';
  const hooks = webhooks.enabled
    ? `webhooks on ${webhooks.listen.host}:${webhooks.listen.port} (${webhooks.endpoints.length} endpoint(s))`
    : 'webhooks off';
  return `gateway ${gateway.listen.host}:${gateway.listen.port} -> ${gateway.upstream.target}, ${authText}, ${ips}; ${hooks}`;
}
