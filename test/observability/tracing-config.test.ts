import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { redactSecrets } from '../../src/cli/config.js';
import { parseConfig } from '../../src/config/load.js';
import { ConfigError } from '../../src/errors.js';
import { tracesUrl } from '../../src/observability/otel.js';
import { runCli } from '../helpers/process.js';

const base = {
  gateway: {
    upstream: { target: 'http://127.0.0.1:3000' },
    auth: { apiKey: 'tracing-config-key-0123456789abcdefghij' },
  },
};

function problemsOf(tracing: unknown): readonly string[] {
  try {
    parseConfig({ ...base, observability: { tracing } });
  } catch (err) {
    assert.ok(err instanceof ConfigError);
    return err.problems;
  }
  return [];
}

describe('observability.tracing: the config', () => {
  it('off unless configured; with an endpoint alone, the defaults', () => {
    assert.equal(parseConfig(base).observability.tracing, undefined);
    assert.deepEqual(
      parseConfig({ ...base, observability: { tracing: { endpoint: 'http://collector:4318' } } }).observability.tracing,
      {
        exporter: 'otlp',
        endpoint: 'http://collector:4318',
        sampleRatio: 1,
        serviceName: 'gatehouse',
        maxQueueSize: 2048,
      },
    );
  });

  it('each mistake at its path with its reason: a URL without a scheme, a ratio outside 0..1, another exporter, no endpoint', () => {
    assert.deepEqual(problemsOf({ endpoint: 'collector:4318', sampleRatio: 1.5 }), [
      'observability.tracing.endpoint: endpoint must be an absolute http(s) URL: the scheme is missing in "collector:4318" (e.g. "http://collector:4318")',
      'observability.tracing.sampleRatio: sampleRatio must be from 0 to 1',
    ]);
    assert.deepEqual(problemsOf({ endpoint: 'ftp://collector', sampleRatio: -0.1, exporter: 'zipkin' }), [
      'observability.tracing.exporter: exporter must be "otlp" (OTLP/HTTP with JSON bodies)',
      'observability.tracing.endpoint: endpoint must use http or https, got "ftp:"',
      'observability.tracing.sampleRatio: sampleRatio must be from 0 to 1',
    ]);
    // The exporter drops a URL's user and password without a word (found by an outside attack): refused.
    assert.deepEqual(problemsOf({ endpoint: 'http://user:secret@collector:4318' }), [
      "observability.tracing.endpoint: endpoint must not carry a user or password (the exporter would not send them): put the collector's credentials in headers",
    ]);
    assert.deepEqual(problemsOf({ endpoint: 'not a url' }).length, 1);
    assert.equal(problemsOf({ sampleRatio: 0 }).length, 1);
    assert.match(problemsOf({ sampleRatio: 0 })[0]!, /^observability\.tracing\.endpoint: /);
  });

  it('gatehouse config check: exit 1, the path and the reason, no stack', async () => {
    const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-tracing-config-'));
    const file = path.join(dir, 'gateway.json5');
    writeFileSync(
      file,
      JSON.stringify({ ...base, observability: { tracing: { endpoint: 'http://c:4318', sampleRatio: 2 } } }),
    );
    const result = await runCli(['config', 'check', '--config', file]);
    assert.equal(result.code, 1);
    assert.match(result.stderr, /^ {2}- observability\.tracing\.sampleRatio: sampleRatio must be from 0 to 1$/m);
    assert.doesNotMatch(result.stderr, /\n\s+at /, 'no stack');
  });

  it("config print hides every value of the collector's headers", () => {
    const config = parseConfig({
      ...base,
      observability: {
        tracing: { endpoint: 'http://c:4318', headers: { authorization: 'Bearer t0ken', 'x-team': 'k3y' } },
      },
    });
    const printed = JSON.stringify(redactSecrets(config));
    assert.ok(!printed.includes('t0ken') && !printed.includes('k3y'), printed);
    assert.match(printed, /"headers":\{"authorization":"\[redacted\]","x-team":"\[redacted\]"\}/);
  });

  it('spans go to <endpoint>/v1/traces, as OTEL_EXPORTER_OTLP_ENDPOINT does; a URL already ending so is kept', () => {
    assert.equal(tracesUrl('http://collector:4318'), 'http://collector:4318/v1/traces');
    assert.equal(tracesUrl('https://otlp.example/base/'), 'https://otlp.example/base/v1/traces');
    assert.equal(tracesUrl('http://c:4318/v1/traces'), 'http://c:4318/v1/traces');
  });
});
