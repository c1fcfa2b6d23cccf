import http from 'node:http';
import type { AddressInfo } from 'node:net';

// The benchmark's internal API: the smallest useful node:http service (a small JSON body).
const body = JSON.stringify({ ok: true, service: 'bench-upstream', items: [1, 2, 3] });
const server = http.createServer((req, res) => {
  req.resume();
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
  res.end(body);
});
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => console.log(`ready ${(server.address() as AddressInfo).port}`));
// A normal exit on SIGTERM, so --cpu-prof can write its profile.
process.on('SIGTERM', () => process.exit(0));
