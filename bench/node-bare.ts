import { createHash, timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';

/*
 * The reference for the /api/ edge: what node:http alone does for the same job. It checks
 * X-API-Key by hash compare and forwards over a keep-alive agent, streaming both ways.
 * No logging, no IP rules, no header hygiene: the Node limit for "check a key, proxy".
 */
const [upstreamPort, key] = process.argv.slice(2);
const expected = createHash('sha256').update(key!).digest();
const agent = new http.Agent({ keepAlive: true, maxFreeSockets: 256 });

const server = http.createServer((req, res) => {
  const presented = req.headers['x-api-key'];
  if (typeof presented !== 'string' || !timingSafeEqual(createHash('sha256').update(presented).digest(), expected)) {
    res.writeHead(401, { 'content-type': 'application/json' });
    res.end('{"error":"unauthorized"}');
    return;
  }
  const headers = { ...req.headers };
  delete headers['x-api-key'];
  delete headers.connection;
  const upstream = http.request(
    { host: '127.0.0.1', port: upstreamPort, method: req.method, path: req.url, headers, agent },
    (upRes) => {
      res.writeHead(upRes.statusCode!, upRes.headers);
      upRes.pipe(res);
    },
  );
  upstream.on('error', () => {
    res.writeHead(502);
    res.end();
  });
  req.pipe(upstream);
});
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => console.log(`ready ${(server.address() as AddressInfo).port}`));
// A normal exit on SIGTERM, so --cpu-prof can write its profile.
process.on('SIGTERM', () => process.exit(0));
