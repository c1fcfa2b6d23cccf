/**
 * Credentials inside URLs, hidden for printing (`config print`, config error messages): the
 * password of the userinfo and the values of credential-looking query parameters (libpq and
 * node-postgres read `password`/`sslpassword` from the query too). Deliberately loose: a password
 * with an unescaped `@`, `/` or space is still hidden whole (everything up to the last `@` is
 * userinfo), at the cost of hiding a little too much of an odd URL.
 */
const CREDENTIAL_PARAMETER = /pass|secret|token|key|sig|auth|credential/i;
export const REDACTED = '[redacted]';

export function redactUrlCredentials(value: string): string {
  const scheme = /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.exec(value)?.[0] ?? '';
  let rest = value.slice(scheme.length);
  const at = rest.lastIndexOf('@');
  if (at !== -1) {
    const colon = rest.indexOf(':');
    if (colon !== -1 && colon < at) rest = `${rest.slice(0, colon)}:${REDACTED}${rest.slice(at)}`;
  }
  const query = rest.indexOf('?');
  if (query !== -1) {
    const [search, fragment] = splitOnce(rest.slice(query + 1), '#');
    const parameters = search.split('&').map((pair) => {
      const [name, parameterValue] = splitOnce(pair, '=');
      return parameterValue !== undefined && CREDENTIAL_PARAMETER.test(safeDecode(name)) ? `${name}=${REDACTED}` : pair;
    });
    rest = `${rest.slice(0, query + 1)}${parameters.join('&')}${fragment === undefined ? '' : `#${fragment}`}`;
  }
  return scheme + rest;
}

function splitOnce(text: string, separator: string): [string, string | undefined] {
  const i = text.indexOf(separator);
  return i === -1 ? [text, undefined] : [text.slice(0, i), text.slice(i + 1)];
}

function safeDecode(text: string): string {
  try {
    return decodeURIComponent(text);
  } catch {
    return text;
  }
}
