/**
 * The admin console's session cookie (src/admin/console/session.ts). Browsers do not keep cookies
 * apart by port, so a browser signed in to the console sends it with every request to the same
 * host, /api/ on the gateway's port included: the gateway takes it out before proxying
 * (src/gateway/forward-headers.ts), so no upstream ever holds a console session.
 */
export const CONSOLE_SESSION_COOKIE = 'gatehouse_console';

/** A Cookie header without any `name=` pair; undefined when nothing else is left. */
export function withoutCookie(header: string, name: string): string | undefined {
  const kept = header.split(';').filter((part) => {
    const eq = part.indexOf('=');
    return (eq === -1 ? part : part.slice(0, eq)).trim() !== name;
  });
  const joined = kept
    .map((part) => part.trim())
    .filter((part) => part !== '')
    .join('; ');
  return joined === '' ? undefined : joined;
}
