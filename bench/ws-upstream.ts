import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { WebSocketServer } from 'ws';

/* The WebSocket upstream of the bench: echoes every message back (ws, on node:http). */
const server = http.createServer((_req, res) => res.end());
const wss = new WebSocketServer({ server, perMessageDeflate: false });
wss.on('connection', (ws) => ws.on('message', (data, binary) => ws.send(data, { binary })));
server.listen(0, '127.0.0.1', () => console.log(`ready ${(server.address() as AddressInfo).port}`));
process.on('SIGTERM', () => process.exit(0));
