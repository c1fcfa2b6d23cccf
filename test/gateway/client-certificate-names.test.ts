import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { splitAltNames } from '../../src/http/tls.js';

// Node's subjectAltName text: entries joined by ", ", a value with a separator or quote written as a
// JSON string (CVE-2021-44532). A value must never split into entries that pose as others.

describe('splitAltNames', () => {
  it('splits plain entries', () => {
    assert.deepEqual(splitAltNames('URI:spiffe://corp/a, DNS:orders.internal, IP Address:127.0.0.1'), [
      'URI:spiffe://corp/a',
      'DNS:orders.internal',
      'IP Address:127.0.0.1',
    ]);
  });

  it('keeps a quoted value whole, separators and escapes included', () => {
    assert.deepEqual(splitAltNames('URI:"spiffe://corp/x, DNS:orders.internal", DNS:a.example'), [
      'URI:spiffe://corp/x, DNS:orders.internal',
      'DNS:a.example',
    ]);
    assert.deepEqual(splitAltNames('DNS:"a\\"b\\u000d\\u000ac"'), ['DNS:a"b\r\nc']);
  });

  it('refuses text that is not Node’s format (an unterminated quote)', () => {
    assert.throws(() => splitAltNames('URI:"spiffe://x'), /malformed subjectAltName/);
  });
});
