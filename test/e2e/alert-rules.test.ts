import assert from 'node:assert/strict';
import { execFile, execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { promisify } from 'node:util';
import pg from 'pg';
import { auth, HOOK_SECRET, KEY, TOKEN, WRONG_KEY } from '../helpers/admin.js';
import { request } from '../helpers/http.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { ROOT, startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';
import { promtoolMissing } from '../helpers/promtool.js';

/*
 * examples/prometheus/alerts.yml against real scrapes (issue 28). Each alert's state is made real on
 * a running `gatehouse start` (lockouts by wrong keys, a rejected reload by a bad config and SIGHUP, a
 * certificate expiring in 3 days served after a reload, dead letters from a target that fails with
 * maxAttempts 1, 503s and a failing /readyz from a stopped PostgreSQL, the process killed), /metrics
 * is scraped before and in that state, and promtool's own evaluator (`promtool test rules`) runs the
 * shipped rule on those samples: each alert must stay silent on the healthy scrapes and fire, with
 * its labels and summary, on the state's.
 *
 * The scrapes become input series as Prometheus would store them: `job` and `instance` target
 * labels added, empty labels dropped, and `up` (1 when the scrape answered 200, else 0 with no
 * samples). /readyz is scraped as the blackbox exporter does (`probe_success`, 1 for a 2xx). Scrapes
 * are one minute apart in the series, and the last one is held for as long as a rule's `for` or
 * window needs (the state persisting). Two clocks are not real: a lag of 10 minutes is made by
 * moving the in-flight event's due time 10 minutes back in the database (waiting 5 real minutes is
 * no test), and the scrapes' minute spacing is the series', not the wall clock's.
 */

const RULES = path.join(ROOT, 'examples/prometheus/alerts.yml');
if (promtoolMissing) process.stderr.write(`\n!!! alert rule tests: ${promtoolMissing}: SKIPPED !!!\n\n`);

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-alerts-'));
after(() => rmSync(dir, { recursive: true, force: true }));

/** Series (as promtool reads them) → value, for one scrape. */
type Samples = Map<string, number>;

function seriesText(name: string, labels: Record<string, string>): string {
  const inner = Object.keys(labels)
    .sort()
    .map((k) => `${k}="${labels[k]}"`)
    .join(',');
  return `${name}{${inner}}`;
}

/** One scrape of /metrics as Prometheus stores it (job="gatehouse"); gatehouse's own series only. */
async function scrapeAsPrometheus(admin: string): Promise<Samples> {
  const instance = new URL(admin).host;
  const samples: Samples = new Map();
  let up = 0;
  try {
    const reply = await request(admin, '/metrics', { headers: auth });
    if (reply.status === 200) {
      up = 1;
      for (const line of reply.body.split('\n')) {
        const match = /^(gatehouse_\w+)(?:\{(.*)\})? (\S+)$/.exec(line);
        if (!match) continue;
        const value = Number(match[3]);
        if (!Number.isFinite(value)) continue;
        const labels: Record<string, string> = { job: 'gatehouse', instance };
        // Prometheus stores an empty label value as no label.
        for (const [, k, v] of (match[2] ?? '').matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) if (v !== '') labels[k!] = v!;
        samples.set(seriesText(match[1]!, labels), value);
      }
    }
  } catch {
    // Connection refused: `up` is 0 and there are no samples, as Prometheus records a failed scrape.
  }
  samples.set(seriesText('up', { job: 'gatehouse', instance }), up);
  return samples;
}

/** /metrics and /readyz at one moment: `probe_success` as the blackbox exporter reports it (job="gatehouse-ready"). */
async function observe(admin: string): Promise<Samples> {
  const samples = await scrapeAsPrometheus(admin);
  const status = await request(admin, '/readyz').then(
    (reply) => reply.status,
    () => 0,
  );
  const instance = new URL(admin).host;
  samples.set(seriesText('probe_success', { job: 'gatehouse-ready', instance }), status >= 200 && status < 300 ? 1 : 0);
  return samples;
}

/** The severity and summary a rule of alerts.yml gives its alerts (the file's own layout: one `- alert:` block each). */
function ruleOf(alert: string): { severity: string; summary: string } {
  const text = readFileSync(RULES, 'utf8');
  const start = text.indexOf(`- alert: ${alert}\n`);
  assert.ok(start >= 0, `${alert} is not in alerts.yml`);
  const next = text.indexOf('- alert:', start + 1);
  const block = text.slice(start, next === -1 ? undefined : next);
  return {
    severity: /\n\s+severity: (\S+)/.exec(block)![1]!,
    summary: JSON.parse(/\n\s+summary: (".*")\n/.exec(block)![1]!) as string,
  };
}

/** The summary as Prometheus renders it for an alert with these labels; a label the alert lacks fails here. */
function render(summary: string, labels: Record<string, string>): string {
  const rendered = summary.replace(/\{\{ \$labels\.(\w+) \}\}/g, (_, name: string) => {
    assert.ok(name in labels, `the summary uses $labels.${name}, which the alert does not carry`);
    return labels[name]!;
  });
  assert.ok(!rendered.includes('{{'), `a template this test does not render: ${summary}`);
  return rendered;
}

interface AlertCase {
  alert: string;
  /** Scrapes one minute apart. */
  timeline: Samples[];
  /** How many more minutes the last scrape holds (a rule's `for` and window). */
  hold: number;
  /** The labels it must fire with at the last minute; undefined: it must not fire. */
  fires: Record<string, string> | undefined;
}

/** One promtool unit test group: the timeline's series, the alert evaluated at its last minute. */
function promtoolTest({ alert, timeline, hold, fires }: AlertCase) {
  const frames = [...timeline, ...Array<Samples>(hold).fill(timeline.at(-1)!)];
  const series = [...new Set(frames.flatMap((frame) => [...frame.keys()]))];
  const rule = ruleOf(alert);
  return {
    interval: '1m',
    input_series: series.map((s) => ({
      series: s,
      values: frames.map((frame) => (frame.has(s) ? String(frame.get(s)) : '_')).join(' '),
    })),
    alert_rule_test: [
      {
        eval_time: `${frames.length - 1}m`,
        alertname: alert,
        exp_alerts: fires
          ? [
              {
                exp_labels: { ...fires, severity: rule.severity },
                exp_annotations: { summary: render(rule.summary, fires) },
              },
            ]
          : [],
      },
    ],
  };
}

/** Runs `promtool test rules` on the cases (JSON is YAML); fails with promtool's report. */
async function promtoolTestRules(name: string, cases: AlertCase[]): Promise<void> {
  const file = path.join(dir, `${name}.test.yml`);
  const tests = cases.map(promtoolTest);
  writeFileSync(file, JSON.stringify({ rule_files: [RULES], evaluation_interval: '1m', tests }, null, 1));
  try {
    await promisify(execFile)('promtool', ['test', 'rules', file]);
  } catch (err) {
    const { stdout, stderr } = err as { stdout: string; stderr: string };
    assert.fail(`promtool test rules ${file}:\n${stdout}${stderr}`);
  }
}

/** An HTTPS request to the gateway (its certificate is a test one: not verified). */
function gatewayStatus(url: string, target: string, headers: Record<string, string>): Promise<number> {
  return new Promise((resolve, reject) => {
    https
      .get(`${url}${target}`, { headers, rejectUnauthorized: false, agent: false }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode!));
      })
      .on('error', reject);
  });
}

