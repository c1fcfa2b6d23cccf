import assert from 'node:assert/strict';
import type { IncomingMessage } from 'node:http';
import { describe, it } from 'node:test';
import { checkApiPath } from '../../src/gateway/path-gate.js';

/** The path gate reads only the raw request target. */
function gate(url: string) {
  return checkApiPath({ url } as IncomingMessage);
}

function assertRejected(url: string, code: 'not_found' | 'invalid_path', status: number) {
  const error = gate(url);
  assert.ok(error, `${JSON.stringify(url)} should be rejected`);
  assert.equal(error.code, code, `code for ${JSON.stringify(url)}`);
  assert.equal(error.status, status, `status for ${JSON.stringify(url)}`);
}

describe('path gate: unambiguous paths under /api/ are forwarded', () => {
  for (const url of [
    '/api/x',
    '/api/a/b?q=1&x=%2F',
    '/api/%41',
    '/api/',
    '/api/v1/items-42_~.json',
    "/api/x?q=a'b&r=..%2f",
  ]) {
    it(`allows ${url}`, () => {
      assert.equal(gate(url), undefined);
    });
  }
});

describe('path gate: anything not under /api/ is 404 not_found', () => {
  const outside = [
    '/',
    '',
    '/api',
    '/api?x=/api/',
    '/API/s',
    '/%61pi/s', // encoded "a": the gate never decodes, so this is not /api/
    '/x/../api/s',
    '//api/s',
    'http://h/api/x', // absolute-form request target
    '/api%2fs', // encoded slash: does not start with /api/
    '/api;/s', // path parameter on the prefix segment
    '/api\\s',
    '*',
  ];
  for (const url of outside) {
    it(`rejects ${JSON.stringify(url)}`, () => assertRejected(url, 'not_found', 404));
  }
});

describe('path gate: ambiguous paths under /api/ are 400 invalid_path', () => {
  const ambiguous = [
    '/api/../admin',
    '/api/./x',
    '/api/x/..',
    '/api/x/.?q=1',
    '/api/%2e%2e/admin',
    '/api/%2E%2e/x',
    '/api/.%2e/x',
    '/api/a%2fb',
    '/api/a%2Fb',
    '/api/a%5cb',
    '/api/a\\b',
    '/api/a%00b',
    '/api/a;b',
    '/api/a%3bb',
    '/api/a//b',
    '/api/%252e',
    '/api/%zz',
    '/api/%2',
    '/api/%u002e',
    '/api/a%3fb',
    '/api/a%23b',
    "/api/a'b",
    '/api/a b',
    '/api/a#b',
    '/api/a"b',
    '/api/a<b',
    '/api/caf\u00e9',
    // Encoded control characters (found by an outside attack: a decoded line break dodged every rule).
    '/api/a%0ab',
    '/api/a%0Db',
    '/api/a%09b',
    '/api/a%1fb',
    '/api/a%7Fb',
  ];
  for (const url of ambiguous) {
    it(`rejects ${JSON.stringify(url)}`, () => assertRejected(url, 'invalid_path', 400));
  }
});
