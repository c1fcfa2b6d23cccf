import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { generateApiKey, hashApiKey } from '../../src/gateway/credentials/api-key.js';
import { request } from '../helpers/http.js';
import {
  parseTraceparent,
  SPAN_KIND,
  startFakeCollector,
  type CollectedSpan,
  type FakeCollector,
} from '../helpers/otlp-collector.js';
import { startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

const KEY = generateApiKey();
const TOKEN = 'tracing-admin-token-0123456789';
const CLIENT_TRACE = '0af7651916cd43dd8448eb211c80319c';
const CLIENT_SPAN = 'b7ad6b7169203331';
const CLIENT_TRACEPARENT = `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01`;
/** Exports every 100 ms (the batch processor's OTEL_BSP_SCHEDULE_DELAY), so a test waits little for its spans. */
const FAST_EXPORT = { OTEL_BSP_SCHEDULE_DELAY: '100' };

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-tracing-'));

async function startGatehouse(
  name: string,
  upstreamUrl: string,
  tracing: Record<string, unknown>,
  extra: Record<string, any> = {},
): Promise<{ process: ServerProcess; url: string; adminUrl?: string }> {
  const file = path.join(dir, `${name}.json5`);
  writeFileSync(
    file,
    JSON.stringify({
      storage: { path: path.join(dir, `${name}.db`) },
      log: { format: 'json' },
      gateway: {
        listen: { host: '127.0.0.1', port: 0 },
        upstream: { target: upstreamUrl, timeoutMs: 5000 },
        auth: { apiKeys: [{ id: 'ci-runner', hash: hashApiKey(KEY) }] },
        ...extra.gateway,
      },
      observability: { tracing },
      ...(extra.admin ? { admin: extra.admin } : {}),
      ...(extra.shutdown ? { shutdown: extra.shutdown } : {}),
    }),
  );
  const proc = startServerProcess(file, { env: { ...FAST_EXPORT, ...extra.env } });
  try {
    const listening = await proc.waitFor((l) => l.msg === 'gateway listening');
    const admin = extra.admin ? await proc.waitFor((l) => String(l.msg).startsWith('admin listener')) : undefined;
    return { process: proc, url: listening.url as string, adminUrl: admin?.url as string | undefined };
  } catch (err) {
    await proc.stop('SIGKILL');
    throw err;
  }
}

/** The spans of one trace, once `count` of them have arrived. */
async function traceOf(collector: FakeCollector, find: (s: CollectedSpan) => boolean, count: number) {
  const root = await waitFor(() => collector.spans.find(find), { what: 'the server span' });
  return waitFor(
    () => {
      const spans = collector.spans.filter((s) => s.traceId === root.traceId);
      return spans.length >= count && { root, spans };
    },
    { what: `${count} spans of trace ${root.traceId}` },
  );
}

describe('tracing /api/: spans, their parents, and the traceparent the upstream gets', () => {
  let collector: FakeCollector;
  let upstream: RecordingServer;
  let untrusted: Awaited<ReturnType<typeof startGatehouse>>;
  let trusted: Awaited<ReturnType<typeof startGatehouse>>;

  before(async () => {
    collector = await startFakeCollector();
    upstream = await startRecordingUpstream();
    const tracing = { endpoint: collector.url, serviceName: 'edge-under-test' };
    [untrusted, trusted] = await Promise.all([
      startGatehouse('untrusted', upstream.url, tracing),
      startGatehouse('trusted', upstream.url, tracing, { gateway: { trustProxy: ['127.0.0.1/32'] } }),
    ]);
  });

  after(async () => {
    await Promise.all([untrusted?.process.stop('SIGKILL'), trusted?.process.stop('SIGKILL')]);
    await Promise.all([collector?.close(), upstream?.close()]);
  });

  it("an untrusted client: a new trace (its traceparent a link only), server → authenticate + upstream, and the upstream gets the upstream span as its parent, never the client's traceparent", async () => {
    const reply = await request(untrusted.url, '/api/items?token=in-the-query', {
      headers: {
        'x-api-key': KEY,
        traceparent: CLIENT_TRACEPARENT,
        tracestate: 'client=1',
        baggage: 'user.id=evil',
        'x-request-id': 'untrusted-1',
      },
    });
    assert.equal(reply.status, 200);
    const { root: server, spans } = await traceOf(
      collector,
      (s) => s.kind === SPAN_KIND.server && s.attributes['gatehouse.request.id'] === 'untrusted-1',
      3,
    );
    assert.notEqual(server.traceId, CLIENT_TRACE);
    assert.equal(server.parentSpanId, '');
    // The client's ids only: its tracestate ('client=1') is not exported with the link.
    assert.deepEqual(server.links, [{ traceId: CLIENT_TRACE, spanId: CLIENT_SPAN, traceState: '' }]);
    assert.equal(server.name, 'GET /api/');
    assert.equal(server.resource['service.name'], 'edge-under-test');
    assert.equal(server.attributes['http.route'], '/api/');
    assert.equal(server.attributes['http.response.status_code'], 200);
    assert.equal(server.attributes['gatehouse.auth'], 'api-key');
    assert.equal(server.attributes['enduser.id'], 'ci-runner');
    assert.equal(server.attributes['url.path'], '/api/items');

    const auth = spans.find((s) => s.name === 'authenticate')!;
    assert.equal(auth.parentSpanId, server.spanId);
    assert.equal(auth.kind, SPAN_KIND.internal);
    const call = spans.find((s) => s.kind === SPAN_KIND.client)!;
    assert.equal(call.parentSpanId, server.spanId);
    assert.equal(call.attributes['http.response.status_code'], 200);

    // Times on one clock (the start was epoch ms and the end Date.now(): a fast request's server span
    // ended before it began, and the SDK set its duration to 0): the server span holds its children.
    const [start, end] = [BigInt(server.startTimeUnixNano), BigInt(server.endTimeUnixNano)];
    assert.ok(end > start, `the server span lasts (${start} → ${end})`);
    for (const child of [auth, call]) {
      assert.ok(BigInt(child.startTimeUnixNano) >= start, `${child.name} starts inside the server span`);
      assert.ok(BigInt(child.endTimeUnixNano) <= end, `${child.name} ends inside the server span`);
    }

    const got = upstream.received.find((r) => r.headers['x-request-id'] === 'untrusted-1')!;
    const sent = parseTraceparent(got.headers.traceparent as string);
    assert.equal(sent.traceId, server.traceId);
    assert.equal(sent.parentId, call.spanId);
    assert.equal(sent.flags, '01');
    assert.equal(got.headers.tracestate, undefined, "the client's tracestate belongs to its own trace");
    assert.equal(
      got.headers.baggage,
      undefined,
      "nor is an untrusted client's baggage passed on (found by an outside attack)",
    );
    // What spans never carry: the key, and the query string.
    const exported = JSON.stringify(collector.spans);
    assert.ok(!exported.includes(KEY));
    assert.ok(!exported.includes('in-the-query'));
  });

  it('a trusted proxy: its trace is continued (server span a child of its span, tracestate kept) and passed on', async () => {
    const reply = await request(trusted.url, '/api/items', {
      headers: {
        'x-api-key': KEY,
        traceparent: CLIENT_TRACEPARENT,
        tracestate: 'proxy=1',
        baggage: 'tenant=acme',
        'x-request-id': 'trusted-1',
      },
    });
    assert.equal(reply.status, 200);
    const { root: server, spans } = await traceOf(
      collector,
      (s) => s.kind === SPAN_KIND.server && s.attributes['gatehouse.request.id'] === 'trusted-1',
      3,
    );
    assert.equal(server.traceId, CLIENT_TRACE);
    assert.equal(server.parentSpanId, CLIENT_SPAN);
    assert.deepEqual(server.links, []);
    const call = spans.find((s) => s.kind === SPAN_KIND.client)!;
    const got = upstream.received.find((r) => r.headers['x-request-id'] === 'trusted-1')!;
    const sent = parseTraceparent(got.headers.traceparent as string);
    assert.equal(sent.traceId, CLIENT_TRACE);
    assert.equal(sent.parentId, call.spanId);
    assert.equal(got.headers.tracestate, 'proxy=1');
    assert.equal(got.headers.baggage, 'tenant=acme');
  });

  it("a trusted proxy's tracestate with no valid member: no empty tracestate header goes upstream, sampled or not", async () => {
    for (const [flags, id] of [
      ['01', 'trusted-empty-state-sampled'],
      ['00', 'trusted-empty-state-unsampled'],
    ] as const) {
      const reply = await request(trusted.url, '/api/items', {
        headers: {
          'x-api-key': KEY,
          traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-${flags}`,
          // Upper case keys are invalid (W3C trace-context 3.3.1.3.1): the SDK drops the member.
          tracestate: 'Vendor=1',
          'x-request-id': id,
        },
      });
      assert.equal(reply.status, 200);
      const got = upstream.received.find((r) => r.headers['x-request-id'] === id)!;
      assert.equal(parseTraceparent(got.headers.traceparent as string).flags, flags);
      assert.equal(got.headers.tracestate, undefined, `${id}: ${JSON.stringify(got.headers)}`);
    }
  });

  it('a refused request: the server span says why (4xx is not a span error), the authenticate span failed, nothing reached the upstream', async () => {
    const before = upstream.received.length;
    const reply = await request(untrusted.url, '/api/items', {
      headers: { 'x-api-key': 'wrong-key-0123456789abcdefghijklmnopqrst', 'x-request-id': 'refused-1' },
    });
    assert.equal(reply.status, 401);
    const { root: server, spans } = await traceOf(
      collector,
      (s) => s.kind === SPAN_KIND.server && s.attributes['gatehouse.request.id'] === 'refused-1',
      2,
    );
    assert.equal(server.attributes['gatehouse.error.code'], 'invalid_api_key');
    assert.equal(server.attributes['http.response.status_code'], 401);
    assert.equal(server.status.code ?? 0, 0);
    const auth = spans.find((s) => s.name === 'authenticate')!;
    assert.equal(auth.attributes['error.type'], 'invalid_api_key');
    assert.equal(spans.filter((s) => s.kind === SPAN_KIND.client).length, 0);
    assert.equal(upstream.received.length, before);

    // A path is the client's to choose: its attribute is cut to 1,024 characters (12 KB ones were exported whole).
    const long = `/api/${'x'.repeat(12_000)}`;
    assert.equal((await request(untrusted.url, long, { headers: { 'x-request-id': 'long-path-1' } })).status, 401);
    const { root: longOne } = await traceOf(
      collector,
      (s) => s.kind === SPAN_KIND.server && s.attributes['gatehouse.request.id'] === 'long-path-1',
      1,
    );
    assert.equal(longOne.attributes['url.path'], long.slice(0, 1024));
  });
});

describe('tracing /api/: sampling', () => {
  let collector: FakeCollector;
  /** The ratio-0 instance's alone: it must receive nothing. */
  let quiet: FakeCollector;
  let upstream: RecordingServer;
  let none: Awaited<ReturnType<typeof startGatehouse>>;
  let all: Awaited<ReturnType<typeof startGatehouse>>;
  let noneBehindProxy: Awaited<ReturnType<typeof startGatehouse>>;

  before(async () => {
    [collector, quiet] = await Promise.all([startFakeCollector(), startFakeCollector()]);
    upstream = await startRecordingUpstream();
    const proxied = { gateway: { trustProxy: ['127.0.0.1/32'] } };
    [none, all, noneBehindProxy] = await Promise.all([
      startGatehouse('ratio-0', upstream.url, { endpoint: quiet.url, sampleRatio: 0 }),
      startGatehouse('ratio-1-proxied', upstream.url, { endpoint: collector.url, sampleRatio: 1 }, proxied),
      startGatehouse('ratio-0-proxied', upstream.url, { endpoint: collector.url, sampleRatio: 0 }, proxied),
    ]);
  });

  after(async () => {
    await Promise.all([all?.process.stop('SIGKILL'), noneBehindProxy?.process.stop('SIGKILL')]);
    await none?.process.stop('SIGKILL');
    await Promise.all([collector?.close(), quiet?.close(), upstream?.close()]);
  });

  it("a trusted proxy's unsampled trace (flags 00) stays unsampled at ratio 1: continued to the upstream (new parent id, tracestate kept), nothing recorded", async () => {
    const unsampled = `00-${CLIENT_TRACE}-${CLIENT_SPAN}-00`;
    const reply = await request(all.url, '/api/items', {
      headers: { 'x-api-key': KEY, traceparent: unsampled, tracestate: 'proxy=1', 'x-request-id': 'parent-off-1' },
    });
    assert.equal(reply.status, 200);
    const got = upstream.received.find((r) => r.headers['x-request-id'] === 'parent-off-1')!;
    const sent = parseTraceparent(got.headers.traceparent as string);
    assert.equal(sent.traceId, CLIENT_TRACE);
    assert.notEqual(sent.parentId, CLIENT_SPAN);
    assert.match(sent.parentId, /^(?!0{16})[0-9a-f]{16}$/);
    assert.equal(sent.flags, '00');
    assert.equal(got.headers.tracestate, 'proxy=1');
    // The explicit signal: a sampled request sent after it is exported; the unsampled one never was.
    await request(all.url, '/api/items', { headers: { 'x-api-key': KEY, 'x-request-id': 'parent-off-2' } });
    await traceOf(collector, (s) => s.attributes['gatehouse.request.id'] === 'parent-off-2', 3);
    assert.equal(collector.spans.filter((s) => s.traceId === CLIENT_TRACE).length, 0);
  });

  it("a trusted proxy's sampled trace (flags 01) is recorded at ratio 0 (parent-based), three spans in its trace", async () => {
    const reply = await request(noneBehindProxy.url, '/api/items', {
      headers: { 'x-api-key': KEY, traceparent: CLIENT_TRACEPARENT, 'x-request-id': 'parent-on-1' },
    });
    assert.equal(reply.status, 200);
    const { root: server, spans } = await traceOf(
      collector,
      (s) => s.kind === SPAN_KIND.server && s.attributes['gatehouse.request.id'] === 'parent-on-1',
      3,
    );
    assert.equal(server.traceId, CLIENT_TRACE);
    assert.equal(server.parentSpanId, CLIENT_SPAN);
    const call = spans.find((s) => s.kind === SPAN_KIND.client)!;
    const got = upstream.received.find((r) => r.headers['x-request-id'] === 'parent-on-1')!;
    assert.deepEqual(parseTraceparent(got.headers.traceparent as string), {
      traceId: CLIENT_TRACE,
      parentId: call.spanId,
      flags: '01',
    });
    // A trusted proxy's traceparent that does not parse: a new trace, decided by the ratio (0: not sampled).
    await request(noneBehindProxy.url, '/api/items', {
      headers: {
        'x-api-key': KEY,
        traceparent: `00-${CLIENT_TRACE}-${CLIENT_SPAN}-01-extra`,
        'x-request-id': 'parent-bad-1',
      },
    });
    const bad = upstream.received.find((r) => r.headers['x-request-id'] === 'parent-bad-1')!;
    const fresh = parseTraceparent(bad.headers.traceparent as string);
    assert.notEqual(fresh.traceId, CLIENT_TRACE);
    assert.equal(fresh.flags, '00');
  });

  it('sampleRatio 0: the upstream still gets a fresh traceparent, flagged not sampled (00), and nothing is exported, even at the flush of a stop', async () => {
    for (let i = 0; i < 20; i++) {
      const reply = await request(none.url, '/api/items', {
        headers: { 'x-api-key': KEY, traceparent: CLIENT_TRACEPARENT, 'x-request-id': `unsampled-${i}` },
      });
      assert.equal(reply.status, 200);
    }
    const sent = upstream.received
      .filter((r) => String(r.headers['x-request-id']).startsWith('unsampled-'))
      .map((r) => parseTraceparent(r.headers.traceparent as string));
    assert.equal(sent.length, 20);
    for (const { traceId, flags } of sent) {
      assert.equal(flags, '00');
      assert.notEqual(traceId, CLIENT_TRACE);
    }
    assert.equal(new Set(sent.map((s) => s.traceId)).size, 20, 'a trace per request');
    // The stop flushes whatever is queued (SHUTDOWN_FLUSH_MS): the explicit signal that nothing was.
    assert.equal(await none.process.stop(), 0);
    assert.equal(quiet.requests, 0);
  });
});

describe('tracing /api/: the batch settings from the environment', () => {
  it('OTEL_BSP_MAX_EXPORT_BATCH_SIZE is honoured: a full batch of 2 is exported at once, long before a 60 s OTEL_BSP_SCHEDULE_DELAY', async () => {
    const collector = await startFakeCollector();
    const upstream = await startRecordingUpstream();
    const env = { OTEL_BSP_SCHEDULE_DELAY: '60000', OTEL_BSP_MAX_EXPORT_BATCH_SIZE: '2' };
    const edge = await startGatehouse('batch-of-2', upstream.url, { endpoint: collector.url }, { env });
    try {
      const reply = await request(edge.url, '/api/items', { headers: { 'x-api-key': KEY } });
      assert.equal(reply.status, 200);
      // Three spans: the first two (authenticate, then the upstream call) fill a batch.
      await waitFor(() => collector.requests >= 1, { what: 'the first batch' });
      assert.deepEqual(collector.spans.map((s) => s.name).sort(), ['GET', 'authenticate']);
    } finally {
      await edge.process.stop('SIGKILL');
      await Promise.all([collector.close(), upstream.close()]);
    }
  });
});

describe('tracing /api/: a collector that does not answer, or is not there', () => {
  let upstream: RecordingServer;
  let stuck: FakeCollector;
  const auth = { authorization: `Bearer ${TOKEN}` };

  before(async () => {
    upstream = await startRecordingUpstream();
    stuck = await startFakeCollector({ hang: true });
  });

  after(async () => {
    await Promise.all([upstream?.close(), stuck?.close()]);
  });

  async function dropped(adminUrl: string, reason: string): Promise<number> {
    const metrics = await request(adminUrl, '/metrics', { headers: auth });
    const line = metrics.body
      .split('\n')
      .find((l) => l.startsWith(`gatehouse_trace_spans_dropped_total{reason="${reason}"}`));
    return Number(line?.split(' ')[1] ?? NaN);
  }

  it('an export that hangs: requests go on answering at once, spans past maxQueueSize are dropped and counted', async () => {
    const edge = await startGatehouse(
      'stuck',
      upstream.url,
      { endpoint: stuck.url, maxQueueSize: 8 },
      { admin: { listen: { host: '127.0.0.1', port: 0 }, token: TOKEN } },
    );
    try {
      assert.equal(await dropped(edge.adminUrl!, 'queue_full'), 0, 'born at 0');
      const first = await request(edge.url, '/api/items', { headers: { 'x-api-key': KEY } });
      assert.equal(first.status, 200);
      // The exporter has sent its batch and waits for an answer that never comes (10 s timeout).
      await waitFor(() => stuck.requests >= 1, { what: 'an export to the stuck collector' });
      const started = performance.now();
      for (let i = 0; i < 60; i++) {
        const reply = await request(edge.url, '/api/items', { headers: { 'x-api-key': KEY } });
        assert.equal(reply.status, 200);
      }
      const elapsed = performance.now() - started;
      // 60 requests while the export hangs: they do not wait for it (each would take its 10 s timeout).
      assert.ok(elapsed < 5_000, `60 requests took ${Math.round(elapsed)} ms`);
      const queueFull = await dropped(edge.adminUrl!, 'queue_full');
      // 3 spans a request, at most 8 held: at least 61 × 3 − 8 dropped.
      assert.ok(queueFull >= 61 * 3 - 8, `dropped ${queueFull}`);
    } finally {
      await edge.process.stop('SIGKILL');
    }
  });

  it('a collector that trickles its answer forever: the export is cut at its deadline, counted failed, and spans flow again once the collector is well', async () => {
    const trickling = await startFakeCollector();
    trickling.trickle = true;
    const edge = await startGatehouse(
      'trickle',
      upstream.url,
      { endpoint: trickling.url, maxQueueSize: 8 },
      { admin: { listen: { host: '127.0.0.1', port: 0 }, token: TOKEN } },
    );
    try {
      const first = await request(edge.url, '/api/items', { headers: { 'x-api-key': KEY } });
      assert.equal(first.status, 200);
      await waitFor(() => trickling.requests >= 1, { what: 'an export to the trickling collector' });
      // A byte a second keeps the exporter's idle timeout from ever firing; the deadline (10 s + 1 s) cuts it.
      await waitFor(async () => (await dropped(edge.adminUrl!, 'export_failed')) >= 3, {
        timeoutMs: 20_000,
        intervalMs: 250,
        what: "the first batch's three spans counted as failed",
      });
      trickling.trickle = false;
      const reply = await request(edge.url, '/api/items', {
        headers: { 'x-api-key': KEY, 'x-request-id': 'after-trickle' },
      });
      assert.equal(reply.status, 200);
      // Before the deadline, the stuck export's spans stayed counted against maxQueueSize: nothing was exported again.
      await waitFor(() => trickling.spans.some((s) => s.attributes['gatehouse.request.id'] === 'after-trickle'), {
        timeoutMs: 10_000,
        what: "the next request's spans at the collector",
      });
    } finally {
      await edge.process.stop('SIGKILL');
      await trickling.close();
    }
  });

  it('a stop while an export hangs: the process exits 0 once the flush wait is over, not at the shutdown deadline', async () => {
    const edge = await startGatehouse(
      'stuck-stop',
      upstream.url,
      { endpoint: stuck.url },
      { shutdown: { acceptGrace: 0, timeout: '2s' } },
    );
    let code: number | null;
    let took: number;
    try {
      const exportsBefore = stuck.requests;
      const reply = await request(edge.url, '/api/items', { headers: { 'x-api-key': KEY } });
      assert.equal(reply.status, 200);
      await waitFor(() => stuck.requests > exportsBefore, { what: 'an export to the stuck collector' });
      const started = performance.now();
      code = await edge.process.stop('SIGTERM');
      took = performance.now() - started;
    } finally {
      await edge.process.stop('SIGKILL');
    }
    // The shutdown deadline here is acceptGrace + 2 × timeout + 3 s = 7 s (exit 1); the flush gives exports 2 s.
    assert.equal(code, 0, edge.process.lines.map((l) => l.msg).join(' | '));
    assert.ok(took < 5_000, `exited ${Math.round(took)} ms after SIGTERM`);
  });

  it('a collector whose port is closed: requests answer, failed exports are counted, and logged once, not per batch', async () => {
    const closedPort = await new Promise<number>((resolve) => {
      const probe = http.createServer().listen(0, '127.0.0.1', () => {
        const { port } = probe.address() as AddressInfo;
        probe.close(() => resolve(port));
      });
    });
    const edge = await startGatehouse(
      'no-collector',
      upstream.url,
      { endpoint: `http://127.0.0.1:${closedPort}` },
      { admin: { listen: { host: '127.0.0.1', port: 0 }, token: TOKEN } },
    );
    try {
      // Batches of spans, each export refused, until two have failed.
      await waitFor(
        async () => {
          const reply = await request(edge.url, '/api/items', { headers: { 'x-api-key': KEY } });
          assert.equal(reply.status, 200);
          return (await dropped(edge.adminUrl!, 'export_failed')) >= 6;
        },
        { timeoutMs: 45_000, intervalMs: 200, what: 'two failed exports counted' },
      );
      const warnings = edge.process.lines.filter((l) => String(l.msg).startsWith('trace export failed'));
      assert.equal(warnings.length, 1, JSON.stringify(warnings));
      assert.match(warnings[0]!.problem, /ECONNREFUSED/);
    } finally {
      await edge.process.stop('SIGKILL');
    }
  });
});
