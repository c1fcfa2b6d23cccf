import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { request } from '../helpers/http.js';
import { startTestGatehouse, testConfig, TEST_PLAIN_KEY, type TestGatehouse } from '../helpers/gatehouse.js';

// Issue 29: a valid request got `502 upstream_unreachable` that the upstream never saw: gatehouse
// reused a keep-alive connection just as the upstream closed it idle. The race, made certain: an
// upstream on raw sockets that answers the first request of each connection (keep-alive) and
// cuts the connection, unread, when another request arrives on it: a reset, or a plain close.

interface Seen {
  method: string;
  path: string;
  idempotencyKey?: string;
}

async function startCuttingUpstream(): Promise<{ url: string; seen: Seen[]; cuts: number; close(): Promise<void> }> {
  const seen: Seen[] = [];
  const state = { cuts: 0 };
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    let buffered = Buffer.alloc(0);
    let served = 0;
    socket.on('data', (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      for (;;) {
        const end = buffered.indexOf('\r\n\r\n');
        if (end < 0) return;
        const head = buffered.subarray(0, end).toString('latin1');
        const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
        if (buffered.length < end + 4 + length) return;
        buffered = buffered.subarray(end + 4 + length);
        const [method, path] = head.split(' ');
        if (served > 0 && path!.includes('/answered/')) {
          // Seen, and the answer begun (a status line and a header), then the connection lost.
          seen.push({ method: method!, path: path! });
          socket.end('HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n', () => socket.resetAndDestroy());
          return;
        }
        if (served > 0) {
          // A request on a reused connection: dropped unread, half the time with a reset.
          state.cuts++;
          if (state.cuts % 2 === 0) socket.resetAndDestroy();
          else socket.destroy();
          return;
        }
        served++;
        const idempotencyKey = /\r\nidempotency-key: *([^\r]+)/i.exec(head)?.[1];
        seen.push({ method: method!, path: path!, idempotencyKey });
        const head200 =
          'HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nKeep-Alive: timeout=60\r\n\r\n';
        socket.write(method === 'HEAD' ? head200 : `${head200}ok`);
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    get cuts() {
      return state.cuts;
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

describe('upstream keep-alive connections closed as a request goes out', { timeout: 60_000 }, () => {
  let upstream: Awaited<ReturnType<typeof startCuttingUpstream>>;
  let gatehouse: TestGatehouse;
  const agent = new http.Agent({ keepAlive: true, maxSockets: 32 });
  const call = (method: string, path: string, headers: Record<string, string> = {}, body?: string) =>
    request(gatehouse.url, path, { method, headers: { 'x-api-key': TEST_PLAIN_KEY, ...headers }, body, agent });

  before(async () => {
    upstream = await startCuttingUpstream();
    gatehouse = await startTestGatehouse(
      testConfig(upstream.url, { admin: { listen: { host: '127.0.0.1', port: 0 } }, log: { level: 'warn' } }),
    );
  });
  after(async () => {
    agent.destroy();
    await gatehouse?.close(0);
    await upstream?.close();
  });

  it('GET, HEAD, PUT and DELETE without a body are sent again on a new connection: every one answered, each seen once', async () => {
    const statuses: number[] = [];
    for (let i = 0; i < 12; i++) {
      const method = ['GET', 'HEAD', 'PUT', 'DELETE'][i % 4]!;
      statuses.push((await call(method, `/api/idempotent/${i}`)).status);
    }
    assert.deepEqual(statuses, Array(12).fill(200));
    // Each cut connection's request went out again on a connection of its own; the next one opens a new one.
    assert.ok(upstream.cuts >= 5, `the upstream cut ${upstream.cuts} reused connections`);
    for (let i = 0; i < 12; i++)
      assert.equal(upstream.seen.filter((s) => s.path === `/api/idempotent/${i}`).length, 1, `request ${i}`);
    const metrics = await request(gatehouse.admin!.url, '/metrics');
    const retried = Number(/^gatehouse_upstream_retries_total\{route="\/api\/"\} (\d+)$/m.exec(metrics.body)?.[1]);
    assert.equal(retried, upstream.cuts, 'gatehouse_upstream_retries_total counts each request sent again');
  });

  it('a POST is not sent twice: 502 when its connection was cut, never seen by the upstream; with an Idempotency-Key and no body it is resent', async () => {
    // Make sure the next request reuses a connection: one GET first leaves an idle one.
    assert.equal((await call('GET', '/api/warm')).status, 200);
    const post = await call('POST', '/api/orders/1', { 'content-type': 'text/plain' }, 'x');
    assert.equal(post.status, 502);
    assert.equal(post.json().error.code, 'upstream_unreachable');
    assert.equal(upstream.seen.filter((s) => s.path === '/api/orders/1').length, 0);

    assert.equal((await call('GET', '/api/warm')).status, 200);
    const bare = await call('POST', '/api/orders/2');
    assert.equal(bare.status, 502, 'a POST without a key is not idempotent, body or not');

    assert.equal((await call('GET', '/api/warm')).status, 200);
    const keyed = await call('POST', '/api/orders/3', { 'idempotency-key': 'order-3' });
    assert.equal(keyed.status, 200);
    assert.equal(upstream.seen.filter((s) => s.path === '/api/orders/3').length, 1);
  });

  it('an answer begun is not sent again, nor a request with an empty or a doubled Idempotency-Key', async () => {
    assert.equal((await call('GET', '/api/warm')).status, 200);
    const begun = await call('GET', '/api/answered/1');
    assert.equal(begun.status, 502);
    assert.equal(upstream.seen.filter((s) => s.path === '/api/answered/1').length, 1, 'sent twice');

    assert.equal((await call('GET', '/api/warm')).status, 200);
    assert.equal((await call('POST', '/api/orders/empty-key', { 'idempotency-key': ' ' })).status, 502);
    assert.equal((await call('GET', '/api/warm')).status, 200);
    const doubled = await request(gatehouse.url, '/api/orders/two-keys', {
      method: 'POST',
      headers: [
        ['x-api-key', TEST_PLAIN_KEY],
        ['idempotency-key', 'a'],
        ['idempotency-key', 'b'],
      ],
      agent,
    });
    assert.equal(doubled.status, 502);
    for (const path of ['/api/orders/empty-key', '/api/orders/two-keys'])
      assert.equal(upstream.seen.filter((s) => s.path === path).length, 0, path);
  });

  it('under load: no 502 for a GET, no POST seen twice', async () => {
    const replies = await Promise.all(
      Array.from({ length: 300 }, async (_, i) => {
        const method = i % 3 === 0 ? 'POST' : 'GET';
        const reply = await call(method, `/api/load/${i}`, {}, method === 'POST' ? 'body' : undefined);
        return { method, status: reply.status, i };
      }),
    );
    const gets = replies.filter((r) => r.method === 'GET');
    assert.deepEqual(
      gets.filter((r) => r.status !== 200),
      [],
      'a GET was refused',
    );
    for (const r of replies) {
      const times = upstream.seen.filter((s) => s.path === `/api/load/${r.i}`).length;
      if (r.method === 'POST') {
        assert.ok(times <= 1, `POST ${r.i} seen ${times} times`);
        assert.equal(times, r.status === 200 ? 1 : 0, `POST ${r.i}: ${r.status} but seen ${times} times`);
      } else assert.equal(times, 1, `GET ${r.i} seen ${times} times`);
    }
  });
});
