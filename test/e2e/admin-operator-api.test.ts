import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { generateApiKey, hashApiKey } from '../../src/gateway/credentials/api-key.js';
import { POSTGRES_SCHEMA_VERSION } from '../../src/storage/postgres/migrations.js';
import { SQLITE_SCHEMA_VERSION } from '../../src/storage/sqlite/migrations.js';
import { VERSION } from '../../src/version.js';
import { request, type Reply } from '../helpers/http.js';
import { startInstances, stopInstances, type Instance } from '../helpers/instances.js';
import { startServerProcess, type ServerProcess } from '../helpers/process.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

// Issue 30: the operator's routes of the admin API (lockouts, keys, status) through real
// `gatehouse start` processes: clients locked out by real bad credentials on /api/ and on a
// webhook endpoint, listed, lifted, and then served again, as the upstream's own record shows; in
// one process, with two gateway workers, and on two instances sharing one PostgreSQL.

const TOKEN = 'operator-api-token-0123456789abcdef';
const auth = { authorization: `Bearer ${TOKEN}` };
const PLAIN_KEY = 'operator-plain-key-0123456789abcdefghijklmnop';
const KEY_A = generateApiKey();
const KEY_B = generateApiKey();
const WRONG_KEY = 'operator-wrong-key-0123456789abcdefghijklmnop';
const HOOK_SECRET = 'operator-hook-secret-0123456789';
const MAX = 3;
const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-operator-api-'));

const cluster = await startPostgres();
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

let upstream: RecordingServer;
let target: RecordingServer;
before(async () => {
  upstream = await startRecordingUpstream();
  target = await startRecordingUpstream();
});
after(() => Promise.all([upstream.close(), target.close()]));

function config(options: { workers?: number; storage?: object; admin?: object; failuresMax?: number } = {}) {
  return {
    log: { level: 'info' },
    gateway: {
      listen: { host: '127.0.0.1', port: 0 },
      workers: options.workers ?? 1,
      upstream: { target: upstream.url },
      // The test's own address is a proxy: X-Forwarded-For then names the client (an IPv6 one below).
      trustProxy: ['127.0.0.1'],
      auth: {
        apiKey: PLAIN_KEY,
        apiKeys: [
          { id: 'ci-deploy', hash: hashApiKey(KEY_A), scopes: ['deploy', 'read'], expiresAt: '2099-01-01T00:00:00Z' },
          {
            id: 'old-bot',
            hash: hashApiKey(KEY_B),
            expiresAt: '2020-01-01T00:00:00Z',
            rateLimit: { requests: 5, per: '1m' },
          },
        ],
        failures: { max: options.failuresMax ?? MAX, windowSeconds: 60, lockoutSeconds: 300 },
      },
    },
    webhooks: {
      enabled: true,
      listen: { host: '127.0.0.1', port: 0 },
      endpoints: [{ path: '/webhook/deploys', secret: HOOK_SECRET, action: 'message' }],
      targets: { message: { url: `${target.url}/hook` } },
    },
    storage: options.storage ?? { path: path.join(dir, `${Math.random().toString(36).slice(2)}.db`) },
    admin: options.admin ?? { listen: { host: '127.0.0.1', port: 0 }, token: TOKEN },
  };
}

interface Started {
  server: ServerProcess;
  gateway: string;
  webhooks: string;
  admin: string;
}

async function start(file: string): Promise<Started> {
  const server = startServerProcess(file);
  const admin = await server.waitFor((l) => l.msg?.startsWith('admin listener'), 60_000);
  const gateway = server.lines.find((l) => l.msg === 'gateway listening' || l.msg === 'gateway workers listening')!;
  const webhooks = server.lines.find((l) => l.msg === 'webhook receiver listening')!;
  return { server, gateway: gateway.url, webhooks: webhooks.url, admin: admin.url };
}

const json = (reply: Reply) => JSON.parse(reply.body);
const api = (admin: string, p: string, method = 'GET', headers: Record<string, string> = auth) =>
  request(admin, p, { method, headers });
const apiCall = (gateway: string, p: string, key: string, forwardedFor?: string) =>
  request(gateway, p, { headers: { 'x-api-key': key, ...(forwardedFor && { 'x-forwarded-for': forwardedFor }) } });
