import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { dir, HOOK_SECRET, KEY, scrape, start, TOKEN, WRONG_KEY, type Started } from '../helpers/admin.js';
import { request } from '../helpers/http.js';
import { runCli } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

// The labels operators slice by (issue 28), on a real scrape of a real `gatehouse start`: `route`
// (the configured prefix) and `code` (gatehouse's error code) on the request counter, `route` on
// the upstream histogram, gatehouse_build_info; with gateway.workers: 2 too, where the labels
// travel to the primary inside each worker's snapshot (src/runtime/workers).

const GUESSER = '203.0.113.9'; // the client that guesses keys, through the trusted proxy (127.0.0.1)

let main: RecordingServer;
let reports: RecordingServer;
let closedPort: number;

before(async () => {
  main = await startRecordingUpstream();
  reports = await startRecordingUpstream((req, res) => {
    // The upstream's own error: counted with the route and no gatehouse code.
    res.writeHead(req.url.includes('broken') ? 500 : 200, { 'content-type': 'application/json' });
    res.end('{}');
  });
  const gone = await startRecordingUpstream();
  closedPort = gone.port;
  await gone.close();
});
after(async () => {
  await Promise.all([main.close(), reports.close()]);
});

function writeLabelsConfig(name: string, workers: number): string {
  const file = path.join(dir, name);
  writeFileSync(
    file,
    `{
    gateway: { listen: { port: 0 }, workers: ${workers}, trustProxy: ["127.0.0.1"],
      upstream: { target: "${main.url}" },
      routes: [
        { prefix: "/api/reports/", upstream: { target: "${reports.url}" } },
        { prefix: "/api/down/", upstream: { target: "http://127.0.0.1:${closedPort}" } },
      ],
      rateLimits: [{ by: "key", requests: 2, per: "1h", paths: ["/api/limited/**"] }],
      auth: { apiKey: "${KEY}", failures: { max: 2, lockoutSeconds: 600 } } },
    webhooks: { enabled: true, listen: { port: 0 },
      endpoints: [{ path: "/webhook/deploys", secret: "${HOOK_SECRET}", action: "message" }],
      targets: { message: { url: "${main.url}/hook" } } },
    storage: { path: "${path.join(dir, name + '.db')}" },
    admin: { listen: { port: 0 }, token: "${TOKEN}" },
  }`,
  );
  return file;
}

/** Every series of `name` in a scrape, as label objects. */
function seriesOf(text: string, name: string): Record<string, string>[] {
  return text
    .split('\n')
    .filter((line) => line.startsWith(`${name}{`))
    .map((line) => {
      const labels: Record<string, string> = {};
      for (const [, key, value] of line.slice(name.length + 1, line.lastIndexOf('}')).matchAll(/(\w+)="([^"]*)"/g))
        labels[key!] = value!;
      return labels;
    });
}

