import { createPrivateKey, X509Certificate, type KeyObject } from 'node:crypto';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { createSecureContext } from 'node:tls';
import JSON5 from 'json5';
import type { z } from 'zod';
import { ConfigError } from '../errors.js';
import { splitCrls } from '../http/tls.js';
import { formatIssues, formatPath, getAt } from './problems.js';

export { formatPath };
import { configSchema, type Config } from './schema.js';

/** Keys whose value may be `{ file: "path" }`: the secret is read from that file (trailing newline dropped). */
export const FILE_REFERENCE_KEYS = new Set([
  'secret',
  'apiKey',
  'publicKey',
  'signingSecret',
  'secretToken',
  'appSecret',
  'verifyToken',
  'botToken',
  'clientSecret',
  'token',
]);
/** `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?message}`, `${VAR?message}` (POSIX sh, docker compose). */
const ENV_REFERENCE = /\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?)([-?])([^}]*))?\}/g;
const WHOLE_ENV_REFERENCE = new RegExp(`^${ENV_REFERENCE.source}$`);
/** Where the config file is looked for when `--config` is absent and GATEHOUSE_CONFIG is unset. */
export const DEFAULT_CONFIG_FILE = 'gateway.json5';

/** The config file a command uses: `--config`, else GATEHOUSE_CONFIG, else ./gateway.json5. */
export function resolveConfigFile(option: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  return option ?? (env.GATEHOUSE_CONFIG || DEFAULT_CONFIG_FILE);
}

interface ExpandContext {
  env: NodeJS.ProcessEnv;
  baseDir: string;
  problems: string[];
  /**
   * Paths (JSON) whose whole value was one `${VAR}`, and VAR: a schema expecting a number or
   * boolean there gets one, and a problem with the value names the variable.
   */
  wholeReferences: Map<string, string>;
}

export interface LoadedConfig {
  config: Config;
  /** Absolute path of the file it came from. */
  file: string;
}

/**
 * Reads, expands and validates a config file: JSON5 → `${VAR}` from the environment →
 * `{ file }` secrets → schema → relative paths resolved against the file's folder → deep-frozen.
 * Throws ConfigError listing every problem as `path: reason`.
 */
export function loadConfig(file: string, env: NodeJS.ProcessEnv = process.env): LoadedConfig {
  const absolute = path.resolve(file);
  const raw = readConfigFile(file, absolute);
  return { config: parseConfig(raw, { env, baseDir: path.dirname(absolute) }), file: absolute };
}

function readConfigFile(file: string, absolute: string): unknown {
  let text: string;
  try {
    text = readFileSync(absolute, 'utf8');
  } catch (err) {
    throw new ConfigError([
      `${absolute}: cannot read config file: it ${describeFileError(err)} (name another with --config <file> or GATEHOUSE_CONFIG)`,
    ]);
  }
  try {
    // Plain JSON first: JSON5.parse is ~40x slower and allocates far more (100,000 API keys:
    // 2.3 s and 180 MB against 0.1 s), and a generated key list is usually plain JSON.
    return parseJsonFast(text) ?? JSON5.parse(text);
  } catch (err) {
    throw new ConfigError([`${file}: invalid JSON5: ${(err as Error).message}`]);
  }
}

