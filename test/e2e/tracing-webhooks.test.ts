import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { request } from '../helpers/http.js';
import { postWebhook } from '../helpers/instances.js';
import {
  parseTraceparent,
  SPAN_KIND,
  startFakeCollector,
  STATUS_ERROR,
  type FakeCollector,
} from '../helpers/otlp-collector.js';
import { startServerProcess, type ServerProcess } from '../helpers/process.js';
import { waitFor } from '../helpers/wait.js';

const SECRET = 'tracing-hook-secret-0123456789';
const SENDER_TRACEPARENT = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';

/**
 * A webhook event's trace outlives the process that received it: its traceparent is stored with
 * the event, and each delivery attempt, on whichever instance and however late, is a child of the
 * receive span. Here instance A receives while the target is down and stops; instance B, on the
 * same SQLite file, delivers once the target is up.
 */
describe('tracing webhooks: receive on one instance, deliver on another after a restart, one trace', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-tracing-hooks-'));
  let collector: FakeCollector;
  let targetPort: number;
  let target: http.Server | undefined;
  const targetGot: http.IncomingHttpHeaders[] = [];
  let a: ServerProcess | undefined;
  let b: ServerProcess | undefined;

  function configFile(name: string): string {
    const file = path.join(dir, `${name}.json5`);
    writeFileSync(
      file,
      JSON.stringify({
        storage: { path: path.join(dir, 'shared.db') },
        log: { format: 'json' },
        gateway: { listen: { host: '127.0.0.1', port: 0 }, upstream: { target: 'http://127.0.0.1:9' } },
        webhooks: {
          enabled: true,
          listen: { host: '127.0.0.1', port: 0 },
          endpoints: [{ path: '/webhook/deploys', secret: SECRET, action: 'system-event' }],
          targets: {
            'system-event': { url: `http://127.0.0.1:${targetPort}/events/T0PATHSECRET?token=target-query-secret` },
          },
          delivery: { initialBackoffMs: 50, maxBackoffMs: 200, timeoutMs: 2000 },
        },
        observability: { tracing: { endpoint: collector.url, serviceName: `instance-${name}` } },
      }),
    );
    return file;
  }

  async function start(name: string): Promise<{ process: ServerProcess; hooks: string }> {
    const proc = startServerProcess(configFile(name), { env: { OTEL_BSP_SCHEDULE_DELAY: '100' } });
    const listening = await proc.waitFor((l) => l.msg === 'webhook receiver listening');
    return { process: proc, hooks: listening.url as string };
  }

  before(async () => {
    collector = await startFakeCollector();
    // A port for the target, closed until instance B runs: A's attempts are refused.
    targetPort = await new Promise<number>((resolve) => {
      const probe = http.createServer().listen(0, '127.0.0.1', () => {
        const { port } = probe.address() as AddressInfo;
        probe.close(() => resolve(port));
      });
    });
  });

  after(async () => {
    await Promise.all([a?.stop('SIGKILL'), b?.stop('SIGKILL')]);
    target?.closeAllConnections();
    await new Promise((resolve) => (target ? target.close(resolve) : resolve(undefined)));
    await collector?.close();
  });

  it("A's receive span and failed attempts, then B's delivery: all one trace, every attempt a child of the receive span, and the target gets B's attempt as its parent", async () => {
    const instanceA = await start('a');
    a = instanceA.process;
    const accepted = await postWebhook(instanceA.hooks, '/webhook/deploys', SECRET, { deploy: 42 });
    assert.equal(accepted.status, 202, accepted.body);
    const eventId = accepted.json().id as string;
    // The sender is no trusted proxy: its traceparent would only be a link (see tracing-gateway).
    const receive = await waitFor(
      () => collector.spans.find((s) => s.kind === SPAN_KIND.server && s.attributes['gatehouse.event.id'] === eventId),
      { what: 'the receive span' },
    );
    assert.equal(receive.name, 'POST /webhook/deploys');
    assert.equal(receive.attributes['gatehouse.webhook.outcome'], 'accepted');
    assert.equal(receive.attributes['http.response.status_code'], 202);
    const failedOnA = await waitFor(
      () =>
        collector.spans.find(
          (s) =>
            s.resource['service.name'] === 'instance-a' &&
            s.attributes['gatehouse.event.id'] === eventId &&
            s.kind === SPAN_KIND.client,
        ),
      { what: "an attempt of A's, refused by the closed target" },
    );
    assert.equal(failedOnA.traceId, receive.traceId);
    assert.equal(failedOnA.parentSpanId, receive.spanId);
    assert.equal(failedOnA.attributes['error.type'], 'ECONNREFUSED');
    assert.equal(failedOnA.status.code, STATUS_ERROR);
    assert.equal(failedOnA.attributes['gatehouse.delivery.outcome'], 'queued');
    assert.equal(await a.stop(), 0);

    target = http.createServer((req, res) => {
      targetGot.push(req.headers);
      req.resume();
      req.on('end', () => res.writeHead(204).end());
    });
    await new Promise<void>((resolve) => target!.listen(targetPort, '127.0.0.1', resolve));
    const instanceB = await start('b');
    b = instanceB.process;

    const delivered = await waitFor(
      () =>
        collector.spans.find(
          (s) =>
            s.resource['service.name'] === 'instance-b' &&
            s.attributes['gatehouse.event.id'] === eventId &&
            s.attributes['gatehouse.delivery.outcome'] === 'delivered',
        ),
      { timeoutMs: 30_000, what: "B's delivery span" },
    );
    assert.equal(delivered.traceId, receive.traceId);
    assert.equal(delivered.parentSpanId, receive.spanId);
    assert.equal(delivered.kind, SPAN_KIND.client);
    assert.equal(delivered.attributes['http.response.status_code'], 204);
    // The origin only: a target's path can hold its credential (Slack-style incoming webhook URLs).
    assert.equal(delivered.attributes['url.full'], `http://127.0.0.1:${targetPort}/`);
    assert.equal(delivered.attributes['server.port'], targetPort);
    assert.equal(targetGot.length, 1);
    const sent = parseTraceparent(targetGot[0]!.traceparent as string);
    assert.equal(sent.traceId, receive.traceId);
    assert.equal(sent.parentId, delivered.spanId);
    assert.equal(sent.flags, '01');
    assert.ok(!JSON.stringify(collector.spans).includes('target-query-secret'));
    assert.ok(!JSON.stringify(collector.spans).includes('T0PATHSECRET'));
    assert.ok(!JSON.stringify(collector.spans).includes(SECRET));
  });

  it("a sender's traceparent (no trusted proxy) does not choose the trace: a new one, the sender's context as a link", async () => {
    const accepted = await postWebhookWithTraceparent(
      (await b!.waitFor((l) => l.msg === 'webhook receiver listening')).url,
    );
    const eventId = accepted.id;
    const receive = await waitFor(
      () => collector.spans.find((s) => s.kind === SPAN_KIND.server && s.attributes['gatehouse.event.id'] === eventId),
      { what: 'the receive span' },
    );
    assert.notEqual(receive.traceId, SENDER_TRACEPARENT.split('-')[1]);
    assert.deepEqual(receive.links, [
      { traceId: SENDER_TRACEPARENT.split('-')[1], spanId: SENDER_TRACEPARENT.split('-')[2], traceState: '' },
    ]);
  });
});

async function postWebhookWithTraceparent(hooksUrl: string): Promise<{ id: string }> {
  const reply = await request(hooksUrl, '/webhook/deploys', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-webhook-secret': SECRET, traceparent: SENDER_TRACEPARENT },
    body: '{"deploy":43}',
  });
  assert.equal(reply.status, 202, reply.body);
  return reply.json() as { id: string };
}
