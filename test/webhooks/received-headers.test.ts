import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  CUT_KEY,
  MAX_HEADER_VALUE,
  MAX_HEADERS_JSON,
  recordedHeaders,
  REDACTED,
  SHOWN_HEADERS,
} from '../../src/webhooks/received-headers.js';
import { ResponseSnippet, RESPONSE_DRAIN_BYTES } from '../../src/webhooks/delivery/deliverer.js';

describe('recordedHeaders', () => {
  it("keeps the values of HTTP's and the senders' event headers; every other value is redacted, credentials under any name", () => {
    const credentials = [
      'authorization', // Pub/Sub push's Bearer token
      'proxy-authorization',
      'cookie',
      'x-api-key',
      'x-webhook-secret',
      'x-hub-signature', // GitHub
      'x-hub-signature-256',
      'stripe-signature',
      'webhook-signature', // Standard Webhooks
      'x-slack-signature',
      'x-twilio-signature',
      'x-line-signature',
      'x-telegram-bot-api-secret-token',
      'x-gitlab-token',
      'x-shopify-hmac-sha256',
      'x-my-auth',
      'x-session-id',
      // names no list of credentials foresaw (an outside attack): every unknown value is hidden
      'ocp-apim-subscription-key',
      'x-functions-key',
      'verif-hash',
      'x-partner-key',
      'x_api_key',
      'cf-access-jwt-assertion',
      'x-goog-iap-jwt-assertion',
      'x-trello-webhook',
      'plaid-verification',
      'x-request-note',
    ];
    const plain = {
      'content-type': 'application/json',
      'user-agent': 'GitHub-Hookshot/1',
      'x-github-event': 'push',
      'webhook-id': 'msg_1',
      'webhook-timestamp': '1700000000',
      'idempotency-key': 'd-1',
      'x-slack-request-timestamp': '1700000000',
    };
    const headers = { ...plain, ...Object.fromEntries(credentials.map((n) => [n, `value-of-${n}`])) };
    const stored = JSON.parse(recordedHeaders(headers));
    assert.deepEqual(stored, { ...plain, ...Object.fromEntries(credentials.map((n) => [n, REDACTED])) });
    assert.ok(!recordedHeaders(headers).includes('value-of-'));
  });

  it('writes exactly what JSON.stringify would: quotes, backslashes, tabs, Latin-1, repeated Set-Cookie', () => {
    const headers = {
      'user-agent': 'say "hi"',
      'x-request-id': 'C:\\path',
      via: 'a\tb',
      'accept-language': 'caf\u00e9 \u00ff',
      'set-cookie': ['a=1', 'b=2'],
      'x-correlation-id': '',
    };
    assert.equal(recordedHeaders(headers), JSON.stringify({ ...headers, 'set-cookie': REDACTED }));
  });

  it(`cuts values over ${MAX_HEADER_VALUE} characters and leaves out what would take the JSON past ${MAX_HEADERS_JSON}, saying how many`, () => {
    const headers: Record<string, string> = { 'content-type': 'application/json', 'user-agent': 'x'.repeat(5000) };
    const extra = [...SHOWN_HEADERS].filter((n) => !(n in headers)).slice(0, 40);
    for (const name of extra) headers[name] = 'v'.repeat(300);
    const json = recordedHeaders(headers);
    assert.ok(json.length <= MAX_HEADERS_JSON, String(json.length));
    const stored = JSON.parse(json);
    assert.equal(stored['content-type'], 'application/json');
    assert.equal(stored['user-agent'], `${'x'.repeat(MAX_HEADER_VALUE)}…`);
    const kept = extra.filter((n) => n in stored).length;
    assert.ok(kept > 0 && kept < extra.length);
    assert.equal(stored[CUT_KEY], `${extra.length - kept} headers left out`);
  });
});

describe('ResponseSnippet', () => {
  it('keeps the first 512 bytes as UTF-8 text: a character cut at the end left out, invalid bytes and NUL as U+FFFD', () => {
    const snippet = new ResponseSnippet();
    const body = Buffer.concat([Buffer.from('a'.repeat(509)), Buffer.from('€€')]); // € is 3 bytes: the first ends at 512
    assert.equal(snippet.add(body.subarray(0, 100)), true);
    snippet.add(body.subarray(100));
    assert.equal(snippet.text(), `${'a'.repeat(509)}€`);

    const cut = new ResponseSnippet();
    cut.add(Buffer.concat([Buffer.from('a'.repeat(510)), Buffer.from('€')]));
    assert.equal(cut.text(), 'a'.repeat(510), 'the € cut after two of its bytes is left out');

    const odd = new ResponseSnippet();
    odd.add(Buffer.from([0x6f, 0x6b, 0x00, 0xff, 0x21]));
    assert.equal(odd.text(), 'ok\uFFFD\uFFFD!');
    assert.equal(new ResponseSnippet().text(), null, 'no body: null');
  });

  it(`says stop once the body passes ${RESPONSE_DRAIN_BYTES} bytes`, () => {
    const snippet = new ResponseSnippet();
    assert.equal(snippet.add(Buffer.alloc(RESPONSE_DRAIN_BYTES)), true);
    assert.equal(snippet.add(Buffer.alloc(1)), false);
  });
});