/** JSON.parse when the text is plain JSON (same result as JSON5 then); undefined otherwise. */
function parseJsonFast(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** Per validated config: the environment variable each value written as one whole `${VAR}` came from, by path. */
const variablesBehind = new WeakMap<Config, Map<string, string>>();

/** The environment variable a value of `config` came from (`gateway.listen.port` → `GATEHOUSE_PORT`), when it was written as one whole `${VAR}`. */
export function environmentVariableBehind(config: Config, at: string): string | undefined {
  return variablesBehind.get(config)?.get(at);
}

/** Validates an already-parsed config object (used by loadConfig and by tests). */
export function parseConfig(raw: unknown, options: { env?: NodeJS.ProcessEnv; baseDir?: string } = {}): Config {
  const wholeReferences = new Map<string, string>();
  const config = validate(configSchema, raw, { ...options, wholeReferences });
  if (config.storage.driver === 'sqlite')
    config.storage.path = path.resolve(options.baseDir ?? process.cwd(), config.storage.path);
  if (config.gateway.tls) {
    const tls = config.gateway.tls;
    const resolve = (file: string) => path.resolve(options.baseDir ?? process.cwd(), file);
    tls.cert = resolve(tls.cert);
    tls.key = resolve(tls.key);
    if (tls.clientCertificates) {
      tls.clientCertificates.ca = resolve(tls.clientCertificates.ca);
      if (tls.clientCertificates.crl !== undefined) tls.clientCertificates.crl = resolve(tls.clientCertificates.crl);
    }
    const problems = [...tlsProblems(tls), ...clientCertificateProblems(tls.clientCertificates)];
    if (problems.length > 0) throw new ConfigError(problems);
  }
  const frozen = deepFreeze(config);
  variablesBehind.set(
    frozen,
    new Map(
      [...wholeReferences].map(([at, variable]) => [formatPath(JSON.parse(at) as (string | number)[]), variable]),
    ),
  );
  return frozen;
}

/**
 * The gateway's certificate and key, read and checked as `config check` runs (found by a
 * newcomer: a missing file passed the check, then `start` failed with a stack): each readable,
 * PEM, and the key the certificate's.
 */
function tlsProblems(tls: { cert: string; key: string }): string[] {
  const problems: string[] = [];
  const read = (file: string, at: string): Buffer | undefined => {
    try {
      return readFileSync(file);
    } catch (err) {
      problems.push(`${at}: ${file} ${describeFileError(err)}`);
      return undefined;
    }
  };
  const certPem = read(tls.cert, 'gateway.tls.cert');
  const keyPem = read(tls.key, 'gateway.tls.key');
  let cert: X509Certificate | undefined;
  let key: KeyObject | undefined;
  try {
    if (certPem) cert = new X509Certificate(certPem);
  } catch (err) {
    problems.push(`gateway.tls.cert: ${tls.cert} is not a PEM certificate (${(err as Error).message})`);
  }
  try {
    if (keyPem) key = createPrivateKey(keyPem);
  } catch (err) {
    problems.push(`gateway.tls.key: ${tls.key} is not an unencrypted PEM private key (${(err as Error).message})`);
  }
  if (cert && key && !cert.checkPrivateKey(key))
    problems.push(`gateway.tls.key: ${tls.key} is not the private key of the certificate in ${tls.cert}`);
  return problems;
}

/**
 * The client-certificate CA and CRL, read and checked as `config check` runs: each readable, the CA
 * file PEM certificates only, the CRL file PEM CRLs only, and both loadable by OpenSSL together.
 */
function clientCertificateProblems(settings: { ca: string; crl?: string } | undefined): string[] {
  if (!settings) return [];
  const at = 'gateway.tls.clientCertificates';
  const problems: string[] = [];
  const read = (file: string, key: string): string | undefined => {
    try {
      return readFileSync(file, 'utf8');
    } catch (err) {
      problems.push(`${at}.${key}: ${file} ${describeFileError(err)}`);
      return undefined;
    }
  };
  const caPem = read(settings.ca, 'ca');
  const crlPem = settings.crl === undefined ? undefined : read(settings.crl, 'crl');
  const caBlocks = caPem?.match(/-----BEGIN [A-Z0-9 ]+-----[\s\S]+?-----END [A-Z0-9 ]+-----/g) ?? [];
  if (caPem !== undefined) {
    if (caBlocks.length === 0) problems.push(`${at}.ca: ${settings.ca} holds no PEM certificate`);
    for (const block of caBlocks) {
      try {
        if (!block.startsWith('-----BEGIN CERTIFICATE-----'))
          throw new Error(block.slice(0, block.indexOf('\n')).trim());
        new X509Certificate(block);
      } catch (err) {
        problems.push(
          `${at}.ca: ${settings.ca} holds something that is not a PEM certificate (${(err as Error).message})`,
        );
        break;
      }
    }
  }
  const crls = crlPem === undefined ? [] : splitCrls(crlPem);
  if (crlPem !== undefined && crls.length === 0) problems.push(`${at}.crl: ${settings.crl} holds no PEM CRL`);
  if (problems.length === 0) {
    try {
      createSecureContext({ ca: caPem, crl: crls.length > 0 ? crls : undefined });
    } catch (err) {
      problems.push(
        `${at}${crls.length > 0 ? '.crl' : '.ca'}: ${crls.length > 0 ? settings.crl : settings.ca} does not load (${(err as Error).message})`,
      );
    }
  }
  return problems;
}

/**
 * Only the `storage` section of a config file, expanded and validated (what the read-only CLI
 * commands need): other sections' variables and secret files need not be present.
 */
export function loadStorageConfig(file: string, env: NodeJS.ProcessEnv = process.env): Config['storage'] {
  const absolute = path.resolve(file);
  const raw = readConfigFile(file, absolute);
  // What config check says of such a file: a command that reads only `storage` must not use defaults instead (found by an outside attack).
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw))
    throw new ConfigError([
      `(root): Invalid input: expected object, received ${raw === null ? 'null' : Array.isArray(raw) ? 'array' : typeof raw}`,
    ]);
  const section = (raw as Record<string, unknown>).storage;
  const baseDir = path.dirname(absolute);
  const storage = validate(configSchema.shape.storage, section, { env, baseDir }, ['storage']);
  if (storage.driver === 'sqlite') storage.path = path.resolve(baseDir, storage.path);
  return deepFreeze(storage);
}

