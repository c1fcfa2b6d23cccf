import { createHash, timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';

/*
 * The reference for WebSockets through the edge: what node:http alone does for the same job. It
 * checks X-API-Key by hash compare, opens the upstream handshake on a connection of its own,
 * relays the 101 and pipes both ways. No logging, no limits, no header hygiene.
 */
const [upstreamPort, key] = process.argv.slice(2);
const expected = createHash('sha256').update(key!).digest();

const server = http.createServer((_req, res) => res.writeHead(426).end());
server.on('upgrade', (req: http.IncomingMessage, client: Socket, head: Buffer) => {
  const presented = req.headers['x-api-key'];
  if (typeof presented !== 'string' || !timingSafeEqual(createHash('sha256').update(presented).digest(), expected)) {
    client.end('HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
    return;
  }
  const headers = { ...req.headers };
  delete headers['x-api-key'];
  const upstreamReq = http.request({
    host: '127.0.0.1',
    port: upstreamPort,
    method: 'GET',
    path: req.url,
    headers,
    agent: false,
  });
  upstreamReq.on('upgrade', (res, upstream: Socket, upstreamHead: Buffer) => {
    const lines = ['HTTP/1.1 101 Switching Protocols'];
    for (let i = 0; i < res.rawHeaders.length; i += 2) lines.push(`${res.rawHeaders[i]}: ${res.rawHeaders[i + 1]}`);
    client.write(`${lines.join('\r\n')}\r\n\r\n`);
    if (upstreamHead.length > 0) client.write(upstreamHead);
    if (head.length > 0) upstream.write(head);
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    upstream.pipe(client);
    client.pipe(upstream);
    upstream.on('error', () => client.destroy());
    client.on('error', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    client.on('close', () => upstream.destroy());
  });
  upstreamReq.on('error', () => client.destroy());
  upstreamReq.end();
});
server.listen(0, '127.0.0.1', () => console.log(`ready ${(server.address() as AddressInfo).port}`));
process.on('SIGTERM', () => process.exit(0));
