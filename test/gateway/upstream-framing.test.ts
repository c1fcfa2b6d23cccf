import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { startTestGatehouse, testConfig, TEST_PLAIN_KEY, type TestGatehouse } from '../helpers/gatehouse.js';

// A request without a body ends its upstream request at once (src/gateway/proxy.ts, endsAtOnce)
// instead of piping an empty stream into it. What the upstream reads, byte for byte, must say the
// same as before: no body where none was sent, the length or chunks where one was, and the
// connection fit for the next request.

interface Received {
  connection: number;
  head: string;
  body: string;
}

/** An upstream on raw sockets: parses Content-Length and chunked bodies itself and answers each request 200, keep-alive. */
async function startRawUpstream(): Promise<{ url: string; received: Received[]; close(): Promise<void> }> {
  const received: Received[] = [];
  const sockets = new Set<net.Socket>();
  let connections = 0;
  const server = net.createServer((socket) => {
    const connection = ++connections;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    let buffered = '';
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => {
      buffered += chunk;
      for (;;) {
        const end = buffered.indexOf('\r\n\r\n');
        if (end < 0) return;
        const head = buffered.slice(0, end);
        let rest = buffered.slice(end + 4);
        let body = '';
        if (/\r\ntransfer-encoding: *chunked/i.test(head)) {
          for (;;) {
            const line = rest.indexOf('\r\n');
            if (line < 0) return;
            const size = parseInt(rest.slice(0, line), 16);
            if (rest.length < line + 2 + size + 2) return;
            body += rest.slice(line + 2, line + 2 + size);
            rest = rest.slice(line + 2 + size + 2);
            if (size === 0) break;
          }
        } else {
          const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
          if (rest.length < length) return;
          body = rest.slice(0, length);
          rest = rest.slice(length);
        }
        buffered = rest;
        received.push({ connection, head, body });
        const answer = 'HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=60\r\n\r\n';
        socket.write(head.startsWith('HEAD ') ? answer : `${answer}ok`);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    received,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

/** Sends raw requests on one client connection, one after the other; resolves with each answer's status. */
async function sendInTurn(url: string, requests: string[]): Promise<number[]> {
  const { port } = new URL(url);
  const socket = net.connect(Number(port), '127.0.0.1');
  socket.setEncoding('latin1');
  const statuses: number[] = [];
  let buffered = '';
  return new Promise((resolve, reject) => {
    socket.on('error', reject);
    socket.on('connect', () => socket.write(requests[0]!));
    socket.on('data', (chunk: string) => {
      buffered += chunk;
      for (;;) {
        const end = buffered.indexOf('\r\n\r\n');
        if (end < 0) return;
        const toHead = requests[statuses.length]!.startsWith('HEAD ');
        const length = toHead ? 0 : Number(/\r\ncontent-length: *(\d+)/i.exec(buffered.slice(0, end))?.[1] ?? 0);
        if (buffered.length < end + 4 + length) return;
        statuses.push(Number(buffered.slice(9, 12)));
        buffered = buffered.slice(end + 4 + length);
        if (statuses.length === requests.length) {
          socket.destroy();
          return resolve(statuses);
        }
        socket.write(requests[statuses.length]!);
      }
    });
  });
}

describe('the framing of what goes up, with and without a body', { timeout: 30_000 }, () => {
  let upstream: Awaited<ReturnType<typeof startRawUpstream>>;
  let gatehouse: TestGatehouse;
  before(async () => {
    upstream = await startRawUpstream();
    gatehouse = await startTestGatehouse(testConfig(upstream.url, { log: { level: 'warn' } }));
  });
  after(async () => {
    await gatehouse?.close(0);
    await upstream?.close();
  });

  it('bodiless requests go up with no body and no framing header; bodies with their length or chunks; all on one kept connection', async () => {
    const auth = `Host: x\r\nX-API-Key: ${TEST_PLAIN_KEY}\r\n`;
    const statuses = await sendInTurn(gatehouse.url, [
      `GET /api/a HTTP/1.1\r\n${auth}\r\n`,
      `POST /api/b HTTP/1.1\r\n${auth}Content-Length: 0\r\n\r\n`,
      `DELETE /api/c HTTP/1.1\r\n${auth}\r\n`,
      `POST /api/d HTTP/1.1\r\n${auth}Content-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello`,
      `PUT /api/e HTTP/1.1\r\n${auth}Content-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n`,
      `HEAD /api/f HTTP/1.1\r\n${auth}\r\n`,
      `GET /api/g HTTP/1.1\r\n${auth}\r\n`,
    ]);
    assert.deepEqual(statuses, [200, 200, 200, 200, 200, 200, 200]);
    const byPath = (path: string) => {
      const found = upstream.received.filter((r) => r.head.split(' ')[1] === path);
      assert.equal(found.length, 1, `${path} reached the upstream once`);
      return found[0]!;
    };
    const framing = (r: Received) =>
      r.head
        .split('\r\n')
        .filter((line) => /^(content-length|transfer-encoding):/i.test(line))
        .map((line) => line.toLowerCase());
    for (const path of ['/api/a', '/api/c', '/api/f', '/api/g']) {
      assert.deepEqual(framing(byPath(path)), [], path);
      assert.equal(byPath(path).body, '');
    }
    assert.deepEqual(framing(byPath('/api/b')), ['content-length: 0']);
    assert.deepEqual(framing(byPath('/api/d')), ['content-length: 5']);
    assert.equal(byPath('/api/d').body, 'hello');
    assert.deepEqual(framing(byPath('/api/e')), ['transfer-encoding: chunked']);
    assert.equal(byPath('/api/e').body, 'abcde');
    // One request at a time from one client: gatehouse kept one upstream connection for all of them.
    assert.deepEqual(new Set(upstream.received.map((r) => r.connection)).size, 1);
  });
});