/**
 * Expands references, coerces whole-string `${VAR}` values where the schema expects a number or
 * boolean, and parses. On failure every problem is reported at once: the values that failed are
 * set aside (defaults fill in) and the input parsed again, so the cross-field checks that zod
 * skips after a type error still run. `at` prefixes the paths (a section parsed alone).
 */
function validate<S extends z.ZodType>(
  schema: S,
  raw: unknown,
  options: { env?: NodeJS.ProcessEnv; baseDir?: string; wholeReferences?: Map<string, string> },
  at: (string | number)[] = [],
): z.output<S> {
  const ctx: ExpandContext = {
    env: options.env ?? process.env,
    baseDir: options.baseDir ?? process.cwd(),
    problems: [],
    wholeReferences: options.wholeReferences ?? new Map(),
  };
  let input = expandReferences(raw, at, ctx);
  const problems = ctx.problems;
  // A value whose variable or file is missing has already been reported: its schema complaint
  // ("must be at least 16 characters" about the empty stand-in) would only mislead.
  const reported = new Set(problems.map((p) => p.slice(0, p.indexOf(': '))));
  // A complaint about what contains one may only follow from it (found by a newcomer: an unset
  // JWT_SECRET also said "exactly one of jwksUri, secret or publicKey is required (got none)"), or
  // may not (a check of its own): said, with where to look first.
  const missing = [...reported];
  const mayFollow = (problem: string): string => {
    const where = problem.slice(0, problem.indexOf(': '));
    const inside = missing.filter((m) => m.startsWith(`${where}.`) || m.startsWith(`${where}[`));
    return inside.length === 0 ? problem : `${problem} (perhaps only because of the problem at ${inside.join(', ')})`;
  };
  let result = schema.safeParse(input);
  for (let round = 0; !result.success && round < 5; round++) {
    const coerced = coerceWholeReferences(input, result.error.issues, ctx.wholeReferences, at);
    if (coerced === input) break;
    input = coerced;
    result = schema.safeParse(input);
  }
  if (result.success && problems.length === 0) return result.data;
  for (let round = 0; !result.success && round < 5; round++) {
    const fresh = formatIssues(result.error.issues, schema, input, at, ctx.wholeReferences)
      .filter((p) => !reported.has(p.slice(0, p.indexOf(': '))))
      .map(mayFollow);
    problems.push(...fresh);
    for (const p of fresh) reported.add(p.slice(0, p.indexOf(': ')));
    const repaired = setAsideFailures(input, result.error.issues);
    if (repaired === input) break;
    input = repaired;
    result = schema.safeParse(input);
  }
  throw new ConfigError(problems);
}

/** Where a number or boolean was expected and a whole-string `${VAR}` gave its text, that text converted. */
function coerceWholeReferences(
  input: unknown,
  issues: readonly z.core.$ZodIssue[],
  wholeReferences: Map<string, string>,
  prefix: (string | number)[],
): unknown {
  let out = input;
  for (const issue of issues) {
    const at = issue.path as (string | number)[];
    if (!wholeReferences.has(JSON.stringify([...prefix, ...at]))) continue;
    const text = getAt(out, at);
    if (typeof text !== 'string') continue;
    const expected = expectedTypes(issue);
    let value: unknown;
    if (expected.has('number') && /^\s*-?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*$/i.test(text)) value = Number(text);
    else if (expected.has('boolean') && /^(true|false)$/i.test(text.trim()))
      value = text.trim().toLowerCase() === 'true';
    if (value !== undefined) out = setAt(out, at, value);
  }
  return out;
}

/** The types an issue says were expected, looking into a union's alternatives. */
function expectedTypes(issue: z.core.$ZodIssue): Set<string> {
  const found = new Set<string>();
  if (issue.code === 'invalid_type') found.add(issue.expected);
  if (issue.code === 'invalid_union') {
    for (const alternative of issue.errors)
      for (const inner of alternative) if (inner.path.length === 0) for (const t of expectedTypes(inner)) found.add(t);
  }
  return found;
}

/** The input with each failing value removed (an unknown key dropped), so defaults fill in and the rest can be checked. */
function setAsideFailures(input: unknown, issues: readonly z.core.$ZodIssue[]): unknown {
  let out = input;
  for (const issue of issues) {
    const at = issue.path as (string | number)[];
    if (issue.code === 'unrecognized_keys') {
      for (const key of issue.keys) out = removeAt(out, [...at, key]);
    } else if (at.length > 0 && getAt(out, at) !== undefined) {
      out = removeAt(out, at);
    }
  }
  return out;
}

