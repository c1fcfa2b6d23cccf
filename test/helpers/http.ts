import http from 'node:http';
import net from 'node:net';

export interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: string;
  json(): any;
}

export interface RequestOptions {
  method?: string;
  headers?: http.OutgoingHttpHeaders | [string, string][];
  body?: string | Buffer;
  /** Bind the client socket to this address (e.g. 127.0.0.2 to come from a disallowed IP). */
  localAddress?: string;
  agent?: http.Agent | false;
  /** Give up (reject with ETIMEDOUT) when no answer has come within this many ms. Unset: wait. */
  timeoutMs?: number;
}

/** One HTTP request with node:http; the path is sent as given (no normalisation). */
export function request(baseUrl: string, path: string, options: RequestOptions = {}): Promise<Reply> {
  const url = new URL(baseUrl);
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: url.hostname.replace(/^\[|\]$/g, ''),
        port: url.port,
        method: options.method ?? 'GET',
        path,
        // Tuples go out as raw headers, so repeated names and exact spellings are sent as given.
        // (node:http adds no Host header to raw headers, so it is added here.)
        headers: (Array.isArray(options.headers)
          ? ['Host', url.host, ...options.headers.flat()]
          : options.headers) as http.OutgoingHttpHeaders,
        localAddress: options.localAddress,
        agent: options.agent ?? false,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const body = Buffer.concat(chunks).toString('utf8');
          resolve({ status: res.statusCode!, headers: res.headers, body, json: () => JSON.parse(body) });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    if (options.timeoutMs !== undefined)
      req.setTimeout(options.timeoutMs, () =>
        req.destroy(Object.assign(new Error('no answer in time'), { code: 'ETIMEDOUT' })),
      );
    req.end(options.body);
  });
}

/**
 * Writes a raw HTTP/1.1 request (request line and headers exactly as given) and returns the
 * status and body: for request targets node:http would refuse to send.
 */
export function rawRequest(baseUrl: string, text: string): Promise<{ status: number; raw: string; body: string }> {
  const url = new URL(baseUrl);
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(url.port), url.hostname.replace(/^\[|\]$/g, ''));
    let raw = '';
    socket.setEncoding('utf8');
    socket.on('data', (d: string) => (raw += d));
    socket.on('end', () => {
      const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(raw)?.[1] ?? 0);
      resolve({ status, raw, body: raw.slice(raw.indexOf('\r\n\r\n') + 4) });
    });
    socket.on('error', reject);
    socket.write(text.includes('Connection:') ? text : text.replace('\r\n\r\n', '\r\nConnection: close\r\n\r\n'));
  });
}