function startGatehouse(file: string): { server: ServerProcess; ready: Promise<{ admin: string; gateway: string }> } {
  // channels need the key that seals what they store.
  const server = startServerProcess(file, { env: { GATEHOUSE_SECRET_KEY: randomBytes(32).toString('base64') } });
  const ready = (async () => {
    const admin = (await server.waitFor((l) => l.msg?.startsWith('admin listener'), 60_000)).url as string;
    const gateway = server.lines.find((l) => l.msg === 'gateway listening')!.url as string;
    return { admin, gateway };
  })();
  return { server, ready };
}

describe('examples/prometheus/alerts.yml on scrapes of a running gatehouse', { skip: promtoolMissing }, () => {
  let upstream: RecordingServer;
  before(async () => {
    upstream = await startRecordingUpstream();
  });
  after(() => upstream.close());

  it('GatehouseDown, GatehouseLockoutsSpiking, GatehouseConfigReloadRejected, GatehouseCertificateExpiring, GatehouseChannelDisconnected', async () => {
    const fixtures = path.join(ROOT, 'test/fixtures/tls');
    copyFileSync(path.join(fixtures, 'cert.pem'), path.join(dir, 'cert.pem'));
    copyFileSync(path.join(fixtures, 'key.pem'), path.join(dir, 'key.pem'));
    const file = path.join(dir, 'sqlite.json5');
    const config = `{
      gateway: { listen: { port: 0 }, upstream: { target: "${upstream.url}" }, trustProxy: ["127.0.0.1"],
        tls: { cert: "cert.pem", key: "key.pem" },
        auth: { apiKey: "${KEY}", failures: { max: 1, lockoutSeconds: 3600 } } },
      webhooks: { enabled: true, listen: { port: 0 },
        endpoints: [{ path: "/webhook/deploys", secret: "${HOOK_SECRET}", action: "message" }],
        targets: { message: { url: "${upstream.url}/hook" } } },
      channels: { phone: { kind: "qr" } },
      storage: { path: "${path.join(dir, 'sqlite.db')}" },
      admin: { listen: { port: 0 }, token: "${TOKEN}" },
    }`;
    writeFileSync(file, config);
    const { server, ready } = startGatehouse(file);
    try {
      const { admin, gateway } = await ready;
      const instance = new URL(admin).host;
      const healthy = await observe(admin);

      // Eleven clients, each locked out by one wrong key (failures.max 1), through the trusted proxy.
      for (let i = 1; i <= 11; i++) {
        const from = { 'x-api-key': WRONG_KEY, 'x-forwarded-for': `203.0.113.${i}` };
        assert.equal(await gatewayStatus(gateway, '/api/x', from), 401);
        assert.equal(await gatewayStatus(gateway, '/api/x', from), 429);
      }
      const lockedOut = await observe(admin);
      assert.equal(lockedOut.get(seriesText('gatehouse_lockouts_active', { job: 'gatehouse', instance })), 11);

      // A config that does not parse, then SIGHUP: rejected, the previous one stays.
      writeFileSync(file, '{ gateway: ');
      const reloads = server.lines.length;
      server.child.kill('SIGHUP');
      await server.waitFor((l) => l.msg?.startsWith('reload rejected') && server.lines.indexOf(l) >= reloads);
      const rejected = await observe(admin);

      // A certificate that expires in 3 days, put in place and reloaded.
      execFileSync('openssl', [
        ...['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'],
        ...['-keyout', path.join(dir, 'key.pem'), '-out', path.join(dir, 'cert.pem'), '-days', '3'],
        ...['-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1'],
      ]);
      writeFileSync(file, config);
      const ok = server.lines.length;
      server.child.kill('SIGHUP');
      await server.waitFor((l) => l.msg === 'configuration reloaded' && server.lines.indexOf(l) >= ok);
      const expiring = await observe(admin);
      const left = expiring.get(
        seriesText('gatehouse_tls_certificate_expires_in_seconds', { job: 'gatehouse', instance, listener: 'gateway' }),
      );
      assert.ok(left !== undefined && left > 2 * 86400 && left <= 3 * 86400, `expires in ${left} s`);

      await server.stop('SIGKILL');
      const down = await observe(admin);
      assert.equal(down.get(seriesText('up', { job: 'gatehouse', instance })), 0);

      const target = { job: 'gatehouse', instance };
      await promtoolTestRules('sqlite', [
        { alert: 'GatehouseDown', timeline: [healthy], hold: 3, fires: undefined },
        { alert: 'GatehouseDown', timeline: [healthy, down], hold: 3, fires: target },
        { alert: 'GatehouseLockoutsSpiking', timeline: [healthy], hold: 1, fires: undefined },
        { alert: 'GatehouseLockoutsSpiking', timeline: [healthy, lockedOut], hold: 0, fires: { job: 'gatehouse' } },
        { alert: 'GatehouseConfigReloadRejected', timeline: [healthy, lockedOut], hold: 1, fires: undefined },
        {
          alert: 'GatehouseConfigReloadRejected',
          timeline: [lockedOut, rejected],
          hold: 1,
          fires: { ...target, outcome: 'rejected' },
        },
        { alert: 'GatehouseCertificateExpiring', timeline: [rejected], hold: 0, fires: undefined },
        {
          alert: 'GatehouseCertificateExpiring',
          timeline: [expiring],
          hold: 0,
          fires: { ...target, listener: 'gateway' },
        },
        // No device was ever paired: the channel is not connected (pairing is test/channels/qr.test.ts's business);
        // it fires once that has lasted 15 minutes, not before.
        { alert: 'GatehouseChannelDisconnected', timeline: [healthy], hold: 14, fires: undefined },
        {
          alert: 'GatehouseChannelDisconnected',
          timeline: [healthy],
          hold: 16,
          fires: { job: 'gatehouse', channel: 'phone' },
        },
      ]);
    } finally {
      await server.stop('SIGKILL');
    }
  });

  describe('on PostgreSQL', { timeout: 180_000 }, () => {
    let cluster: PostgresCluster | { skip: string };
    before(async () => {
      cluster = await startPostgres({ purpose: 'the alert rules on PostgreSQL' });
    });
    after(async () => {
      if (!('skip' in cluster)) await cluster.destroy();
    });

    it('GatehouseDeadLettersGrowing, GatehouseDeliveryLag, GatehouseWebhooksUnavailable, GatehouseNotReady; the store gauges absent while it is down', async (t) => {
      if ('skip' in cluster) return t.skip(cluster.skip);
      const pgCluster = cluster;
      const url = await pgCluster.createDatabase();
      const failing = await startRecordingUpstream((_req, res) => {
        res.writeHead(500);
        res.end();
      });
      const hanging = await startRecordingUpstream(() => {}); // never answers
      const file = path.join(dir, 'pg.json5');
      writeFileSync(
        file,
        `{
        gateway: { listen: { port: 0 }, upstream: { target: "${upstream.url}" }, auth: { apiKey: "${KEY}" } },
        webhooks: { enabled: true, listen: { port: 0 },
          endpoints: [{ path: "/webhook/dead", secret: "${HOOK_SECRET}", action: "message" },
                      { path: "/webhook/slow", secret: "${HOOK_SECRET}", action: "agent" }],
          targets: { message: { url: "${failing.url}/hook" }, agent: { url: "${hanging.url}/hook", timeoutMs: 120000 } },
          delivery: { maxAttempts: 1 } },
        storage: { driver: "postgres", url: "${url}" },
        admin: { listen: { port: 0 }, token: "${TOKEN}" },
      }`,
      );
      const { server, ready } = startGatehouse(file);
      const db = new pg.Client({ connectionString: url });
      db.on('error', () => {}); // the cluster is stopped below: an idle client's connection is cut
      try {
        const { admin } = await ready;
        const instance = new URL(admin).host;
        const webhooks = server.lines.find((l) => l.msg === 'webhook receiver listening')!.url as string;
        const post = (endpoint: string, id: string) =>
          request(webhooks, endpoint, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'x-webhook-secret': HOOK_SECRET, 'idempotency-key': id },
            body: '{"n":1}',
          });
        const gauge = (samples: Samples, name: string, labels: Record<string, string> = {}) =>
          samples.get(seriesText(name, { job: 'gatehouse', instance, ...labels }));
        const healthy = await observe(admin);
        assert.equal(gauge(healthy, 'gatehouse_queue_events', { action: 'message', status: 'dead' }), 0);

        // A target that fails, with one attempt allowed: the event is dead at once.
        assert.equal((await post('/webhook/dead', 'dead-1')).status, 202);
        await waitFor(
          async () =>
            gauge(await observe(admin), 'gatehouse_queue_events', { action: 'message', status: 'dead' }) === 1,
          {
            timeoutMs: 30_000,
            what: 'the dead event in the queue gauge',
          },
        );
        const dead = await observe(admin);

        // A target that never answers holds an event in flight; its due time is moved 10 minutes back.
        assert.equal((await post('/webhook/slow', 'slow-1')).status, 202);
        await waitFor(() => hanging.received.length === 1, {
          timeoutMs: 30_000,
          what: 'the attempt at the hanging target',
        });
        await db.connect();
        const moved = await db.query(
          "UPDATE events SET next_attempt_at = next_attempt_at - 600000 WHERE action = 'agent'",
        );
        assert.equal(moved.rowCount, 1);
        await db.end();
        const lagging = await observe(admin);
        const lag = gauge(lagging, 'gatehouse_queue_oldest_due_seconds');
        assert.ok(lag !== undefined && lag >= 600, `oldest due ${lag} s`);

        // The database stops: webhooks are 503, /readyz fails, and every store-read gauge is absent.
        await pgCluster.stop();
        const outage: Samples[] = [];
        for (let i = 0; i < 3; i++) {
          for (let j = 0; j < 2; j++) assert.equal((await post('/webhook/dead', `out-${i}-${j}`)).status, 503);
          outage.push(await observe(admin));
        }
        for (const samples of outage) {
          const names = [...samples.keys()].map((s) => s.slice(0, s.indexOf('{')));
          for (const storeRead of ['gatehouse_queue_events', 'gatehouse_queue_oldest_due_seconds'])
            assert.ok(!names.includes(storeRead), `${storeRead} in a scrape during the outage`);
          assert.equal(gauge(samples, 'up'), 1, 'the scrape itself answers');
        }
        assert.ok(
          (gauge(outage[2]!, 'gatehouse_webhooks_received_total', {
            endpoint: '/webhook/dead',
            outcome: 'store_unavailable',
          }) ?? 0) >= 6,
        );

        const target = { job: 'gatehouse', instance };
        await promtoolTestRules('postgres', [
          // Dead events that stay dead do not fire it; new ones do.
          { alert: 'GatehouseDeadLettersGrowing', timeline: [dead, lagging], hold: 1, fires: undefined },
          {
            alert: 'GatehouseDeadLettersGrowing',
            timeline: [healthy, dead],
            hold: 1,
            fires: { job: 'gatehouse', action: 'message' },
          },
          { alert: 'GatehouseDeliveryLag', timeline: [healthy, dead], hold: 11, fires: undefined },
          { alert: 'GatehouseDeliveryLag', timeline: [dead, lagging], hold: 11, fires: { job: 'gatehouse' } },
          { alert: 'GatehouseWebhooksUnavailable', timeline: [healthy, dead, lagging], hold: 1, fires: undefined },
          { alert: 'GatehouseWebhooksUnavailable', timeline: [lagging, ...outage], hold: 1, fires: target },
          { alert: 'GatehouseNotReady', timeline: [healthy, dead, lagging], hold: 1, fires: undefined },
          {
            alert: 'GatehouseNotReady',
            timeline: [lagging, ...outage],
            hold: 1,
            fires: { job: 'gatehouse-ready', instance },
          },
        ]);
      } finally {
        await db.end().catch(() => {});
        await server.stop('SIGKILL');
        await Promise.all([failing.close(), hanging.close()]);
      }
    });
  });
});
