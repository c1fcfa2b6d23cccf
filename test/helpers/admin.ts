import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before } from 'node:test';
import { exportJWK, generateKeyPair, SignJWT } from 'jose';
import { request } from './http.js';
import { startServerProcess, type ServerProcess } from './process.js';
import { startRecordingUpstream, type RecordingServer } from './upstream.js';

/**
 * Shared by the admin listener's e2e tests (admin-metrics, admin-metrics-workers): a recording
 * upstream and delivery target, a JWKS server that can be made to fail, configs with `admin`,
 * the same traffic for every layout, and /metrics parsed into series → value.
 */

export const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-admin-'));
export const KEY = 'admin-test-key-0123456789abcdefghijklmnopqrs';
export const WRONG_KEY = 'admin-test-bad-0123456789abcdefghijklmnopqrs';
export const TOKEN = 'admin-token-0123456789abcdef';
export const HOOK_SECRET = 'admin-hook-secret-0123456789';

export let upstream: RecordingServer;
export let target: RecordingServer;
export let jwks: { url: string; status: number; close(): Promise<void> };
export let signGood: (sub: string) => Promise<string>;
export let signStranger: () => Promise<string>;

/** Registers the fixtures' before/after hooks in the calling test file. */
export function useAdminFixtures(): void {
  before(async () => {
    upstream = await startRecordingUpstream();
    target = await startRecordingUpstream();
    const ours = await generateKeyPair('RS256');
    const stranger = await generateKeyPair('RS256');
    const jwk = { ...(await exportJWK(ours.publicKey)), kid: 'k1', alg: 'RS256', use: 'sig' };
    signGood = (sub) =>
      new SignJWT({})
        .setProtectedHeader({ alg: 'RS256', kid: 'k1' })
        .setSubject(sub)
        .setExpirationTime('5m')
        .sign(ours.privateKey);
    signStranger = () =>
      new SignJWT({})
        .setProtectedHeader({ alg: 'RS256', kid: 'k1' })
        .setSubject('mallory')
        .setExpirationTime('5m')
        .sign(stranger.privateKey);
    const state = { status: 200 };
    const server = http.createServer((_req, res) => {
      res.writeHead(state.status, { 'content-type': 'application/json' });
      res.end(state.status === 200 ? JSON.stringify({ keys: [jwk] }) : '{"error":"down"}');
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    jwks = {
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/jwks.json`,
      get status() {
        return state.status;
      },
      set status(s: number) {
        state.status = s;
      },
      close: () => new Promise((r) => server.close(() => r())),
    };
  });
  after(async () => {
    await Promise.all([upstream.close(), target.close(), jwks.close()]);
  });
}

export function writeConfig(
  name: string,
  options: { workers?: number; upstreamUrl?: string; admin?: string; storage?: string } = {},
): string {
  const file = path.join(dir, name);
  writeFileSync(
    file,
    `{
    gateway: { listen: { port: 0 }, workers: ${options.workers ?? 1}, upstream: { target: "${options.upstreamUrl ?? upstream.url}" },
      auth: { apiKey: "${KEY}", require: "any", bearer: { jwt: { jwksUri: "${jwks.url}", jwksCooldownSeconds: 0 } } } },
    webhooks: { enabled: true, listen: { port: 0 },
      endpoints: [{ path: "/webhook/deploys", secret: "${HOOK_SECRET}", action: "message" }],
      targets: { message: { url: "${target.url}/hook" } },
      delivery: { initialBackoffMs: 50, maxBackoffMs: 100 } },
    storage: ${options.storage ?? `{ path: "${path.join(dir, name + '.db')}" }`},
    admin: ${options.admin ?? `{ listen: { port: 0 }, token: "${TOKEN}", limits: { maxHeaderCount: 20 } }`},
  }`,
  );
  return file;
}

export interface Started {
  server: ServerProcess;
  gateway: string;
  webhooks: string;
  admin: string;
}

export async function start(file: string, env: NodeJS.ProcessEnv = {}): Promise<Started> {
  const server = startServerProcess(file, { env });
  const admin = await server.waitFor((l) => l.msg?.startsWith('admin listener'), 40_000);
  const webhooks = server.lines.find((l) => l.msg === 'webhook receiver listening')!;
  const gateway = server.lines.find((l) => l.msg === 'gateway listening' || l.msg === 'gateway workers listening')!;
  return { server, gateway: gateway.url, webhooks: webhooks.url, admin: admin.url };
}

export const auth = { authorization: `Bearer ${TOKEN}` };

/** Scrapes /metrics (with the token) into `name{labels} → value`. */
export async function scrape(admin: string): Promise<{ text: string; value(series: string): number | undefined }> {
  const reply = await request(admin, '/metrics', { headers: auth });
  assert.equal(reply.status, 200, reply.body);
  assert.match(String(reply.headers['content-type']), /^text\/plain; version=0\.0\.4/);
  const values = new Map<string, number>();
  for (const line of reply.body.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    values.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return { text: reply.body, value: (series) => values.get(series) };
}

/** The same traffic for both layouts: counts below are what it must produce. */
export async function sendTraffic(s: Started, deliveryId = 'd-1'): Promise<void> {
  for (let i = 0; i < 4; i++)
    assert.equal((await request(s.gateway, `/api/items/${i}`, { headers: { 'x-api-key': KEY } })).status, 200);
  for (let i = 0; i < 2; i++)
    assert.equal((await request(s.gateway, '/api/items', { headers: { 'x-api-key': WRONG_KEY } })).status, 401);
  assert.equal((await request(s.gateway, '/api/items')).status, 401);
  assert.equal(
    (await request(s.gateway, '/api/items', { headers: { authorization: `Bearer ${await signStranger()}` } })).status,
    401,
  );
  const hook = (secret: string, id: string) =>
    request(s.webhooks, '/webhook/deploys', {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-webhook-secret': secret, 'idempotency-key': id },
      body: '{"ref":"main"}',
    });
  assert.equal((await hook(HOOK_SECRET, deliveryId)).status, 202);
  assert.equal((await hook(HOOK_SECRET, deliveryId)).status, 200); // the same delivery id: a duplicate
  assert.equal((await hook('not-the-secret-0123456789', 'other')).status, 401);
}
