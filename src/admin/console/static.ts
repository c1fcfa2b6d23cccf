import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { fileURLToPath } from 'node:url';
import { HttpError } from '../../errors.js';

/**
 * The console's files: the top-level `console/` folder of the repository and of the installed
 * package (package.json "files"), three levels above this module in src/ and in dist/ alike.
 */
export const CONSOLE_ASSETS_DIR = fileURLToPath(new URL('../../../console/', import.meta.url));

/**
 * Sent with every /console/ response, the session endpoints' and errors included. The page is
 * plain ES modules and a style sheet from this origin: no inline script or style, no eval, no
 * other origin to fetch from, no framing.
 */
export const CONSOLE_SECURITY_HEADERS: Readonly<Record<string, string>> = Object.freeze({
  'content-security-policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; " +
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'x-frame-options': 'DENY',
  'cross-origin-opener-policy': 'same-origin',
  'cross-origin-resource-policy': 'same-origin',
});

const CONTENT_TYPES: Readonly<Record<string, string>> = {
  html: 'text/html; charset=utf-8',
  js: 'text/javascript; charset=utf-8',
  css: 'text/css; charset=utf-8',
  svg: 'image/svg+xml',
};
/** The only names served: flat, lower case, a known type. Nothing else in the folder is reachable. */
const ASSET_NAME = /^[a-z0-9-]+\.(html|js|css|svg)$/;

interface Asset {
  body: Buffer;
  type: string;
  etag: string;
}

/**
 * Serves GET/HEAD /console/<file> from CONSOLE_ASSETS_DIR (`/console/` is index.html), read once
 * at the first request and kept. `Cache-Control: no-cache` with an ETag: the browser revalidates
 * (a 304 costs a few bytes), so an upgrade's files are used at once without versioned names.
 */
export function consoleAssets(dir: string = CONSOLE_ASSETS_DIR) {
  let assets: Map<string, Asset> | undefined;

  function load(): Map<string, Asset> {
    const found = new Map<string, Asset>();
    let names: string[];
    try {
      names = readdirSync(dir);
    } catch (err) {
      throw new HttpError('not_found', `the console's files are missing (${(err as Error).message})`);
    }
    for (const name of names) {
      const match = ASSET_NAME.exec(name);
      if (!match) continue;
      const body = readFileSync(`${dir}/${name}`);
      const etag = `"${createHash('sha256').update(body).digest('base64url').slice(0, 22)}"`;
      found.set(name, { body, type: CONTENT_TYPES[match[1]!]!, etag });
    }
    return found;
  }

  return function serveConsoleAsset(req: IncomingMessage, res: ServerResponse, name: string): void {
    if (req.method !== 'GET' && req.method !== 'HEAD')
      throw new HttpError('method_not_allowed', `${req.method} /console/${name}`, { allow: 'GET, HEAD' });
    assets ??= load();
    const asset = assets.get(name === '' ? 'index.html' : name);
    if (!asset) throw new HttpError('not_found', `no console file ${name.slice(0, 100)}`);
    const headers = { etag: asset.etag, 'cache-control': 'no-cache' };
    const tags = req.headers['if-none-match'];
    if (tags !== undefined && tags.split(',').some((tag) => tag.trim() === asset.etag)) {
      res.writeHead(304, headers);
      res.end();
      return;
    }
    res.writeHead(200, { ...headers, 'content-type': asset.type, 'content-length': asset.body.length });
    res.end(req.method === 'HEAD' ? undefined : asset.body);
  };
}
