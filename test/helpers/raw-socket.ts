import net from 'node:net';

export interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

export interface RawExchange {
  /** Everything the server sent. */
  raw: string;
  /** The HTTP responses in `raw`, in order (bodies framed by Content-Length; HEAD answers have none). */
  responses: RawResponse[];
  /** The server closed the connection (rather than the idle wait running out). */
  closedByServer: boolean;
  /** Milliseconds from the first byte written to the server's close (or to giving up). */
  ms: number;
}

/**
 * Writes bytes exactly as given (any framing, any number of pipelined requests) and collects what
 * comes back until the server closes, nothing arrives for `idleMs`, or `timeoutMs` passes.
 * `chunks` are written `gapMs` apart (a client that trickles its request).
 */
export function rawExchange(
  baseUrl: string,
  chunks: (string | Buffer)[] | string | Buffer,
  options: { idleMs?: number; timeoutMs?: number; gapMs?: number; headMethods?: number[] } = {},
): Promise<RawExchange> {
  const url = new URL(baseUrl);
  const parts = Array.isArray(chunks) ? chunks : [chunks];
  const idleMs = options.idleMs ?? 300;
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const socket = net.connect(Number(url.port), url.hostname.replace(/^\[|\]$/g, ''));
    const received: Buffer[] = [];
    let done = false;
    let idle: NodeJS.Timeout | undefined;
    let writing: NodeJS.Timeout | undefined;
    const finish = (closedByServer: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(idle);
      clearTimeout(overall);
      clearTimeout(writing);
      socket.destroy();
      const raw = Buffer.concat(received).toString('latin1');
      resolve({
        raw,
        responses: parseResponses(raw, options.headMethods ?? []),
        closedByServer,
        ms: performance.now() - started,
      });
    };
    const armIdle = () => {
      clearTimeout(idle);
      idle = setTimeout(() => finish(false), idleMs);
    };
    const overall = setTimeout(() => finish(false), options.timeoutMs ?? 10_000);
    socket.on('data', (d: Buffer) => {
      received.push(d);
      armIdle();
    });
    socket.on('end', () => finish(true));
    socket.on('close', () => finish(true));
    socket.on('error', (err: NodeJS.ErrnoException) =>
      err.code === 'ECONNRESET' || err.code === 'EPIPE' ? finish(true) : reject(err),
    );
    let next = 0;
    const writeNext = () => {
      if (done || next >= parts.length) return armIdle();
      socket.write(parts[next++]!);
      if (next < parts.length) writing = setTimeout(writeNext, options.gapMs ?? 0);
      else armIdle();
    };
    socket.once('connect', writeNext);
  });
}

/** Splits a byte stream of HTTP/1.1 responses (Content-Length or chunked bodies). `headIndexes`: responses that have no body. */
function parseResponses(raw: string, headIndexes: number[]): RawResponse[] {
  const out: RawResponse[] = [];
  let at = 0;
  while (at < raw.length) {
    const end = raw.indexOf('\r\n\r\n', at);
    if (end === -1) break;
    const lines = raw.slice(at, end).split('\r\n');
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? '')?.[1] ?? 0);
    const headers: Record<string, string> = {};
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':');
      if (colon > 0) headers[line.slice(0, colon).toLowerCase()] = line.slice(colon + 1).trim();
    }
    let bodyStart = end + 4;
    let body = '';
    if (headIndexes.includes(out.length) || status === 204 || status === 304) {
      // no body
    } else if (headers['transfer-encoding']?.toLowerCase() === 'chunked') {
      for (;;) {
        const lineEnd = raw.indexOf('\r\n', bodyStart);
        if (lineEnd === -1) break;
        const size = parseInt(raw.slice(bodyStart, lineEnd), 16);
        bodyStart = lineEnd + 2;
        if (!(size > 0)) {
          bodyStart = raw.indexOf('\r\n', bodyStart) + 2;
          break;
        }
        body += raw.slice(bodyStart, bodyStart + size);
        bodyStart += size + 2;
      }
    } else {
      const length = Number(headers['content-length'] ?? 0);
      body = raw.slice(bodyStart, bodyStart + length);
      bodyStart += length;
    }
    out.push({ status, headers, body });
    at = bodyStart;
  }
  return out;
}