/** Copy-on-write along the path. */
function setAt(value: unknown, at: readonly (string | number)[], replacement: unknown): unknown {
  if (at.length === 0) return replacement;
  if (value === null || typeof value !== 'object') return value;
  const head = at[0]!;
  const copy = (Array.isArray(value) ? [...value] : { ...value }) as Record<string | number, unknown>;
  copy[head] = setAt(copy[head], at.slice(1), replacement);
  return copy;
}

/** Copy-on-write; an array item becomes undefined (indices of the others keep their meaning). */
function removeAt(value: unknown, at: readonly (string | number)[]): unknown {
  if (value === null || typeof value !== 'object' || at.length === 0) return value;
  const head = at[0]!;
  if (at.length > 1)
    return setAt(value, [head], removeAt((value as Record<string | number, unknown>)[head], at.slice(1)));
  if (Array.isArray(value)) return setAt(value, [head], undefined);
  const others = { ...value } as Record<string | number, unknown>;
  delete others[head];
  return others;
}

/** Copy-on-write: a subtree without references comes back as the same object (100,000 API keys are not copied). */
function expandReferences(value: unknown, at: (string | number)[], ctx: ExpandContext): unknown {
  if (typeof value === 'string') {
    if (!value.includes('${')) return value;
    const whole = WHOLE_ENV_REFERENCE.exec(value);
    if (whole) ctx.wholeReferences.set(JSON.stringify(at), whole[1]!);
    return value.replace(
      ENV_REFERENCE,
      (_match, name: string, colon: string | undefined, operator: string | undefined, word: string | undefined) => {
        // `${A:-${B}}` would end at the first `}`: a default of "${B" and a stray "}" after it, silently.
        if (word?.includes('${')) {
          ctx.problems.push(
            `${formatPath(at)}: a reference inside the default of \${${name}${colon ?? ''}${operator}…} is not supported; put the value in ${name} itself`,
          );
          return '';
        }
        const found = Object.hasOwn(ctx.env, name) ? ctx.env[name] : undefined; // `${constructor}` is not a variable
        // POSIX: with the colon, an empty value counts as unset.
        const missing = found === undefined || (colon === ':' && found === '');
        if (!missing) return found;
        if (operator === '-') return word!;
        if (operator === '?') {
          ctx.problems.push(
            `${formatPath(at)}: environment variable ${name} is ${found === undefined ? 'not set' : 'empty'}${word ? `: ${word}` : ''}`,
          );
          return '';
        }
        if (found === '') return found;
        ctx.problems.push(`${formatPath(at)}: environment variable ${name} is not set`);
        return '';
      },
    );
  }
  if (Array.isArray(value)) {
    let out: unknown[] | undefined;
    value.forEach((item, i) => {
      const expanded = expandReferences(item, [...at, i], ctx);
      if (expanded !== item) (out ??= [...value])[i] = expanded;
    });
    return out ?? value;
  }
  if (value !== null && typeof value === 'object') {
    let out: Record<string, unknown> | undefined;
    for (const [key, child] of Object.entries(value)) {
      const childAt = [...at, key];
      const expanded =
        FILE_REFERENCE_KEYS.has(key) && isFileReference(child)
          ? readSecretFile(expandReferences(child.file, [...childAt, 'file'], ctx) as string, childAt, ctx)
          : expandReferences(child, childAt, ctx);
      if (expanded !== child) (out ??= { ...value })[key] = expanded;
    }
    return out ?? value;
  }
  return value;
}

function isFileReference(value: unknown): value is { file: string } {
  return (
    value !== null &&
    typeof value === 'object' &&
    !Array.isArray(value) &&
    Object.keys(value).length === 1 &&
    typeof (value as { file?: unknown }).file === 'string'
  );
}

function readSecretFile(
  file: string,
  at: (string | number)[],
  ctx: { baseDir: string; problems: string[] },
): string | undefined {
  const resolved = path.resolve(ctx.baseDir, file);
  try {
    return readFileSync(resolved, 'utf8').replace(/\r?\n$/, '');
  } catch (err) {
    ctx.problems.push(`${formatPath(at)}: secret file ${resolved} ${describeFileError(err)}`);
    return undefined;
  }
}

/** An fs error in words (`does not exist`, `is not readable`, `is a directory`) rather than its errno code. */
export function describeFileError(err: unknown): string {
  switch ((err as NodeJS.ErrnoException).code) {
    case 'ENOENT':
      return 'does not exist';
    case 'EACCES':
    case 'EPERM':
      return 'is not readable (permission denied)';
    case 'EISDIR':
      return 'is a directory';
    case 'ENOTDIR':
      return 'has a path component that is not a directory';
    default:
      return `cannot be read (${(err as Error).message})`;
  }
}

function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object' && !Object.isFrozen(value)) {
    for (const child of Object.values(value)) deepFreeze(child);
    Object.freeze(value);
  }
  return value;
}
