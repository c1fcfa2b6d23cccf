/**
 * A server running with another GATEHOUSE_SECRET_KEY than the one a login sealed its grant with:
 * sends answer 500 credentials_unreadable (not a stack), Telegram updates 503 (Telegram retries),
 * and the platform is never called.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import pino from 'pino';
import { channelRoutes } from '../../src/integrations/channels/inbound.js';
import { createChannelSender } from '../../src/integrations/channels/outbound.js';
import type { ChannelStore } from '../../src/integrations/channels/state.js';
import { parseConfig } from '../../src/config/load.js';
import { respondWithError } from '../../src/http/request-context.js';
import { channelGrantContext, sealSecret } from '../../src/storage/secrets.js';
import { openChannelStore } from '../../src/storage/open.js';
import { startFakeTelegram, type FakeTelegram } from '../helpers/fake-chat.js';
import { request } from '../helpers/http.js';

describe('channels: a grant sealed under another key', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-wrong-key-'));
  const loginKey = { current: randomBytes(32), previous: [] };
  const serverKey = { current: randomBytes(32), previous: [] };
  const logger = pino({ level: 'silent' });
  let fake: FakeTelegram;
  let store: ChannelStore;
  let server: http.Server;
  let url: string;
  let config: ReturnType<typeof parseConfig>;

  before(async () => {
    fake = await startFakeTelegram();
    config = parseConfig({
      storage: { path: path.join(dir, 'g.db') },
      gateway: { upstream: { target: 'http://127.0.0.1:9' } },
      webhooks: { enabled: true, targets: { message: { url: 'http://127.0.0.1:9' } } },
      channels: {
        tg: {
          kind: 'bot-token',
          platform: 'telegram',
          botToken: fake.token,
          publicUrl: 'https://hooks.example.com',
          apiBaseUrl: fake.url,
        },
      },
    });
    store = await openChannelStore(config.storage, { role: 'setup' });
    await store.saveGrant(
      {
        name: 'tg',
        kind: 'bot-token',
        sealed: sealSecret(
          JSON.stringify({ kind: 'bot-token', secretToken: 'the-secret-token-0123456789' }),
          loginKey,
          channelGrantContext('tg'),
        ),
        details: {},
        expiresAt: null,
      },
      Date.now(),
    );
    const sender = createChannelSender(config, { store, secretKeys: serverKey, logger });
    const inbound = channelRoutes(config, { store, secretKeys: serverKey, logger }).routes[0]!;
    server = http.createServer((req, res) => {
      if (req.url!.startsWith('/_gatehouse/'))
        return void sender.handle(req, res).catch((err) => respondWithError(req, res, err, logger));
      void Promise.resolve(inbound.verifier.checkHeaders(req.headers, Date.now())).then((verdict) => {
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(verdict));
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(async () => {
    server.close();
    await store.close();
    await fake.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('a send answers 500 credentials_unreadable and the platform is not called', async () => {
    const reply = await request(url, '/_gatehouse/channels/tg/messages', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ to: '1', text: 'hi' }),
    });
    assert.equal(reply.status, 500);
    assert.equal(reply.json().error.code, 'credentials_unreadable');
    assert.equal(fake.sent.length, 0);
  });

  it('an inbound update is refused as unavailable (503 upstream of this check), not as a forgery', async () => {
    const verdict = (
      await request(url, '/webhook/channels/tg', {
        headers: { 'x-telegram-bot-api-secret-token': 'the-secret-token-0123456789' },
      })
    ).json();
    assert.equal(verdict.ok, false);
    assert.equal(verdict.unavailable, true);
    assert.match(verdict.reason, /not the key it was stored with/);
  });

  it("after a rotation, with the login's key in GATEHOUSE_SECRET_KEY_PREVIOUS: the grant opens again, so updates are checked against it (a wrong token is a forgery)", async () => {
    const rotated = { current: serverKey.current, previous: [loginKey.current] };
    const verifier = channelRoutes(config, { store, secretKeys: rotated, logger }).routes[0]!.verifier;
    assert.deepEqual(
      await verifier.checkHeaders({ 'x-telegram-bot-api-secret-token': 'the-secret-token-0123456789' }, Date.now()),
      { ok: true },
    );
    const refused = await verifier.checkHeaders(
      { 'x-telegram-bot-api-secret-token': 'another-token-0123456789abc' },
      Date.now(),
    );
    assert.equal(refused.ok, false);
    assert.equal(
      (refused as { unavailable?: boolean }).unavailable,
      undefined,
      'a wrong token is a forgery again, not an unreadable grant',
    );
  });
});
