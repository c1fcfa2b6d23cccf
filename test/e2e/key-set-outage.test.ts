import assert from 'node:assert/strict';
import http from 'node:http';
import { mkdtempSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { generateKeyPair, SignJWT } from 'jose';
import { startTestGatehouse, testConfig, type TestGatehouse } from '../helpers/gatehouse.js';
import { request } from '../helpers/http.js';
import { startRecordingUpstream, type RecordingServer } from '../helpers/upstream.js';

/*
 * When the identity provider's key set cannot be fetched, a valid-looking token is not the
 * client's failure: 503 with Retry-After, nothing forwarded, and no lockout count (else an IdP
 * outage would lock every client, or Google's push servers, out).
 */
describe('key set outage: 503, never 401 + lockout', () => {
  let upstream: RecordingServer;
  let jwks: http.Server;
  let gatehouse: TestGatehouse;
  let token: string;

  before(async () => {
    upstream = await startRecordingUpstream();
    // A JWKS endpoint that is down (500) for the whole test.
    jwks = http.createServer((_req, res) => {
      res.writeHead(500);
      res.end();
    });
    await new Promise<void>((r) => jwks.listen(0, '127.0.0.1', r));
    const jwksUri = `http://127.0.0.1:${(jwks.address() as AddressInfo).port}/jwks.json`;
    const { privateKey } = await generateKeyPair('RS256');
    token = await new SignJWT({ sub: 'u', email: 'push@p.iam.gserviceaccount.com', email_verified: true })
      .setProtectedHeader({ alg: 'RS256', kid: 'k1' })
      .setIssuer('https://accounts.google.com')
      .setAudience('aud')
      .setExpirationTime('1h')
      .sign(privateKey);
    gatehouse = await startTestGatehouse(
      testConfig(upstream.url, {
        storage: { path: path.join(mkdtempSync(path.join(tmpdir(), 'gatehouse-outage-')), 'db.sqlite') },
        gateway: { auth: { bearer: { jwt: { jwksUri, jwksCooldownSeconds: 0 } }, failures: { max: 3 } } },
        webhooks: {
          enabled: true,
          listen: { port: 0 },
          endpoints: [
            {
              path: '/webhook/pubsub',
              action: 'system-event',
              verify: {
                type: 'pubsub-oidc',
                audience: 'aud',
                serviceAccountEmail: 'push@p.iam.gserviceaccount.com',
                jwksUri,
              },
            },
          ],
          targets: { 'system-event': { url: `${upstream.url}/events` } },
        },
      }),
    );
  });
  after(async () => {
    await gatehouse.close();
    await upstream.close();
    jwks.close();
  });

  it('/api/ bearer: 503 auth_unavailable with Retry-After, more times than failures.max, upstream untouched', async () => {
    for (let i = 0; i < 5; i++) {
      const reply = await request(gatehouse.url, '/api/x', { headers: { authorization: `Bearer ${token}` } });
      assert.equal(reply.status, 503);
      assert.equal(reply.json().error.code, 'auth_unavailable');
      assert.equal(reply.headers['retry-after'], '5');
    }
    assert.equal(upstream.received.length, 0);
  });

  it('pubsub-oidc webhook: 503, nothing stored, and the sender is not locked out', async () => {
    for (let i = 0; i < 5; i++) {
      const reply = await request(gatehouse.webhooks!.url, '/webhook/pubsub', {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body: '{"message":{"data":"e30=","messageId":"1"},"subscription":"s"}',
      });
      assert.equal(reply.status, 503);
      assert.equal(reply.json().error.code, 'auth_unavailable');
    }
    assert.equal((await gatehouse.webhooks!.store.list({})).length, 0);
    assert.equal(upstream.received.length, 0);
  });
});
