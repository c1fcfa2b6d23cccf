/**
 * A channel's inbound event is traced like any webhook (issue #31: "Gmail and channels likewise"):
 * a receive span on `/webhook/channels/<name>`, stored with the event, and the delivery attempt
 * its child. A Slack (oauth) channel, since its inbound events need no login: v0-signed by the
 * local fake Slack, delivered to a real target, spans collected by a local OTLP/HTTP collector.
 */
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { SLACK_CLIENT, startFakeSlack, type FakeSlack } from '../helpers/fake-chat.js';
import { parseTraceparent, SPAN_KIND, startFakeCollector, type FakeCollector } from '../helpers/otlp-collector.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';
import {
  removeWorkspace,
  startGatehouse,
  workspace,
  writeConfig,
  type RunningGatehouse,
  type Workspace,
} from './helpers.js';

describe('tracing a channel: an inbound Slack event is delivered in its receive span’s trace', () => {
  let ws: Workspace;
  let fake: FakeSlack;
  let target: RecordingServer;
  let upstream: RecordingServer;
  let collector: FakeCollector;
  let gatehouse: RunningGatehouse | undefined;

  before(async () => {
    [fake, target, upstream, collector, ws] = await Promise.all([
      startFakeSlack(),
      startRecordingUpstream(),
      startRecordingUpstream(),
      startFakeCollector(),
      workspace('slack-tracing'),
    ]);
    const channel = {
      kind: 'oauth',
      platform: 'slack',
      clientId: SLACK_CLIENT.clientId,
      clientSecret: SLACK_CLIENT.clientSecret,
      signingSecret: SLACK_CLIENT.signingSecret,
      scopes: ['chat:write'],
      apiBaseUrl: `${fake.url}/api`,
      authorizeUrl: `${fake.url}/oauth/v2/authorize`,
      tokenUrl: `${fake.url}/api/oauth.v2.access`,
    };
    writeConfig(ws, { channels: { sl: channel }, targetUrl: target.url, upstreamUrl: upstream.url });
    const config = JSON.parse(readFileSync(ws.config, 'utf8'));
    config.observability = { tracing: { endpoint: collector.url, serviceName: 'gatehouse-channels' } };
    writeFileSync(ws.config, JSON.stringify(config));
    gatehouse = await startGatehouse(ws, { ...ws.env, OTEL_BSP_SCHEDULE_DELAY: '100' });
  });
  after(async () => {
    await gatehouse?.stop();
    await Promise.all([fake?.close(), target?.close(), upstream?.close(), collector?.close()]);
    removeWorkspace(ws);
  });

  it('the receive span on /webhook/channels/sl, the delivery its child, the target given the delivery span as parent', async () => {
    const event = {
      token: 'deprecated-verification-token',
      team_id: fake.team.id,
      api_app_id: SLACK_CLIENT.appId,
      type: 'event_callback',
      event_id: 'Ev0TRACED001',
      event_time: 1_700_000_000,
      event: { type: 'message', channel: 'C0FAKECHAN1', user: 'U0FAKEUSER1', text: 'traced', ts: '1700000000.000100' },
    };
    const reply = await fake.deliverEvent(
      `${gatehouse!.webhookUrl}/webhook/channels/sl`,
      event,
      SLACK_CLIENT.signingSecret,
    );
    assert.equal(reply.status, 202, reply.body);
    const eventId = (JSON.parse(reply.body) as { id: string }).id;
    const received = await waitFor(() => target.received.find((r) => JSON.parse(r.body).id === eventId), {
      what: 'the event delivered',
    });
    const receive = await waitFor(
      () => collector.spans.find((s) => s.kind === SPAN_KIND.server && s.attributes['gatehouse.event.id'] === eventId),
      { what: 'the receive span' },
    );
    assert.equal(receive.name, 'POST /webhook/channels/sl');
    assert.equal(receive.attributes['http.response.status_code'], 202);
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
    assert.equal(delivered.traceId, receive.traceId);
    assert.equal(delivered.parentSpanId, receive.spanId);
    const sent = parseTraceparent(received.headers.traceparent as string);
    assert.equal(sent.traceId, receive.traceId);
    assert.equal(sent.parentId, delivered.spanId);
    const exported = JSON.stringify(collector.spans);
    assert.ok(!exported.includes(SLACK_CLIENT.signingSecret), 'the signing secret is in no span');
    assert.ok(!/v0=[0-9a-f]{64}/.test(exported), 'the signature is in no span');
  });
});