const hook = (webhooks: string, secret: string) =>
  request(webhooks, '/webhook/deploys', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-webhook-secret': secret },
    body: '{"ref":"main"}',
  });
const received = (p: string) => upstream.received.filter((r) => r.url === p).length;

/** Bad keys from a client until it is refused: `max` evaluated (401), then 429. */
async function lockOut(gateway: string, forwardedFor?: string): Promise<void> {
  const statuses: number[] = [];
  for (let i = 0; i < MAX; i++) statuses.push((await apiCall(gateway, '/api/guess', WRONG_KEY, forwardedFor)).status);
  assert.deepEqual(statuses, Array(MAX).fill(401));
  const refused = await apiCall(gateway, '/api/refused', PLAIN_KEY, forwardedFor);
  assert.equal(refused.status, 429, refused.body);
  assert.equal(json(refused).error.code, 'too_many_failures');
}

describe('admin operator API: one process on SQLite', { timeout: 120_000 }, () => {
  let s: Started;
  let file: string;
  before(async () => {
    file = path.join(dir, 'single.json5');
    writeFileSync(file, JSON.stringify(config()));
    s = await start(file);
  });
  after(() => s.server.stop('SIGKILL'));

  it('lists the clients locked out on /api/ and on a webhook endpoint, lifts one, and that client is served again', async () => {
    await lockOut(s.gateway, '2001:db8::7'); // an IPv6 client: counted per /64
    await lockOut(s.gateway); // 127.0.0.1 itself
    for (let i = 0; i < MAX; i++) assert.equal((await hook(s.webhooks, 'not-the-secret-0123456789')).status, 401);
    assert.equal((await hook(s.webhooks, HOOK_SECRET)).status, 429, 'the right secret is refused too while locked');

    const listed = await api(s.admin, '/admin/api/lockouts');
    assert.equal(listed.status, 200, listed.body);
    const { lockouts, total } = json(listed);
    assert.equal(total, 3);
    assert.deepEqual(lockouts.map((l: { client: string; area: string }) => `${l.area} ${l.client}`).sort(), [
      'gateway 127.0.0.1',
      'gateway 2001:db8:0:0::/64',
      'webhooks 127.0.0.1',
    ]);
    for (const l of lockouts) {
      const left = Date.parse(l.until) - Date.now();
      assert.ok(left > 250_000 && left <= 300_000, `${l.client} locked for the configured 300 s (${left} ms left)`);
    }
    assert.equal(json(await api(s.admin, '/admin/api/lockouts?limit=1')).lockouts.length, 1);

    // Another address of the same /64, URL-encoded (colons): lifts the group's lockout only.
    const lifted = await api(s.admin, `/admin/api/lockouts/${encodeURIComponent('2001:db8::99')}`, 'DELETE');
    assert.equal(lifted.status, 200, lifted.body);
    assert.deepEqual(
      json(lifted).lifted.map((l: { client: string; area: string }) => `${l.area} ${l.client}`),
      ['gateway 2001:db8:0:0::/64'],
    );
    assert.equal((await apiCall(s.gateway, '/api/after-lift-v6', PLAIN_KEY, '2001:db8::7')).status, 200);
    assert.equal(received('/api/after-lift-v6'), 1, 'the upstream got the lifted client’s request');
    assert.equal((await apiCall(s.gateway, '/api/still-locked', PLAIN_KEY)).status, 429);
    assert.equal(received('/api/still-locked'), 0, 'the other client stays locked out');

    // The group as listed, encoded: both areas of 127.0.0.1 in one DELETE.
    const both = await api(s.admin, '/admin/api/lockouts/127.0.0.1', 'DELETE');
    assert.equal(both.status, 200, both.body);
    assert.deepEqual(
      json(both)
        .lifted.map((l: { area: string }) => l.area)
        .sort(),
      ['gateway', 'webhooks'],
    );
    assert.equal((await apiCall(s.gateway, '/api/after-lift-v4', PLAIN_KEY)).status, 200);
    assert.equal(received('/api/after-lift-v4'), 1);
    const delivered = target.received.length;
    assert.equal((await hook(s.webhooks, HOOK_SECRET)).status, 202, 'the webhook endpoint takes the client again');
    await waitFor(() => target.received.length > delivered, { what: 'the accepted webhook delivered' });
    assert.deepEqual(json(await api(s.admin, '/admin/api/lockouts')), { lockouts: [], total: 0 });

    // A lift is logged at info with who and what.
    const line = await s.server.waitFor((l) => l.msg === 'admin: lockout lifted' && l.client === '127.0.0.1');
    assert.equal(line.who, 'admin token');
    assert.equal(line.level, 'info');

    // REST DELETE: the second one finds nothing (404), and changes nothing.
    const again = await api(s.admin, '/admin/api/lockouts/127.0.0.1', 'DELETE');
    assert.equal(again.status, 404);
    assert.equal(json(again).error.code, 'lockout_not_found');
  });

  it('refuses what is not a client, other methods and unknown parameters with catalogue codes', async () => {
    for (const [p, method, status, code] of [
      ['/admin/api/lockouts/not-an-address', 'DELETE', 400, 'invalid_parameter'],
      ['/admin/api/lockouts/%ZZ', 'DELETE', 400, 'invalid_parameter'],
      ['/admin/api/lockouts/10.0.0.1%2F24', 'DELETE', 400, 'invalid_parameter'],
      ['/admin/api/lockouts/10.0.0.1?force=1', 'DELETE', 400, 'invalid_parameter'],
      ['/admin/api/lockouts?client=1', 'GET', 400, 'invalid_parameter'],
      ['/admin/api/lockouts?limit=0', 'GET', 400, 'invalid_parameter'],
      ['/admin/api/lockouts', 'DELETE', 405, 'method_not_allowed'],
      ['/admin/api/lockouts/10.0.0.1', 'GET', 405, 'method_not_allowed'],
      ['/admin/api/keys', 'POST', 405, 'method_not_allowed'],
      ['/admin/api/keys?secret=1', 'GET', 400, 'invalid_parameter'],
      ['/admin/api/keys?cursor=%20', 'GET', 400, 'invalid_cursor'],
      ['/admin/api/keys/ci-deploy', 'GET', 404, 'not_found'],
      ['/admin/api/status', 'DELETE', 405, 'method_not_allowed'],
      ['/admin/api/status?verbose=1', 'GET', 400, 'invalid_parameter'],
      ['/admin/api/nothing', 'GET', 404, 'not_found'],
    ] as const) {
      const reply = await api(s.admin, p, method);
      assert.equal(reply.status, status, `${method} ${p}: ${reply.body}`);
      assert.equal(json(reply).error.code, code, `${method} ${p}`);
      if (status === 405) assert.match(String(reply.headers.allow), /^(GET|DELETE)$/);
    }
  });

  it('lists the API keys with what they grant, and nothing of a key or a hash', async () => {
    const reply = await api(s.admin, '/admin/api/keys');
    assert.equal(reply.status, 200, reply.body);
    assert.deepEqual(json(reply), {
      keys: [
        {
          id: 'ci-deploy',
          subject: 'ci-deploy',
          scopes: ['deploy', 'read'],
          expiresAt: '2099-01-01T00:00:00.000Z',
          expired: false,
          rateLimit: null,
          source: 'apiKeys',
        },
        {
          id: 'default',
          subject: 'default',
          scopes: [],
          expiresAt: null,
          expired: false,
          rateLimit: null,
          source: 'apiKey',
        },
        {
          id: 'old-bot',
          subject: 'old-bot',
          scopes: [],
          expiresAt: '2020-01-01T00:00:00.000Z',
          expired: true,
          rateLimit: { requests: 5, perSeconds: 60 },
          source: 'apiKeys',
        },
      ],
      nextCursor: null,
      total: 3,
    });
    // No fragment of a secret: no 8 characters in a row of any key or of any hash's hex digits.
    const secrets = [
      PLAIN_KEY,
      KEY_A,
      KEY_B,
      hashApiKey(KEY_A).slice(7),
      hashApiKey(KEY_B).slice(7),
      hashApiKey(PLAIN_KEY).slice(7),
    ];
    for (const secret of secrets)
      for (let i = 0; i + 8 <= secret.length; i++)
        assert.ok(!reply.body.includes(secret.slice(i, i + 8)), `a fragment of a secret: ${secret.slice(i, i + 8)}`);
    assert.ok(!reply.body.includes('sha256'), 'no hash');

    const first = json(await api(s.admin, '/admin/api/keys?limit=2'));
    assert.deepEqual(
      first.keys.map((k: { id: string }) => k.id),
      ['ci-deploy', 'default'],
    );
    assert.equal(first.nextCursor, 'default');
    const second = json(await api(s.admin, `/admin/api/keys?limit=2&cursor=${first.nextCursor}`));
    assert.deepEqual(
      second.keys.map((k: { id: string }) => k.id),
      ['old-bot'],
    );
    assert.equal(second.nextCursor, null);
  });

  it('gives the status: version, listeners, uptime, the store and its queue', async () => {
    const reply = await api(s.admin, '/admin/api/status');
    assert.equal(reply.status, 200, reply.body);
    const status = json(reply);
    assert.equal(status.version, VERSION);
    assert.deepEqual(status.listeners, { gateway: s.gateway, webhooks: s.webhooks, admin: s.admin });
    assert.ok(status.uptimeSeconds >= 0 && Date.parse(status.startedAt) <= Date.now());
    assert.equal(status.store.driver, 'sqlite');
    assert.equal(status.store.available, true);
    assert.equal(status.store.schemaVersion, SQLITE_SCHEMA_VERSION);
    assert.equal(status.store.queue.dead, 0);
    assert.equal(status.store.queue.queued + (status.store.queue.delivered ?? 0), 1, 'the one webhook accepted');
    assert.equal(status.gmail, null);
    assert.deepEqual(status.channels, { available: true, list: [] });
    assert.deepEqual(status.lockouts, { available: true, active: 0 });
  });

  it('refuses each route without the token, with a wrong one, and (admin.token removed) as disabled', async () => {
    const routes = [
      ['/admin/api/lockouts', 'GET'],
      ['/admin/api/lockouts/127.0.0.1', 'DELETE'],
      ['/admin/api/keys', 'GET'],
      ['/admin/api/status', 'GET'],
    ] as const;
    for (const [p, method] of routes) {
      for (const headers of [{}, { authorization: 'Bearer wrong-token-0123456789abcdef' }] as Record<
        string,
        string
      >[]) {
        const reply = await api(s.admin, p, method, headers);
        assert.equal(reply.status, 401, `${method} ${p}`);
        assert.equal(json(reply).error.code, 'invalid_admin_token');
        assert.ok(!reply.body.includes('ci-deploy') && !reply.body.includes('127.0.0.1'), 'nothing of the answer');
      }
    }
    // The config file is watched: without admin.token the API is off (the listener stays).
    writeFileSync(file, JSON.stringify({ ...config(), admin: { listen: { host: '127.0.0.1', port: 0 } } }));
    await s.server.waitFor((l) => l.msg === 'configuration reloaded', 20_000);
    for (const [p, method] of routes) {
      const reply = await api(s.admin, p, method);
      assert.equal(reply.status, 403, `${method} ${p}`);
      assert.equal(json(reply).error.code, 'admin_api_disabled');
    }
  });
});