for (const workers of [1, 2]) {
  describe(`metrics labels, gateway.workers: ${workers}`, () => {
    let s: Started;
    before(async () => {
      s = await start(writeLabelsConfig(`labels-${workers}.json5`, workers), { NODE_CLUSTER_SCHED_POLICY: 'rr' });
    });
    after(() => s.server.stop('SIGKILL'));

    it('route and code label the requests, route the upstream times; 429s of the rate limit and of the lockout are apart', async () => {
      const get = async (p: string, headers: Record<string, string> = { 'x-api-key': KEY }) =>
        (await request(s.gateway, p, { headers })).status;
      for (let i = 0; i < 3; i++) assert.equal(await get(`/api/items/${i}`), 200);
      for (let i = 0; i < 2; i++) assert.equal(await get(`/api/reports/r-${i}`), 200);
      assert.equal(await get('/api/reports/broken'), 500);
      assert.equal(await get('/api/down/x'), 502);
      // The rate limit (2 an hour on /api/limited/, shared out between the workers): 429 rate_limited.
      const limited: number[] = [];
      for (let i = 0; i < 8 && !limited.includes(429); i++) limited.push(await get(`/api/limited/${i}`));
      assert.equal(limited.at(-1), 429, `statuses ${limited.join(' ')}`);
      // A client guessing keys from another address: 401s, then 429 too_many_failures (it alone is locked out).
      const guesses: number[] = [];
      for (let i = 0; i < 6 && !guesses.includes(429); i++)
        guesses.push(await get('/api/items', { 'x-api-key': WRONG_KEY, 'x-forwarded-for': GUESSER }));
      assert.equal(guesses.at(-1), 429, `statuses ${guesses.join(' ')}`);
      const limitedOk = limited.filter((st) => st === 200).length;
      const guessed = guesses.length - 1;

      const expected: [string, number][] = [
        ['route="/api/",status="200",code="",auth="api-key"', 3 + limitedOk],
        ['route="/api/reports/",status="200",code="",auth="api-key"', 2],
        ['route="/api/reports/",status="500",code="",auth="api-key"', 1],
        ['route="/api/down/",status="502",code="upstream_unreachable",auth="api-key"', 1],
        // Refused before a route is chosen: route "".
        ['route="",status="429",code="rate_limited",auth="api-key"', 1],
        ['route="",status="401",code="invalid_api_key",auth="none"', guessed],
        ['route="",status="429",code="too_many_failures",auth="none"', 1],
      ];
      // Counted when each answer's connection closes: wait for the last one rather than guess.
      const series = (labels: string) => `gatehouse_http_requests_total{listener="gateway",${labels}}`;
      await waitFor(async () => (await scrape(s.admin)).value(series(expected.at(-1)![0])) === 1, {
        what: 'the lockout 429 counted',
      });
      const m = await scrape(s.admin);
      for (const [labels, count] of expected) assert.equal(m.value(series(labels)), count, labels);
      assert.equal(m.value('gatehouse_upstream_duration_seconds_count{route="/api/"}'), 3 + limitedOk);
      assert.equal(m.value('gatehouse_upstream_duration_seconds_count{route="/api/reports/"}'), 3);
      assert.equal(m.value('gatehouse_upstream_duration_seconds_count{route="/api/down/"}'), 1, 'the error is timed');
      assert.equal(m.value('gatehouse_upstream_duration_seconds_bucket{le="+Inf",route="/api/reports/"}'), 3);
      // One label set for every series of the counter (absent labels are ""), and one TYPE line: merged, not repeated.
      for (const labels of seriesOf(m.text, 'gatehouse_http_requests_total'))
        assert.deepEqual(Object.keys(labels), ['listener', 'route', 'status', 'code', 'auth']);
      assert.equal(m.text.split('\n').filter((l) => l === '# TYPE gatehouse_http_requests_total counter').length, 1);
      for (const leak of ['/api/items/', '/api/reports/r-', '/api/limited/', GUESSER, KEY, WRONG_KEY])
        assert.ok(!m.text.includes(leak), `metrics contain ${leak}`);
    });

    it('paths never seen before add no series: the labels are bounded by the config', async () => {
      const count = async () => seriesOf((await scrape(s.admin)).text, 'gatehouse_http_requests_total').length;
      const before = await count();
      for (let i = 0; i < 20; i++) {
        const p = i % 2 ? `/api/reports/new-${i}` : `/api/other-${i}/x?q=${i}`;
        assert.equal((await request(s.gateway, p, { headers: { 'x-api-key': KEY } })).status, 200);
      }
      assert.equal(await count(), before);
    });

    it('gatehouse_build_info is 1 with the version, Node, driver and schema that `gatehouse --version` reports', async () => {
      const version = await runCli(['--version']);
      assert.equal(version.code, 0, version.stderr);
      const [pkg, schemas] = version.stdout.trim().split('\n');
      const sqlite = /sqlite (\d+)/.exec(schemas!)?.[1];
      assert.ok(sqlite, version.stdout);
      const m = await scrape(s.admin);
      assert.deepEqual(seriesOf(m.text, 'gatehouse_build_info'), [
        { version: pkg!, node: process.version, storage_driver: 'sqlite', schema: sqlite },
      ]);
      assert.equal(
        m.value(
          `gatehouse_build_info{version="${pkg}",node="${process.version}",storage_driver="sqlite",schema="${sqlite}"}`,
        ),
        1,
        'one process reports it, however many workers',
      );
    });
  });
}
