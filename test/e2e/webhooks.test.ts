import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Webhook } from 'standardwebhooks';
import { startTestGatehouse, testConfig, type TestGatehouse } from '../helpers/gatehouse.js';
import { request } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

const SECRET = 'deploy-hook-secret-0123456789';
const CHAT_SECRET = 'chat-hook-secret-0123456789';
const SIGNING_SECRET = 'whsec_' + Buffer.from('target-signing-key-0123456789abcdef').toString('base64');
const json = { 'content-type': 'application/json' };

function tempDb(): string {
  return path.join(mkdtempSync(path.join(tmpdir(), 'gatehouse-hooks-')), 'gatehouse.db');
}

function webhooksConfig(targetUrl: string, overrides: Record<string, any> = {}): Record<string, any> {
  return {
    storage: { path: tempDb() },
    webhooks: {
      enabled: true,
      listen: { host: '127.0.0.1', port: 0 },
      maxBodyBytes: 4096,
      bodyTimeoutMs: 500,
      endpoints: [
        { path: '/webhook/deploys', secret: SECRET, action: 'system-event' },
        {
          path: '/webhook/chat',
          secret: CHAT_SECRET,
          action: 'message',
          template: 'New message from {{sender.name}}: {{text}}',
        },
      ],
      targets: {
        'system-event': { url: `${targetUrl}/events` },
        message: { url: `${targetUrl}/messages`, secret: SIGNING_SECRET },
      },
      delivery: { maxAttempts: 3, initialBackoffMs: 20, maxBackoffMs: 100, timeoutMs: 2000, concurrency: 4 },
      ...overrides,
    },
  };
}

