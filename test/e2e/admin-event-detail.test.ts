import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { start, type Started } from '../helpers/admin.js';
import { request, type Reply } from '../helpers/http.js';
import { startPostgres, type PostgresCluster } from '../helpers/postgres.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';
import { waitFor } from '../helpers/wait.js';

// Issue 30, GET /admin/api/events/<id>: the headers an event came with (credentials and signatures
// redacted when stored, so the raw values are nowhere in the answer) and, per attempt, the start
// of the target's answer; through a real `gatehouse start`, on SQLite and on PostgreSQL.

const TOKEN = 'event-detail-admin-token-0123456789';
const HOOK_SECRET = 'hook-secret-NEVER-SHOWN-0123456789';
const CREDENTIALS = {
  authorization: 'Bearer bearer-NEVER-SHOWN-abcdef',
  cookie: 'session=cookie-NEVER-SHOWN-abcdef; theme=dark',
  'x-hub-signature-256': 'sha256=signature-NEVER-SHOWN-abcdef',
  'stripe-signature': 't=1,v1=stripe-NEVER-SHOWN',
  'x-telegram-bot-api-secret-token': 'telegram-NEVER-SHOWN',
  'x-api-key': 'apikey-NEVER-SHOWN',
  // A sender's own credential under a name no list foresaw: hidden as every unknown value is.
  'ocp-apim-subscription-key': 'azure-NEVER-SHOWN-abcdef',
  'x-partner-key': 'partner-NEVER-SHOWN-abcdef',
};
const PLAIN = { 'x-github-delivery': 'd-deploy-bot', 'x-github-event': 'push', 'user-agent': 'Sender/1.0' };
const auth = { authorization: `Bearer ${TOKEN}` };
const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-event-detail-'));

/** The 503's body: 700 bytes, so its first 512 are a proper part of it. */
const BUSY_BODY = `{"error":"overloaded","detail":"${'try later; '.repeat(60)}"}`;
/** The big answer: 4 MiB, far past what is read of an answer. */
const BIG_BODY = Buffer.alloc(4 * 1024 * 1024, 'big answer. ');

const cluster = await startPostgres();
after(async () => {
  if (!('skip' in cluster)) await cluster.destroy();
});

let target: RecordingServer;
before(async () => {
  target = await startRecordingUpstream((req, res) => {
    if (req.url === '/busy') {
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end(BUSY_BODY);
    } else if (req.url === '/big') {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.end(BIG_BODY);
    } else {
      res.writeHead(204);
      res.end();
    }
  });
});
after(() => target.close());

function writeConfig(name: string, storage: string): string {
  const file = path.join(dir, name);
  writeFileSync(
    file,
    `{
    gateway: { listen: { port: 0 }, upstream: { target: "http://127.0.0.1:1" }, auth: { apiKey: "${'k'.repeat(40)}" } },
    webhooks: { enabled: true, listen: { port: 0 },
      endpoints: [{ path: "/webhook/busy", secret: "${HOOK_SECRET}", action: "message" },
                  { path: "/webhook/big", secret: "${HOOK_SECRET}", action: "agent" },
                  { path: "/webhook/empty", secret: "${HOOK_SECRET}", action: "system-event" }],
      targets: { message: { url: "${target.url}/busy" }, agent: { url: "${target.url}/big" },
                 "system-event": { url: "${target.url}/empty" } },
      delivery: { maxAttempts: 2, initialBackoffMs: 20, maxBackoffMs: 50, timeoutMs: 5000 } },
    storage: ${storage},
    admin: { listen: { port: 0 }, token: "${TOKEN}" },
  }`,
  );
  return file;
}

const json = (reply: Reply) => JSON.parse(reply.body);

for (const driver of ['sqlite', 'postgres'] as const) {
  describe(
    `admin event detail: headers and answers (${driver})`,
    { timeout: 180_000, skip: driver === 'postgres' && 'skip' in cluster ? cluster.skip : false },
    () => {
      let s: Started;
      before(async () => {
        const storage =
          driver === 'sqlite'
            ? `{ path: "${path.join(dir, 'events.db')}" }`
            : `{ driver: "postgres", url: "${await (cluster as PostgresCluster).createDatabase()}" }`;
        s = await start(writeConfig(`${driver}.json5`, storage));
      });
      after(() => s.server.stop('SIGKILL'));

      async function send(endpoint: string, headers: Record<string, string> = {}): Promise<string> {
        const reply = await request(s.webhooks, endpoint, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-webhook-secret': HOOK_SECRET, ...headers },
          body: JSON.stringify({ n: 1 }),
        });
        assert.equal(reply.status, 202, reply.body);
        return json(reply).id;
      }
      const detail = (id: string) => request(s.admin, `/admin/api/events/${id}`, { headers: auth });

      it('shows the plain headers as sent and every credential and signature as [redacted], their values nowhere in the answer', async () => {
        const id = await send('/webhook/busy', { ...CREDENTIALS, ...PLAIN });
        const reply = await detail(id);
        assert.equal(reply.status, 200, reply.body);
        const { headers } = json(reply);
        for (const [name, value] of Object.entries(PLAIN)) assert.equal(headers[name], value, name);
        assert.equal(headers['content-type'], 'application/json');
        for (const name of [...Object.keys(CREDENTIALS), 'x-webhook-secret'])
          assert.equal(headers[name], '[redacted]', name);
        for (const secret of [HOOK_SECRET, ...Object.values(CREDENTIALS)]) {
          assert.ok(!reply.body.includes(secret), `${secret} in the answer`);
          for (const part of secret.split(/[ =;,]/).filter((p) => p.includes('NEVER')))
            assert.ok(!reply.body.includes(part), `${part} in the answer`);
        }
        assert.ok(!reply.body.includes('NEVER-SHOWN'));
      });

      it("a target answering 503 with a body: each attempt's responseSnippet is the body's first 512 bytes", async () => {
        const id = await send('/webhook/busy');
        await waitFor(async () => json(await detail(id)).status === 'dead', { what: 'dead after two 503s' });
        const { attempts } = json(await detail(id));
        assert.equal(attempts.length, 2);
        for (const a of attempts) {
          assert.equal(a.status, 503);
          assert.equal(a.responseSnippet, BUSY_BODY.slice(0, 512));
        }
      });

      it('a target answering 4 MiB: the snippet is its first 512 bytes, the event is delivered, and deliveries go on', async () => {
        const first = await send('/webhook/big');
        await waitFor(async () => json(await detail(first)).status === 'delivered', { what: 'delivered' });
        const { attempts } = json(await detail(first));
        assert.equal(attempts.length, 1);
        assert.equal(attempts[0].status, 200);
        assert.equal(attempts[0].responseSnippet, BIG_BODY.subarray(0, 512).toString('utf8'));
        assert.ok(attempts[0].durationMs < 5000, 'well within the timeout');
        // The connection cut off after the big answer is replaced: the next ones are delivered too.
        const next = await Promise.all([send('/webhook/big'), send('/webhook/big'), send('/webhook/empty')]);
        await waitFor(
          async () =>
            (await Promise.all(next.map(async (id) => json(await detail(id)).status))).every(
              (st) => st === 'delivered',
            ),
          { what: 'the next three delivered' },
        );
        const empty = json(await detail(next[2]!));
        assert.equal(empty.attempts[0].status, 204);
        assert.equal(empty.attempts[0].responseSnippet, null, 'no body: null');
      });
    },
  );
}
