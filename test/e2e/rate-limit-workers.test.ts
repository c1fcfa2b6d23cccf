import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { request } from '../helpers/http.js';
import { startServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

// gateway.rateLimits under gateway.workers: 2, in a real process: each worker holds half of every
// bucket (README: rate limits across workers), and SIGHUP keeps the buckets of unchanged limits.

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-ratelimit-workers-'));
const KEY = 'ratelimit-key-0123456789abcdefghijklmnopqrstuv';

let upstream: RecordingServer;
before(async () => {
  upstream = await startRecordingUpstream();
});
after(() => upstream.close());

function writeConfig(file: string, limit: string, rules = ''): void {
  writeFileSync(
    file,
    `{ gateway: { listen: { port: 0 }, workers: 2, upstream: { target: "${upstream.url}" },
    rateLimits: [${limit}],
    auth: { apiKey: "${KEY}", rules: [${rules}] } } }`,
  );
}

/** `n` requests, each on a new connection (round robin: alternately to each worker); their statuses. */
async function burst(url: string, n: number, p = '/api/limited'): Promise<number[]> {
  const statuses: number[] = [];
  for (let i = 0; i < n; i++) statuses.push((await request(url, p, { headers: { 'x-api-key': KEY } })).status);
  return statuses;
}

describe('rate limits with gateway.workers: 2', () => {
  it('4 per hour in total across both workers; SIGHUP keeps the buckets of an unchanged limit and renews a changed one', async () => {
    const file = path.join(dir, 'limits.json5');
    writeConfig(file, '{ by: "key", requests: 4, per: "1h" }');
    const server = startServerProcess(file, { env: { NODE_CLUSTER_SCHED_POLICY: 'rr' } });
    try {
      const { url } = await server.waitFor((l) => l.msg === 'gateway workers listening');
      const before = upstream.received.length;
      const statuses = await burst(url, 8);
      assert.equal(statuses.filter((s) => s === 200).length, 4, `statuses: ${statuses.join(' ')}`);
      assert.equal(statuses.filter((s) => s === 429).length, 4, `statuses: ${statuses.join(' ')}`);
      assert.equal(upstream.received.length - before, 4, 'the upstream received only the allowed ones');
      // Both workers served some (request lines are flushed every 250 ms).
      await server.waitFor(
        () =>
          new Set(server.lines.filter((l) => l.msg === 'request' && l.status === 200).map((l) => l.worker)).size === 2,
      );

      // Same limit, a rule added: every worker keeps its (empty) buckets.
      writeConfig(file, '{ by: "key", requests: 4, per: "1h" }', '{ paths: ["/api/admin/**"], scopes: ["admin"] }');
      server.child.kill('SIGHUP');
      await server.waitFor((l) => l.msg === 'configuration reloaded');
      assert.deepEqual(await burst(url, 4), [429, 429, 429, 429]);
      const refused = await request(url, '/api/admin/x', { headers: { 'x-api-key': KEY } });
      assert.equal(refused.json().error.code, 'insufficient_scope', 'the new rule is in force (before the limit)');

      // The limit changed: fresh buckets, 6 in total.
      writeConfig(file, '{ by: "key", requests: 6, per: "1h" }');
      server.child.kill('SIGHUP');
      await server.waitFor(
        (l) =>
          l.msg === 'configuration reloaded' &&
          server.lines.filter((x) => x.msg === 'configuration reloaded').length === 2,
      );
      const renewed = await burst(url, 8);
      assert.equal(renewed.filter((s) => s === 200).length, 6, `statuses: ${renewed.join(' ')}`);
    } finally {
      await server.stop();
    }
  });
});
