import http from 'node:http';
import type { AddressInfo } from 'node:net';

// A fast delivery target: answers 200 to every POST and counts them; GET /count reports.
let delivered = 0;
let lastAt = 0;
const server = http.createServer((req, res) => {
  if (req.method === 'GET') {
    res.end(JSON.stringify({ delivered, lastAt }));
    return;
  }
  req.resume();
  req.on('end', () => {
    delivered++;
    lastAt = Date.now();
    res.end('{"ok":true}');
  });
});
server.keepAliveTimeout = 65_000;
server.listen(0, '127.0.0.1', () => console.log(`ready ${(server.address() as AddressInfo).port}`));
// A normal exit on SIGTERM, so --cpu-prof can write its profile.
process.on('SIGTERM', () => process.exit(0));