describe('webhook receiver: statuses, envelope and signature', () => {
  let upstream: RecordingServer;
  let target: RecordingServer;
  let gatehouse: TestGatehouse;
  let hooks: string;
  before(async () => {
    upstream = await startRecordingUpstream();
    target = await startRecordingUpstream();
    gatehouse = await startTestGatehouse(
      testConfig(upstream.url, { ...webhooksConfig(target.url), gateway: { auth: { failures: { max: 5 } } } }),
    );
    hooks = gatehouse.webhooks!.url;
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
    await target.close();
  });

  const post = (p: string, body: string, headers: Record<string, string> = {}, localAddress?: string) =>
    request(hooks, p, { method: 'POST', body, headers: { ...json, ...headers }, localAddress });

  it('GET /healthz is 200; the receiver runs on its own port', async () => {
    assert.notEqual(new URL(hooks).port, new URL(gatehouse.url).port);
    assert.equal((await request(hooks, '/healthz')).status, 200);
  });

  it('202 with an evt_ id once stored; the target gets the envelope with its headers', async () => {
    const body = '{"message":"deployed v2","build":{"id":7}}';
    const reply = await post('/webhook/deploys', body, { 'x-webhook-secret': SECRET });
    assert.equal(reply.status, 202);
    const { id, status } = reply.json();
    assert.match(id, /^evt_/);
    assert.equal(status, 'queued');
    const got = await waitFor(() => target.received.find((r) => r.body.includes(id)), { what: `${id} at the target` });
    assert.equal(got.url, '/events');
    assert.equal(got.method, 'POST');
    assert.equal(got.headers['idempotency-key'], id);
    assert.equal(got.headers['x-gatehouse-action'], 'system-event');
    assert.match(got.headers['user-agent']!, /^gatehouse\/\d+\.\d+\.\d+/);
    assert.equal(got.headers['webhook-signature'], undefined, 'no signing secret on this target');
    const envelope = JSON.parse(got.body);
    assert.deepEqual(Object.keys(envelope), ['id', 'action', 'endpoint', 'receivedAt', 'message', 'payload']);
    assert.equal(envelope.id, id);
    assert.equal(envelope.action, 'system-event');
    assert.equal(envelope.endpoint, '/webhook/deploys');
    assert.ok(!Number.isNaN(Date.parse(envelope.receivedAt)));
    assert.equal(envelope.message, 'deployed v2');
    assert.deepEqual(envelope.payload, JSON.parse(body));
    assert.ok(got.body.includes(`"payload":${body}`), 'payload is the sender body, byte for byte');
  });

  it('message action: template rendered, Standard Webhooks signature verifies with the standardwebhooks package', async () => {
    const reply = await post('/webhook/chat', '{"sender":{"name":"Ada"},"text":"hi there"}', {
      'x-webhook-secret': CHAT_SECRET,
    });
    assert.equal(reply.status, 202);
    const { id } = reply.json();
    const got = await waitFor(() => target.received.find((r) => r.body.includes(id)), { what: `${id} at the target` });
    assert.equal(got.url, '/messages');
    assert.equal(JSON.parse(got.body).message, 'New message from Ada: hi there');
    assert.equal(got.headers['webhook-id'], id);
    const verified = new Webhook(SIGNING_SECRET).verify(got.body, got.headers as Record<string, string>) as {
      id: string;
    };
    assert.equal(verified.id, id);
    assert.throws(() =>
      new Webhook(SIGNING_SECRET).verify(got.body.replace('Ada', 'Eve'), got.headers as Record<string, string>),
    );
  });

  it('a repeated delivery id answers 200 with the original id and is delivered once', async () => {
    const firstIds: string[] = [];
    for (const header of ['idempotency-key', 'webhook-id', 'x-github-delivery']) {
      const headers = { 'x-webhook-secret': SECRET, [header]: `dup-${header}` };
      const first = await post('/webhook/deploys', '{"n":1}', headers);
      const second = await post('/webhook/deploys', '{"n":2}', headers);
      assert.equal(first.status, 202);
      assert.equal(second.status, 200);
      assert.equal(second.json().id, first.json().id);
      assert.equal(second.json().status, 'duplicate');
      firstIds.push(first.json().id);
    }
    for (const id of firstIds)
      await waitFor(() => target.received.find((r) => r.body.includes(id)), { what: `${id} at the target` });
    await deploysSettled(gatehouse);
    for (const id of firstIds) assert.equal(target.received.filter((r) => r.body.includes(id)).length, 1);
    assert.equal(target.received.filter((r) => r.body.includes('"n":2')).length, 0, 'the repeat is never delivered');
  });

  const rejections: [string, () => Promise<{ status: number; json(): any; headers: any }>, number, string][] = [
    ['unknown path', () => post('/webhook/nope', '{}', { 'x-webhook-secret': SECRET }), 404, 'not_found'],
    [
      'path with a trailing slash',
      () => post('/webhook/deploys/', '{}', { 'x-webhook-secret': SECRET }),
      404,
      'not_found',
    ],
    [
      'GET on an endpoint',
      () => request(hooks, '/webhook/deploys', { headers: { 'x-webhook-secret': SECRET } }),
      405,
      'method_not_allowed',
    ],
    ['missing secret', () => post('/webhook/deploys', '{"a":1}'), 401, 'invalid_webhook_secret'],
    [
      'wrong secret',
      () => post('/webhook/deploys', '{"a":1}', { 'x-webhook-secret': SECRET + 'x' }),
      401,
      'invalid_webhook_secret',
    ],
    [
      "another endpoint's secret",
      () => post('/webhook/deploys', '{"a":1}', { 'x-webhook-secret': CHAT_SECRET }),
      401,
      'invalid_webhook_secret',
    ],
    [
      'secret in the query string',
      () => post(`/webhook/deploys?secret=${SECRET}&x-webhook-secret=${SECRET}`, '{"a":1}'),
      401,
      'invalid_webhook_secret',
    ],
    [
      'text/plain body',
      () => post('/webhook/deploys', '{"a":1}', { 'x-webhook-secret': SECRET, 'content-type': 'text/plain' }),
      415,
      'unsupported_media_type',
    ],
    [
      'no content type',
      () =>
        request(hooks, '/webhook/deploys', {
          method: 'POST',
          body: '{"a":1}',
          headers: { 'x-webhook-secret': SECRET },
        }),
      415,
      'unsupported_media_type',
    ],
    ['invalid JSON', () => post('/webhook/deploys', '{"a":', { 'x-webhook-secret': SECRET }), 400, 'invalid_json'],
    ['a JSON array', () => post('/webhook/deploys', '[1,2]', { 'x-webhook-secret': SECRET }), 400, 'invalid_json'],
    ['a JSON string', () => post('/webhook/deploys', '"hi"', { 'x-webhook-secret': SECRET }), 400, 'invalid_json'],
    ['JSON null', () => post('/webhook/deploys', 'null', { 'x-webhook-secret': SECRET }), 400, 'invalid_json'],
    [
      'a body over maxBodyBytes',
      () => post('/webhook/deploys', JSON.stringify({ pad: 'x'.repeat(5000) }), { 'x-webhook-secret': SECRET }),
      413,
      'payload_too_large',
    ],
  ];
  for (const [name, send, status, code] of rejections) {
    it(`${name}: ${status} ${code}, nothing stored or delivered`, async () => {
      const stored = (await gatehouse.webhooks!.store.list({ limit: 1000 })).length;
      const delivered = target.received.length;
      const reply = await send();
      assert.equal(reply.status, status);
      assert.equal(reply.json().error.code, code);
      if (status === 405) assert.equal(reply.headers.allow, 'POST');
      await deploysSettled(gatehouse);
      assert.equal((await gatehouse.webhooks!.store.list({ limit: 1000 })).length, stored);
      assert.equal(target.received.length, delivered);
    });
  }

  it('application/cloudevents+json with a charset is JSON', async () => {
    const reply = await post('/webhook/deploys', '{"a":1}', {
      'x-webhook-secret': SECRET,
      'content-type': 'application/cloudevents+json; charset=utf-8',
    });
    assert.equal(reply.status, 202);
  });

  it('a chunked body over the limit gets 413 without being read to the end', async () => {
    const port = Number(new URL(hooks).port);
    const socket = net.connect(port, '127.0.0.1');
    let raw = '';
    socket.setEncoding('utf8');
    socket.on('data', (d: string) => (raw += d));
    const closed = new Promise((r) => socket.on('close', r));
    socket.write(
      `POST /webhook/deploys HTTP/1.1\r\nHost: x\r\nX-Webhook-Secret: ${SECRET}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`,
    );
    const chunk = 'x'.repeat(3000);
    socket.write(`${chunk.length.toString(16)}\r\n${chunk}\r\n`);
    socket.write(`${chunk.length.toString(16)}\r\n${chunk}\r\n`);
    // never send the terminating chunk: the server must answer anyway and close
    await closed;
    assert.match(raw, /^HTTP\/1\.1 413/);
    assert.match(raw, /payload_too_large/);
  });

  it('a body that does not finish arriving in time gets 408', async () => {
    const port = Number(new URL(hooks).port);
    const socket = net.connect(port, '127.0.0.1');
    let raw = '';
    socket.setEncoding('utf8');
    socket.on('data', (d: string) => (raw += d));
    const closed = new Promise((r) => socket.on('close', r));
    socket.write(
      `POST /webhook/deploys HTTP/1.1\r\nHost: x\r\nX-Webhook-Secret: ${SECRET}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a":`,
    );
    await closed;
    assert.match(raw, /^HTTP\/1\.1 408/);
    assert.match(raw, /request_timeout/);
  });

  it('wrong secrets lock the client IP out (429 + Retry-After), other IPs unaffected, lockout counters separate from /api/', async () => {
    for (let i = 0; i < 5; i++)
      assert.equal(
        (await post('/webhook/deploys', '{}', { 'x-webhook-secret': 'bad-secret-value-xx' }, '127.0.0.9')).status,
        401,
      );
    const locked = await post('/webhook/deploys', '{}', { 'x-webhook-secret': SECRET }, '127.0.0.9');
    assert.equal(locked.status, 429);
    assert.ok(Number(locked.headers['retry-after']) > 0);
    assert.equal((await post('/webhook/deploys', '{}', { 'x-webhook-secret': SECRET }, '127.0.0.10')).status, 202);
    // The gateway's own counters are separate: the same IP is not locked out of /api/.
    const api = await request(gatehouse.url, '/api/x', {
      headers: { 'x-api-key': 'test-plain-key-0123456789abcdefghijklmnop' },
      localAddress: '127.0.0.9',
    });
    assert.equal(api.status, 200);
  });

  it('the log never contains a webhook secret', () => {
    assert.ok(!gatehouse.logText().includes(SECRET));
    assert.ok(!gatehouse.logText().includes(CHAT_SECRET));
  });
});