describe('admin operator API: two gateway workers', { timeout: 120_000 }, () => {
  let s: Started;
  before(async () => {
    const file = path.join(dir, 'workers.json5');
    // max 4 over 2 workers: each enforces a share of 2, the primary the whole count.
    writeFileSync(file, JSON.stringify(config({ workers: 2, failuresMax: 4 })));
    s = await start(file);
  });
  after(() => s.server.stop('SIGKILL'));

  it('lists a client locked out by the workers, and after the lift every worker admits it', async () => {
    // Until both workers refuse: the connections are spread over them, each answers by its own view.
    let refusedInARow = 0;
    for (let i = 0; i < 40 && refusedInARow < 6; i++) {
      const status = (await apiCall(s.gateway, '/api/guess', WRONG_KEY, '198.51.100.7')).status;
      refusedInARow = status === 429 ? refusedInARow + 1 : 0;
    }
    assert.equal(refusedInARow, 6, 'locked out in every worker');
    const listed = json(await api(s.admin, '/admin/api/lockouts'));
    assert.deepEqual(
      listed.lockouts.map((l: { client: string; area: string }) => `${l.area} ${l.client}`),
      ['gateway 198.51.100.7'],
    );

    const lifted = await api(s.admin, '/admin/api/lockouts/198.51.100.7', 'DELETE');
    assert.equal(lifted.status, 200, lifted.body);
    // Whichever worker answers (each request on a new connection, spread over both), it admits the client.
    for (let i = 0; i < 8; i++) {
      const reply = await apiCall(s.gateway, `/api/after-lift-${i}`, PLAIN_KEY, '198.51.100.7');
      assert.equal(reply.status, 200, `request ${i}: ${reply.body}`);
      assert.equal(received(`/api/after-lift-${i}`), 1);
    }
    assert.deepEqual(json(await api(s.admin, '/admin/api/lockouts')).lockouts, []);
    const again = await api(s.admin, '/admin/api/lockouts/198.51.100.7', 'DELETE');
    assert.equal(again.status, 404);
  });
});

