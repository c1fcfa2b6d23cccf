/**
 * The Gmail push's trace reaches its emails' deliveries: the push's receive span is stored with
 * each email's event, and the delivery attempt is its child (issue #31: "Gmail and channels
 * likewise"). Real `gatehouse start`, the real `setup` against the local fake of Google, a local
 * OTLP/HTTP collector.
 */
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { startFakeGoogle, type FakeGoogle } from '../helpers/fake-google.js';
import { parseTraceparent, SPAN_KIND, startFakeCollector, type FakeCollector } from '../helpers/otlp-collector.js';
import { startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';
import {
  PUSH_SERVICE_ACCOUNT,
  runSetup,
  startPushRelay,
  webhooksWith,
  workspace,
  writeConfig,
  type PushRelay,
  type Workspace,
} from './helpers.js';

describe('tracing a Gmail push: the email event is delivered in the push’s trace', () => {
  let fake: FakeGoogle;
  let ws: Workspace;
  let target: RecordingServer;
  let relay: PushRelay;
  let collector: FakeCollector;
  let server: ServerProcess | undefined;

  before(async () => {
    fake = await startFakeGoogle({ timing: { pushMinBackoffMs: 50, pushMaxBackoffMs: 300, pushMaxAttempts: 60 } });
    target = await startRecordingUpstream();
    collector = await startFakeCollector();
    ws = workspace();
    relay = await startPushRelay(ws);
    const run = await runSetup(fake, ws, [
      '--credentials',
      ws.credentials,
      '--json',
      '--push-endpoint',
      `${relay.url}/webhook/gmail`,
      '--push-service-account',
      PUSH_SERVICE_ACCOUNT,
    ]);
    assert.equal(run.code, 0, run.stderr);
    writeConfig(ws, webhooksWith(JSON.parse(run.stdout).section, target.url));
    const config = JSON.parse(readFileSync(ws.config, 'utf8'));
    config.observability = { tracing: { endpoint: collector.url, serviceName: 'gatehouse-gmail' } };
    writeFileSync(ws.config, JSON.stringify(config));
    server = startServerProcess(ws.config, { env: { ...ws.env, OTEL_BSP_SCHEDULE_DELAY: '100' } });
    relay.forwardTo = (await server.waitFor((l) => l.msg === 'webhook receiver listening')).url;
    await server.waitFor((l) => l.msg === 'gmail integration running');
  });
  after(async () => {
    await server?.stop();
    await relay?.close();
    await target?.close();
    await collector?.close();
    await fake?.close();
  });

  it('the push gets a receive span; the email’s delivery span is its child, and the target gets that span as its parent', async () => {
    const mail = fake.addEmail({ from: 'bob@example.com', subject: 'Traced', text: 'hello' });
    const received = await waitFor(
      () => target.received.find((r) => (JSON.parse(r.body) as { payload: { id: string } }).payload.id === mail.id),
      { what: 'the email delivered' },
    );
    const eventId = (JSON.parse(received.body) as { id: string }).id;
    const delivered = await waitFor(
      () =>
        collector.spans.find(
          (s) =>
            s.kind === SPAN_KIND.client &&
            s.attributes['gatehouse.event.id'] === eventId &&
            s.attributes['gatehouse.delivery.outcome'] === 'delivered',
        ),
      { what: 'the delivery span' },
    );
    const receive = collector.spans.find((s) => s.spanId === delivered.parentSpanId);
    assert.ok(
      receive,
      `the delivery's parent span was exported: ${JSON.stringify(collector.spans.map((s) => s.name))}`,
    );
    assert.equal(receive.kind, SPAN_KIND.server);
    assert.equal(receive.name, 'POST /webhook/gmail');
    assert.equal(receive.traceId, delivered.traceId);
    assert.equal(receive.attributes['http.response.status_code'], 200);
    const sent = parseTraceparent(received.headers.traceparent as string);
    assert.equal(sent.traceId, receive.traceId);
    assert.equal(sent.parentId, delivered.spanId);
    // The push's OIDC token is a credential: it never reaches a span.
    const exported = JSON.stringify(collector.spans);
    assert.ok(!/eyJ[\w-]+\.eyJ/.test(exported), 'no JWT in any span');
  });
});
