import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync } from 'node:fs';
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import JSON5 from 'json5';
// @ts-expect-error: the examples are plain JavaScript, run as they are by `npm start`
import { createActionTarget } from '../../examples/action-target.js';
// @ts-expect-error: plain JavaScript example
import { createInternalApi } from '../../examples/internal-api.js';
import { startTestGatehouse, type TestGatehouse } from '../helpers/gatehouse.js';
import { request } from '../helpers/http.js';
import { ROOT } from '../helpers/process.js';
import { waitFor } from '../helpers/wait.js';

/** The README's quick start, against the shipped gateway.json5 and the example services (ports moved to free ones). */
describe('demo: the README quick start works with the shipped config and examples', () => {
  const DEMO_KEY = 'gth_dDsatkKB0asvlA6FyJ8MdWf6PSrEtW8F1Tz39n';
  const actions: any[] = [];
  let api: Server;
  let target: Server;
  let gatehouse: TestGatehouse;

  before(async () => {
    api = createInternalApi().listen(0, '127.0.0.1');
    target = createActionTarget((delivery: unknown) => actions.push(delivery)).listen(0, '127.0.0.1');
    await Promise.all([api, target].map((s) => new Promise((r) => s.once('listening', r))));
    const port = (s: Server) => (s.address() as AddressInfo).port;
    const config = JSON5.parse(readFileSync(path.join(ROOT, 'gateway.json5'), 'utf8'));
    config.storage.path = path.join(mkdtempSync(path.join(tmpdir(), 'gatehouse-demo-')), 'demo.db');
    config.gateway.listen.port = 0;
    config.gateway.upstream.target = config.gateway.upstream.target.replace(
      '${DEMO_API_PORT:-3000}',
      String(port(api)),
    );
    config.webhooks.listen.port = 0;
    for (const t of Object.values(config.webhooks.targets) as { url: string }[])
      t.url = t.url.replace('${DEMO_TARGET_PORT:-4000}', String(port(target)));
    gatehouse = await startTestGatehouse(config);
  });
  after(async () => {
    await gatehouse.close();
    api.close();
    target.close();
  });

  it('401 without the key, 200 with the demo key, and the example API sees who called', async () => {
    assert.equal((await request(gatehouse.url, '/api/hello')).status, 401);
    const reply = await request(gatehouse.url, '/api/hello', { headers: { 'x-api-key': DEMO_KEY } });
    assert.equal(reply.status, 200);
    const seen = reply.json();
    assert.equal(seen.path, '/api/hello');
    assert.equal(seen.auth, 'api-key');
    assert.equal(seen.subject, 'demo');
  });

  it('the README webhook curl reaches the example target as a message action', async () => {
    const reply = await request(gatehouse.webhooks!.url, '/webhook/chat', {
      method: 'POST',
      headers: { 'x-webhook-secret': 'demo-chat-hook-secret-1', 'content-type': 'application/json' },
      body: '{"sender":{"name":"Ada"},"text":"hello"}',
    });
    assert.equal(reply.status, 202);
    const action = await waitFor(() => actions.find((a) => a.body?.id === reply.json().id), {
      timeoutMs: 5_000,
      what: 'the demo target to act on the message',
    });
    assert.equal(action.path, '/messages');
    assert.equal(action.action, 'message');
    assert.equal(action.body.message, 'New message from Ada: hello');
  });
});