describe(
  'admin operator API: two instances on one PostgreSQL',
  { timeout: 180_000, skip: 'skip' in cluster ? cluster.skip : false },
  () => {
    let instances: Instance[] = [];
    const admins: string[] = [];
    before(async () => {
      const url = await (cluster as PostgresCluster).createDatabase();
      instances = await startInstances(2, url, () => {
        const { storage: _sqlite, ...rest } = config();
        return rest;
      });
      for (const instance of instances)
        admins.push((await instance.process.waitFor((l) => l.msg?.startsWith('admin listener'))).url);
    });
    after(() => stopInstances(instances));

    it('a lift on one instance lets the client in on the other too', async () => {
      const [one, two] = instances as [Instance, Instance];
      await lockOut(one.gatewayUrl, '203.0.113.9');
      // The other instance learns the lock from the database (NOTIFY) and refuses the client too.
      let probes = 0;
      const refusedAt = await waitFor(
        async () => {
          const p = `/api/probe-${++probes}`;
          return (await apiCall(two.gatewayUrl, p, PLAIN_KEY, '203.0.113.9')).status === 429 && p;
        },
        { what: 'the second instance refusing the client' },
      );
      assert.equal(received(refusedAt), 0, 'the refused request did not reach the upstream');
      const listed = json(await api(admins[1]!, '/admin/api/lockouts'));
      assert.deepEqual(
        listed.lockouts.map((l: { client: string; area: string }) => `${l.area} ${l.client}`),
        ['gateway 203.0.113.9'],
      );

      const lifted = await api(admins[0]!, '/admin/api/lockouts/203.0.113.9', 'DELETE');
      assert.equal(lifted.status, 200, lifted.body);
      // The second instance hears the lift (NOTIFY) and admits the client: its request reaches the upstream.
      await waitFor(
        async () => (await apiCall(two.gatewayUrl, '/api/after-lift-two', PLAIN_KEY, '203.0.113.9')).status === 200,
        { what: 'the second instance admitting the client after the lift' },
      );
      assert.equal(received('/api/after-lift-two'), 1);
      assert.equal((await apiCall(one.gatewayUrl, '/api/after-lift-one', PLAIN_KEY, '203.0.113.9')).status, 200);
      assert.equal(received('/api/after-lift-one'), 1);
      assert.deepEqual(json(await api(admins[1]!, '/admin/api/lockouts')).lockouts, []);
    });

    it('with PostgreSQL stopped, the status still answers and says the store is unavailable; a lift says it is incomplete', async () => {
      const before = json(await api(admins[1]!, '/admin/api/status'));
      assert.equal(before.store.driver, 'postgres');
      assert.equal(before.store.available, true);
      assert.equal(before.store.schemaVersion, POSTGRES_SCHEMA_VERSION);

      await (cluster as PostgresCluster).stop();
      const reply = await api(admins[1]!, '/admin/api/status');
      assert.equal(reply.status, 200, reply.body);
      const status = json(reply);
      assert.equal(status.store.available, false, 'never claimed fine');
      assert.equal(status.store.driver, 'postgres');
      assert.equal(typeof status.store.error, 'string');
      assert.equal(status.store.queue, undefined);
      assert.equal(status.version, VERSION, 'the rest is answered');
      assert.deepEqual(status.lockouts, { available: true, active: 0 });

      const lift = await api(admins[0]!, '/admin/api/lockouts/203.0.113.10', 'DELETE');
      assert.equal(lift.status, 503, lift.body);
      assert.equal(json(lift).error.code, 'lockout_lift_incomplete');
    });
  },
);