describe('webhook receiver: store unavailable', () => {
  it('503 with Retry-After, never a 2xx, when the store cannot take the event', async () => {
    const target = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(testConfig(target.url, webhooksConfig(target.url)));
    try {
      await gatehouse.webhooks!.deliverer.stop(0);
      await gatehouse.webhooks!.store.close();
      const reply = await postDeployRaw(gatehouse);
      assert.equal(reply.status, 503);
      assert.equal(reply.json().error.code, 'store_unavailable');
      assert.equal(reply.headers['retry-after'], '5');
    } finally {
      await gatehouse.close().catch(() => {});
      await target.close();
    }
  });
});

describe('webhook delivery: retries, Retry-After, dead', () => {
  it('a target failing with 500 then recovering gets the event again; each attempt recorded', async () => {
    let failures = 2;
    const target = await startRecordingUpstream((_req, res) => {
      if (failures-- > 0) {
        res.writeHead(500);
        res.end();
      } else res.end('ok');
    });
    const gatehouse = await startTestGatehouse(testConfig(target.url, webhooksConfig(target.url)));
    try {
      const id = await postDeploy(gatehouse);
      const found = await pollStore(gatehouse, id, (e) => e.event.status === 'delivered');
      assert.deepEqual(
        found.attempts.map((a) => a.status),
        [500, 500, 200],
      );
      assert.equal(new Set(target.received.map((r) => r.headers['idempotency-key'])).size, 1);
    } finally {
      await gatehouse.close();
      await target.close();
    }
  });

  it('Retry-After from the target is honoured', async () => {
    let first = true;
    const target = await startRecordingUpstream((_req, res) => {
      if (first) {
        first = false;
        res.writeHead(429, { 'retry-after': '1' });
        res.end();
      } else res.end('ok');
    });
    const times: number[] = [];
    const gatehouse = await startTestGatehouse(
      testConfig(
        target.url,
        webhooksConfig(target.url, {
          delivery: { maxAttempts: 3, initialBackoffMs: 20, maxBackoffMs: 5000, timeoutMs: 2000, concurrency: 4 },
        }),
      ),
    );
    try {
      const id = await postDeploy(gatehouse);
      const found = await pollStore(gatehouse, id, (e) => e.event.status === 'delivered');
      times.push(...found.attempts.map((a) => a.at));
      assert.equal(found.attempts.length, 2);
      assert.ok(times[1]! - times[0]! >= 950, `second attempt after ${times[1]! - times[0]!} ms`);
    } finally {
      await gatehouse.close();
      await target.close();
    }
  });

  it('dead after maxAttempts of retryable failures; dead at once on a 4xx; retry requeues', async () => {
    let mode: 'fail' | 'reject' | 'ok' = 'fail';
    const target = await startRecordingUpstream((_req, res) => {
      res.writeHead(mode === 'fail' ? 503 : mode === 'reject' ? 422 : 200);
      res.end();
    });
    const gatehouse = await startTestGatehouse(testConfig(target.url, webhooksConfig(target.url)));
    const post = () => postDeploy(gatehouse);
    try {
      const retried = await post();
      const dead = await pollStore(gatehouse, retried, (e) => e.event.status === 'dead');
      assert.deepEqual(
        dead.attempts.map((a) => a.status),
        [503, 503, 503],
      );

      mode = 'reject';
      const rejected = await post();
      const deadAtOnce = await pollStore(gatehouse, rejected, (e) => e.event.status === 'dead');
      assert.deepEqual(
        deadAtOnce.attempts.map((a) => a.status),
        [422],
      );

      mode = 'ok';
      assert.equal(await gatehouse.webhooks!.store.requeue(retried, Date.now()), true);
      gatehouse.webhooks!.deliverer.notify();
      const delivered = await pollStore(gatehouse, retried, (e) => e.event.status === 'delivered');
      assert.deepEqual(
        delivered.attempts.map((a) => [a.attempt, a.status]),
        [
          [1, 503],
          [2, 503],
          [3, 503],
          [4, 200],
        ],
      );
    } finally {
      await gatehouse.close();
      await target.close();
    }
  });

  it('a target that does not answer in time is retried (timeout recorded)', async () => {
    let hang = true;
    const target = await startRecordingUpstream((_req, res) => {
      if (hang) hang = false;
      else res.end('ok');
    });
    const gatehouse = await startTestGatehouse(
      testConfig(
        target.url,
        webhooksConfig(target.url, {
          targets: {
            'system-event': { url: `${target.url}/events`, timeoutMs: 300 },
            message: { url: `${target.url}/messages` },
          },
        }),
      ),
    );
    try {
      const id = await postDeploy(gatehouse);
      const found = await pollStore(gatehouse, id, (e) => e.event.status === 'delivered');
      assert.equal(found.attempts[0]!.status, null);
      assert.match(found.attempts[0]!.error!, /timeout/);
      assert.equal(found.attempts[1]!.status, 200);
    } finally {
      await gatehouse.close();
      await target.close();
    }
  });
});

