import type { AuthConfig, RuleConfig } from '../config/schema.js';
import { HttpError } from '../errors.js';
import type { Identity } from './credentials/authenticate.js';
import { compileMethodSet, compilePathPatterns, type PathMatcher } from './path-pattern.js';

interface CompiledRule {
  /** Where it is configured, for the log: `rules[2]`, `channels.tg.send`. */
  name: string;
  /** Where its requirements apply: every spelling of its paths (compilePathPatterns, loose). */
  paths: PathMatcher;
  /** Where it counts as matched for `defaultAllow: false`: its paths as written. */
  exactPaths: PathMatcher;
  methods: ReadonlySet<string> | undefined;
  scopes: readonly string[];
  claims: readonly (readonly [name: string, value: string])[];
  /** The 403's challenge, built once: RFC 6750 §3 with the scopes this rule asks for. */
  challenge: string;
}

/** Decides, for an authenticated request, whether its path and method are allowed: undefined (go on) or the 403. */
export type Authorizer = (method: string, path: string, identity: Identity) => HttpError | undefined;

/** A rule the config implies rather than lists (a channel's `send.scopes`), with where it comes from. */
export interface ImpliedRule {
  name: string;
  rule: RuleConfig;
}

/**
 * Compiles `gateway.auth.rules` (then any `implied` rules, which behave exactly like listed ones) once per config. Per request: O(rules), each a regex test and a
 * method lookup. Every rule whose paths and methods match must be satisfied: all its scopes
 * granted, each claim equal to the JWT's (or contained in it, for an array claim). A claim that
 * is missing, or not a string or array of strings, does not satisfy (fail closed); so an
 * API-key-only request never satisfies a claims rule. No rule matching its paths as written:
 * `defaultAllow` (a case or trailing-slash spelling brings a rule's requirements, never its
 * permission). `path` is the decoded path (matchablePath).
 */
export function compileAuthorizer(
  auth: Pick<AuthConfig, 'rules' | 'defaultAllow'>,
  implied: readonly ImpliedRule[] = [],
): Authorizer {
  const rules = [
    ...auth.rules.map((rule, i) => compileRule(rule, `rules[${i}]`)),
    ...implied.map(({ name, rule }) => compileRule(rule, name)),
  ];
  const { defaultAllow } = auth;
  return function authorize(method, path, identity) {
    let matched = false;
    let otherSpelling: CompiledRule | undefined;
    for (const rule of rules) {
      if (rule.methods !== undefined && !rule.methods.has(method)) continue;
      if (!rule.paths(path)) continue;
      if (rule.exactPaths(path)) matched = true;
      else otherSpelling ??= rule;
      const missing = missingGrant(rule, identity);
      if (missing !== undefined) return insufficientScope(rule.challenge, `${rule.name}: ${missing}`);
    }
    if (matched || defaultAllow) return undefined;
    const detail =
      otherSpelling === undefined
        ? 'no rule matches and gateway.auth.defaultAllow is false'
        : `no rule matches this spelling of the path (${otherSpelling.name} covers it only in another case or with a trailing slash) and gateway.auth.defaultAllow is false`;
    return insufficientScope(DEFAULT_DENY_CHALLENGE, detail);
  };
}

const DEFAULT_DENY_CHALLENGE = 'Bearer realm="gatehouse", error="insufficient_scope"';

function compileRule(rule: RuleConfig, name: string): CompiledRule {
  const scopes = rule.scopes ?? [];
  return {
    name,
    paths: compilePathPatterns(rule.paths),
    exactPaths: compilePathPatterns(rule.paths, 'exact'),
    methods: compileMethodSet(rule.methods),
    scopes,
    claims: Object.entries(rule.claims ?? {}),
    // scope-tokens hold no `"` or `\` (schema), so they go into the quoted string as they are.
    challenge: scopes.length > 0 ? `${DEFAULT_DENY_CHALLENGE}, scope="${scopes.join(' ')}"` : DEFAULT_DENY_CHALLENGE,
  };
}

/** What the identity lacks for `rule`, for the log; undefined when it has it all. */
function missingGrant(rule: CompiledRule, identity: Identity): string | undefined {
  for (const scope of rule.scopes) if (!identity.scopes.includes(scope)) return `scope "${scope}" not granted`;
  for (const [name, value] of rule.claims) {
    const claim =
      identity.claims !== undefined && Object.hasOwn(identity.claims, name) ? identity.claims[name] : undefined;
    const ok =
      typeof claim === 'string' ? claim === value : Array.isArray(claim) && claim.some((item) => item === value);
    if (!ok) return `claim "${name}" is not "${value}"`;
  }
  return undefined;
}

function insufficientScope(challenge: string, detail: string): HttpError {
  return new HttpError('insufficient_scope', detail, { 'www-authenticate': challenge });
}
