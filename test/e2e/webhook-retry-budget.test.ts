import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { request } from '../helpers/http.js';
import { runCli, startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

const SECRET = 'retry-budget-secret-0123';
const BUDGET_MS = 4_000;
const MAX_BACKOFF_MS = 1_500;

/**
 * webhooks.delivery.retryFor: an event whose target stays down is retried up to acceptance +
 * retryFor, the last attempt at that deadline itself (a backoff drawn past it is cut to it), then
 * dead; no attempt count cuts it short (none is set).
 * A target's Retry-After is kept.
 */
describe('delivery retries: a time budget (retryFor), not an attempt count', () => {
  let dir: string;
  let target: RecordingServer;
  let server: ServerProcess;
  let hooks: string;
  let configFile: string;

  before(async () => {
    dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-retry-budget-'));
    target = await startRecordingUpstream((req, res) => {
      // /slow asks for 1 s between attempts; every answer is a 503 (the target is down).
      res.writeHead(503, req.url === '/slow' ? { 'retry-after': '1' } : {});
      res.end();
    });
    configFile = path.join(dir, 'gatehouse.json5');
    writeFileSync(
      configFile,
      `{
      storage: { path: ${JSON.stringify(path.join(dir, 'gatehouse.db'))} },
      gateway: { listen: { port: 0 }, upstream: { target: "${target.url}" }, auth: { apiKey: "retry-budget-key-0123456789abcdefghijklmn" } },
      webhooks: {
        enabled: true,
        listen: { port: 0 },
        endpoints: [
          { path: "/webhook/down", secret: "${SECRET}", action: "message" },
          { path: "/webhook/slow", secret: "${SECRET}", action: "agent" },
        ],
        targets: { message: { url: "${target.url}/down" }, agent: { url: "${target.url}/slow" } },
        delivery: { retryFor: "${BUDGET_MS / 1000}s", initialBackoffMs: 50, maxBackoffMs: ${MAX_BACKOFF_MS}, timeoutMs: 2000 },
      },
    }`,
    );
    server = startServerProcess(configFile);
    hooks = (await server.waitFor((l) => l.msg === 'webhook receiver listening')).url;
  });

  after(async () => {
    await server?.stop();
    await target?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const post = async (endpoint: string): Promise<string> => {
    const reply = await request(hooks, endpoint, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-webhook-secret': SECRET },
      body: '{"n":1}',
    });
    assert.equal(reply.status, 202, reply.body);
    return reply.json().id as string;
  };
  const show = async (id: string) => {
    const result = await runCli(['webhooks', 'deliveries', 'show', id, '--json', '--config', configFile]);
    assert.equal(result.code, 0, result.stderr);
    return JSON.parse(result.stdout) as {
      event: { status: string; receivedAt: string };
      attempts: { at: string; status: number | null }[];
    };
  };

  it('retried until the budget is spent, then dead: the last attempt at the deadline', async () => {
    const [down, slow] = [await post('/webhook/down'), await post('/webhook/slow')];
    await server.waitFor((l) => l.id === down && l.outcome === 'dead', BUDGET_MS + 20_000);
    await server.waitFor((l) => l.id === slow && l.outcome === 'dead', BUDGET_MS + 20_000);

    const shown = await show(down);
    assert.equal(shown.event.status, 'dead');
    const accepted = Date.parse(shown.event.receivedAt);
    const times = shown.attempts.map((a) => Date.parse(a.at) - accepted);
    assert.ok(shown.attempts.every((a) => a.status === 503));
    // The deadline itself is tried (the attack review saw events die up to maxBackoffMs early).
    assert.ok(times.at(-1)! >= BUDGET_MS - 5, `last attempt ${times.at(-1)} ms after acceptance`);
    assert.ok(
      times.slice(0, -1).every((t) => t < BUDGET_MS),
      `only the last attempt at or past the deadline: ${times}`,
    );
    assert.ok(times.at(-1)! <= BUDGET_MS + 2_000, `no attempt long after the budget: ${times.at(-1)} ms`);
    assert.ok(shown.attempts.length >= 6, `${shown.attempts.length} attempts`);
    assert.equal(target.received.filter((r) => r.url === '/down').length, shown.attempts.length);

    // Retry-After: 1 is kept (1 s apart, not the jittered 50-1500 ms backoff): 0, 1, 2, 3 s and the deadline.
    const slowShown = await show(slow);
    const slowTimes = slowShown.attempts.map((a) => Date.parse(a.at));
    for (let i = 1; i < slowTimes.length - 1; i++)
      assert.ok(
        slowTimes[i]! - slowTimes[i - 1]! >= 950,
        `attempts ${i} and ${i + 1} ${slowTimes[i]! - slowTimes[i - 1]!} ms apart`,
      );
    assert.ok(slowTimes.length >= 4 && slowTimes.length <= 6, `${slowTimes.length} attempts`);
  });
});
