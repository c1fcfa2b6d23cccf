import path from 'node:path';
import { Option, type Command } from 'commander';
import { environmentWithFiles } from '../config/env-file.js';
import { configJsonSchema } from '../config/json-schema.js';
import {
  DEFAULT_CONFIG_FILE as FALLBACK_CONFIG_FILE,
  loadConfig,
  loadStorageConfig,
  resolveConfigFile,
} from '../config/load.js';
import type { Config } from '../config/schema.js';
import { configWarnings } from '../config/warnings.js';
import { ConfigError, UsageError } from '../errors.js';
import { needsSecretKey, secretKeysFromEnv } from '../storage/secrets.js';
import { REDACTED, redactUrlCredentials } from '../config/redact.js';

/** Every command's `--config` default: GATEHOUSE_CONFIG when set, else ./gateway.json5. */
export const DEFAULT_CONFIG_FILE = resolveConfigFile(undefined);

/** `-c, --config <file>`, whose help names GATEHOUSE_CONFIG (the default shown is where it comes from, not its value). */
export function configFileOption(): Option {
  return new Option('-c, --config <file>', 'config file').default(
    DEFAULT_CONFIG_FILE,
    `$GATEHOUSE_CONFIG, else ./${FALLBACK_CONFIG_FILE}`,
  );
}

/** `--env-file <file>` (repeatable): NAME=value variables for `${VAR}`, over the process environment (src/config/env-file.ts). */
export function envFileOption(when = ''): Option {
  return new Option(
    '--env-file <file>',
    `NAME=value variables for \${VAR}, over the process environment${when} (repeatable: a later file wins)`,
  )
    .argParser((file: string, files: string[]) => [...files, file])
    .default([], 'none');
}

/** `-c, --config` and `--env-file`, as a storage command's options hold them. */
export interface StorageOptions {
  config: string;
  envFile: string[];
}

/** The `storage` section for commands that only open storage, `${VAR}` taken from `--env-file` files too. */
export function storageConfigOf(options: StorageOptions): Config['storage'] {
  return loadStorageConfig(options.config, environmentWithFiles(options.envFile));
}

/**
 * `gatehouse config check|print|schema`. check: exit 0 with a one-line summary (warnings on
 * stderr), or 1 with every problem; `--json` prints `{ ok, file, problems, warnings }` either way.
 */
export function registerConfigCommands(program: Command): void {
  const group = program.command('config').description('work with the configuration file');
  group
    .command('check')
    .description('validate a config file and print a summary (one line per part)')
    .addOption(configFileOption())
    .addOption(envFileOption())
    .option('--json', 'problems and warnings as one JSON object')
    .action((options: { config: string; envFile: string[]; json?: boolean }) => {
      // An env file's problem is one line (exit 1), with --json too: it is not a problem of the config.
      const env = environmentWithFiles(options.envFile);
      if (options.json) {
        const file = path.resolve(options.config);
        try {
          const { config } = loadConfig(options.config, env);
          checkSecretKey(config, env);
          process.stdout.write(
            JSON.stringify({ ok: true, file, problems: [], warnings: configWarnings(config).map(asProblem) }) + '\n',
          );
        } catch (err) {
          if (!(err instanceof ConfigError) && !(err instanceof UsageError)) throw err;
          const problems =
            err instanceof ConfigError
              ? err.problems.map(asProblem)
              : [{ path: '(environment)', message: err.message }];
          process.stdout.write(JSON.stringify({ ok: false, file, problems, warnings: [] }) + '\n');
          process.exitCode = 1;
        }
        return;
      }
      const { config, file } = loadConfig(options.config, env);
      checkSecretKey(config, env);
      for (const warning of configWarnings(config)) process.stderr.write(`warning: ${warning}\n`);
      process.stdout.write(`ok: ${file}: ${summarizeConfig(config)}\n`);
      for (const line of summarizeSections(config)) process.stdout.write(`  ${line}\n`);
    });
  group
    .command('print')
    .description('print the effective config (defaults filled in, references expanded) as JSON, secrets redacted')
    .addOption(configFileOption())
    .addOption(envFileOption())
    .action((options: { config: string; envFile: string[] }) => {
      const { config } = loadConfig(options.config, environmentWithFiles(options.envFile));
      process.stdout.write(JSON.stringify(redactSecrets(config), null, 2) + '\n');
    });
  group
    .command('schema')
    .description('print the JSON Schema of the config file (for editors: "$schema" in gateway.json5)')
    .action(() => {
      process.stdout.write(JSON.stringify(configJsonSchema(), null, 2) + '\n');
    });
}

