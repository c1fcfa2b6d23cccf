import { HttpError } from '../errors.js';

/** A segment of a pattern: literal text, `*` (one segment), or `**` (any rest, last only). */
const LITERAL_SEGMENT = /^[A-Za-z0-9\-._~!$&()+,=:@%]+$/;

/** Where patterns may point: the proxied space, and gatehouse's own API on the gateway listener (channels). */
const PATTERN_PREFIXES = ['/api/', '/_gatehouse/'] as const;

/**
 * Why `pattern` is not a usable path pattern, or undefined when it is. A pattern starts with
 * `/api/` or `/_gatehouse/`; each segment is literal, `*` (exactly one non-empty segment) or, last only, `**`
 * (the rest, possibly nothing: `/api/orders/**` also covers `/api/orders`).
 */
export function pathPatternProblem(pattern: string): string | undefined {
  if (!PATTERN_PREFIXES.some((prefix) => pattern.startsWith(prefix)))
    return `path pattern "${pattern}" must start with /api/ or /_gatehouse/`;
  const segments = pattern.slice(1).split('/');
  for (const [i, segment] of segments.entries()) {
    if (segment === '**') {
      if (i !== segments.length - 1) return `"**" must be the last segment of "${pattern}"`;
    } else if (segment === '*') {
      continue;
    } else if (segment === '') {
      if (i !== segments.length - 1) return `path pattern "${pattern}" has an empty segment`;
    } else if (!LITERAL_SEGMENT.test(segment) || segment.includes('*')) {
      return `segment "${segment}" of "${pattern}": "*" and "**" stand alone as whole segments; other characters must be unencoded path characters`;
    } else if (segment === '.' || segment === '..') {
      return `path pattern "${pattern}" has a dot segment`;
    } else if (segment.includes('%')) {
      return `path pattern "${pattern}" is matched against the decoded path: write it without percent-encoding`;
    }
  }
  return undefined;
}

/** A compiled set of path patterns: one anchored regular expression. */
export type PathMatcher = (path: string) => boolean;

/**
 * Compiles patterns (already validated by pathPatternProblem) into one matcher, once per config.
 * Any character matches inside a segment, line breaks included (the `s` flag: without it `.`
 * stopped at `\n`, and `/api/admin/x%0a` matched no rule at all).
 *
 * `loose` (for what a rule requires, and where a rate limit counts): a pattern also covers every
 * spelling an upstream may read as the same path, so a requirement cannot be stepped around:
 * ASCII letters in any case (Express, ASP.NET and IIS route case-insensitively by default) and,
 * unless it ends in `**`, a trailing slash (Express's default routing). `exact` (whether a rule
 * matched at all, for `defaultAllow: false`): the pattern as written, so a spelling never lets
 * in more than the rule's own path did.
 */
export function compilePathPatterns(patterns: readonly string[], mode: 'loose' | 'exact' = 'loose'): PathMatcher {
  const loose = mode === 'loose';
  const alternatives = patterns.map((pattern) => {
    const segments = pattern.slice(1).split('/');
    const trailingSlash = segments.at(-1) === '';
    if (loose && trailingSlash) segments.pop(); // `/api/reports/` and `/api/reports` are one pattern
    let source = '';
    for (const segment of segments) {
      if (segment === '**') source += '(?:/.*)?';
      else if (segment === '*') source += '/[^/]+';
      else source += '/' + segment.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
    }
    return loose && segments.at(-1) !== '**' ? `${source}/?` : source;
  });
  const regex = new RegExp(`^(?:${alternatives.join('|')})$`, loose ? 'is' : 's');
  return (path) => regex.test(path);
}

/**
 * The path rules and rate limits are matched against: the raw target without its query,
 * percent-decoded (the path gate already refused encodings that change structure: `%2F`, `%2E`,
 * `%25`…), so `/api/%6Frders` cannot slip past a rule written for `/api/orders`. A sequence that
 * is not UTF-8 cannot be matched reliably: refused (400).
 */
export function matchablePath(url: string): string | HttpError {
  const queryAt = url.indexOf('?');
  const path = queryAt === -1 ? url : url.slice(0, queryAt);
  if (!path.includes('%')) return path;
  try {
    return decodeURIComponent(path);
  } catch {
    return new HttpError('invalid_path', 'percent-encoding that is not UTF-8');
  }
}

/**
 * The methods a rule or limit names, as a set to look up. `GET` brings `HEAD` with it: HEAD is
 * GET without the body (RFC 9110 §9.3.2), so a rule on GET cannot be sidestepped with HEAD.
 */
export function compileMethodSet(methods: readonly string[] | undefined): ReadonlySet<string> | undefined {
  if (methods === undefined) return undefined;
  const set = new Set(methods);
  if (set.has('GET')) set.add('HEAD');
  return set;
}
