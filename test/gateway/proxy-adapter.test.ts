import { describe, it } from 'node:test';
import { createUpstreamProxy } from '../../src/gateway/proxy.js';

// src/gateway/proxy.ts is the only file that reaches into http-proxy (under http-proxy-middleware):
// it removes the `deleteLength` web pass (test/e2e/smuggling.test.ts shows why). An upgrade that
// renames or drops that internal makes the adapter refuse to build, and this test say so.
describe('the http-proxy adapter', () => {
  it('finds the internals it changes in the installed http-proxy', () => {
    const proxy = createUpstreamProxy({ target: 'http://127.0.0.1:9', timeoutMs: 1_000 }, () => undefined);
    proxy.close();
  });
});
