import http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface ReceivedRequest {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  rawHeaders: string[];
  body: string;
  /** The gateway-side port of the connection: equal ports mean a reused (keep-alive) connection. */
  remotePort: number;
}

export interface RecordingServer {
  url: string;
  port: number;
  received: ReceivedRequest[];
  close(): Promise<void>;
}

/**
 * A real node:http upstream on port 0 that records every request it gets.
 * `respond` decides the answer (default 200 JSON); it may delay or never answer.
 */
export async function startRecordingUpstream(
  respond: (req: ReceivedRequest, res: http.ServerResponse) => void = (_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end('{"ok":true}');
  },
): Promise<RecordingServer> {
  const received: ReceivedRequest[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const record = {
        method: req.method!,
        url: req.url!,
        headers: req.headers,
        rawHeaders: req.rawHeaders,
        body: Buffer.concat(chunks).toString('utf8'),
        remotePort: req.socket.remotePort!,
      };
      received.push(record);
      respond(record, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    received,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