describe('webhook receiver disabled', () => {
  it('does not listen at all and says so in the log', async () => {
    const upstream = await startRecordingUpstream();
    const gatehouse = await startTestGatehouse(testConfig(upstream.url));
    try {
      assert.equal(gatehouse.webhooks, undefined);
      assert.ok(gatehouse.logs.some((l) => /webhook receiver off/.test(l.msg)));
    } finally {
      await gatehouse.close();
      await upstream.close();
    }
  });
});

/** A signed `{"a":1}` to the deploys endpoint. */
function postDeployRaw(gatehouse: TestGatehouse) {
  return request(gatehouse.webhooks!.url, '/webhook/deploys', {
    method: 'POST',
    body: '{"a":1}',
    headers: { ...json, 'x-webhook-secret': SECRET },
  });
}

/** The same, returning the stored event's id. */
async function postDeploy(gatehouse: TestGatehouse): Promise<string> {
  return (await postDeployRaw(gatehouse)).json().id;
}

/**
 * No /webhook/deploys event queued: one is stored before its request is answered and stays queued until
 * its delivery settles, after the target got it; so anything wrongly accepted by the requests answered
 * so far has reached the target by then (the explicit signal for a negative check on deliveries).
 */
function deploysSettled(gatehouse: TestGatehouse) {
  return waitFor(
    async () =>
      (await gatehouse.webhooks!.store.list({ status: 'queued', endpoint: '/webhook/deploys', limit: 1 })).length === 0,
    { what: 'no queued /webhook/deploys event' },
  );
}

/** The stored event `id` once `done` holds for it. */
async function pollStore(
  gatehouse: TestGatehouse,
  id: string,
  done: (e: NonNullable<Awaited<ReturnType<NonNullable<TestGatehouse['webhooks']>['store']['get']>>>) => boolean,
) {
  let found: Awaited<ReturnType<NonNullable<TestGatehouse['webhooks']>['store']['get']>>;
  return waitFor(
    async () => {
      found = await gatehouse.webhooks!.store.get(id);
      return found && done(found) ? found : undefined;
    },
    { what: () => `event ${id} to settle: ${JSON.stringify(found)}` },
  );
}
