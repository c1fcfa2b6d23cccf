import type { IncomingMessage } from 'node:http';
import type { GatewayConfig } from '../config/schema.js';
import { HttpError } from '../errors.js';
import { API_PREFIX } from './path-gate.js';
import { countUpstreamRetry } from '../observability/metrics.js';
import { createUpstreamProxy, type UpstreamProxy } from './proxy.js';

/** One upstream and the prefix that leads to it. */
export interface UpstreamRoute {
  prefix: string;
  /** Where it goes (what a WebSocket relay connects to). */
  upstream: GatewayConfig['upstream'];
  /** Removed from the front of the request target before proxying. */
  stripPrefix: string | undefined;
  proxy: UpstreamProxy;
}

export interface UpstreamRoutes {
  /**
   * The route of a request: the longest prefix its decoded path (matchablePath, what the rules
   * saw) starts with, else `/api/`. A target that reaches a prefix only once decoded
   * (`/api/%62illing/`), or only in another case (`/api/Billing/`), is refused (400): the rules
   * judged it as that route's path, so it may not go to another upstream, and `stripPrefix`
   * works on the raw bytes.
   */
  select(url: string, decodedPath: string): UpstreamRoute | HttpError;
  /**
   * Points the request at its route's upstream: strips `stripPrefix` from `req.url` (the
   * upstream of `/api/billing/x` with `stripPrefix: "/api"` gets `/billing/x`, query untouched)
   * and tells it what was removed in `X-Forwarded-Prefix` (as Traefik's StripPrefix does).
   * Call after prepareUpstreamHeaders (which stripped any client-sent X-Forwarded-Prefix).
   */
  aim(req: IncomingMessage, route: UpstreamRoute): void;
  /** Releases every route's idle upstream connections. */
  close(): void;
}

/**
 * Compiles `gateway.routes` (plus `/api/` → `gateway.upstream`) once per config, each route
 * with its own proxy and keep-alive agent. Selection is O(routes): prefixes longest first, the
 * first that the decoded path starts with wins.
 */
export function createUpstreamRoutes(
  gateway: Pick<GatewayConfig, 'upstream' | 'routes'>,
  onError: (req: IncomingMessage, error: HttpError) => void,
  /** Called when an upstream's response headers arrive (the upstream timing). */
  onAnswer?: (req: IncomingMessage) => void,
): UpstreamRoutes {
  const fallback: UpstreamRoute = {
    prefix: API_PREFIX,
    upstream: gateway.upstream,
    stripPrefix: undefined,
    proxy: createUpstreamProxy(gateway.upstream, onError, onAnswer, () => countUpstreamRetry(API_PREFIX)),
  };
  const routes: (UpstreamRoute & { folded: string })[] = [...gateway.routes]
    .sort((a, b) => b.prefix.length - a.prefix.length)
    .map((route) => ({
      prefix: route.prefix,
      upstream: route.upstream,
      folded: foldAscii(route.prefix),
      stripPrefix: route.stripPrefix,
      proxy: createUpstreamProxy(route.upstream, onError, onAnswer, () => countUpstreamRetry(route.prefix)),
    }));

  return {
    select(url, decodedPath) {
      // ASCII letters folded, as the rules compare (compilePathPatterns): prefixes are ASCII.
      const folded = routes.length > 0 ? foldAscii(decodedPath) : decodedPath;
      for (const route of routes) {
        if (!folded.startsWith(route.folded)) continue;
        if (url.startsWith(route.prefix)) return route;
        const how = decodedPath.startsWith(route.prefix) ? 'percent-encoded characters in' : 'another case of';
        return new HttpError('invalid_path', `${how} the route prefix ${route.prefix}`);
      }
      return fallback;
    },
    aim(req, route) {
      if (route.stripPrefix === undefined) return;
      req.url = req.url!.slice(route.stripPrefix.length);
      req.headers['x-forwarded-prefix'] = route.stripPrefix;
    },
    close() {
      fallback.proxy.close();
      for (const route of routes) route.proxy.close();
    },
  };
}

/** A–Z to a–z only (toLowerCase would also turn U+212A KELVIN SIGN into "k"). */
function foldAscii(text: string): string {
  return text.replace(/[A-Z]/g, (c) => String.fromCharCode(c.charCodeAt(0) + 32));
}