/** What `start` would refuse for the environment: Gmail or channels without a usable GATEHOUSE_SECRET_KEY. */
function checkSecretKey(config: Config, env: NodeJS.ProcessEnv): void {
  if (needsSecretKey(config)) secretKeysFromEnv(env);
}

/** `path: reason` as data. */
function asProblem(line: string): { path: string; message: string } {
  const at = line.indexOf(': ');
  return at === -1 ? { path: '(root)', message: line } : { path: line.slice(0, at), message: line.slice(at + 2) };
}

/** Key names that hold a credential, wherever they appear (`apiKey`, `secrets`, `botToken`, `password`, …). */
const SECRET_KEY = /secret|token|password|passphrase|api_?key$|private_?key/i;

/**
 * A copy of the config with every credential replaced: values under secret-looking keys, every
 * value of a `headers` map, and the password of any URL (a postgres:// URL carries one). Works from the names, so sections
 * added later are covered without a list to keep up to date.
 */
export function redactSecrets(value: unknown, key = '', inHeaders = false): unknown {
  if (typeof value === 'string') {
    // Every value of a `headers` map (observability.tracing.headers): `authorization`, `x-honeycomb-team`…
    if (inHeaders || SECRET_KEY.test(key)) return REDACTED;
    return /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(value) ? redactUrlCredentials(value) : value;
  }
  if (Array.isArray(value)) return value.map((item) => redactSecrets(item, key));
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, redactSecrets(v, k, key === 'headers')]));
  }
  return value;
}

/** At most this many items named on a summary line; the rest are counted. */
const NAMED_ON_A_LINE = 4;

/** `a, b, c, d and 3 more` */
function someOf(items: readonly string[]): string {
  const named = items.slice(0, NAMED_ON_A_LINE).join(', ');
  return items.length > NAMED_ON_A_LINE ? `${named} and ${items.length - NAMED_ON_A_LINE} more` : named;
}

/** 60 → `1m`: a rate limit's period as it is written. */
function period(seconds: number): string {
  for (const [unit, size] of [
    ['d', 86_400],
    ['h', 3600],
    ['m', 60],
  ] as const)
    if (seconds % size === 0) return `${seconds / size}${unit}`;
  return `${seconds}s`;
}

/**
 * `config check`'s lines after the first: routes, rules, rate limits, CORS and admin, one line
 * each. Never a secret: counts, prefixes, origins, addresses, and whether a token is set.
 */
export function summarizeSections(config: Config): string[] {
  const { gateway, admin } = config;
  const { auth } = gateway;
  const routes = gateway.routes.map(
    (r) =>
      `${r.prefix} -> ${redactUrlCredentials(r.upstream.target)}${r.stripPrefix ? ` (strip ${r.stripPrefix})` : ''}`,
  );
  const scoped = auth.rules.filter((r) => r.scopes).length;
  const claimed = auth.rules.filter((r) => r.claims).length;
  const limits = gateway.rateLimits.map(
    (l) =>
      `${l.requests}/${period(l.per)} by ${l.by}${l.burst ? ` burst ${l.burst}` : ''}${l.paths || l.methods ? ' (some requests)' : ''}`,
  );
  const ownLimits = auth.apiKeys.filter((k) => k.rateLimit).length;
  const routeCors = gateway.routes.filter((r) => r.cors !== undefined).length;
  const cors = gateway.cors
    ? `${someOf(gateway.cors.origins)}, credentials ${gateway.cors.credentials ? 'on' : 'off'}`
    : 'off';
  return [
    `routes: ${routes.length ? someOf(routes) : 'none'}`,
    `rules: ${auth.rules.length ? `${auth.rules.length} (${scoped} with scopes, ${claimed} with claims)` : 'none'}; a request no rule matches is ${auth.defaultAllow ? 'allowed' : 'refused'}`,
    `rate limits: ${limits.length ? someOf(limits) : 'none'}${ownLimits ? `; ${ownLimits} API key(s) with their own` : ''}`,
    `cors: ${cors}${routeCors ? `; ${routeCors} route(s) with their own` : ''}`,
    `admin: ${admin ? `${admin.listen.host}:${admin.listen.port}, /metrics ${admin.token !== undefined ? 'behind a token' : 'open (no token)'}` : 'off'}`,
  ];
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
  return `gateway ${gateway.listen.host}:${gateway.listen.port} -> ${redactUrlCredentials(gateway.upstream.target)}, ${authText}, ${ips}; ${hooks}`;
}
