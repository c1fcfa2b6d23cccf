import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { ROOT, runCli } from '../helpers/process.js';

describe('gatehouse config schema', () => {
  it('prints the JSON Schema generated from the zod schema, and the committed gateway.schema.json is that (run `gatehouse config schema > gateway.schema.json` after a schema change)', async () => {
    const result = await runCli(['config', 'schema']);
    assert.equal(result.code, 0, result.stderr);
    const printed = JSON.parse(result.stdout);
    const committed = JSON.parse(readFileSync(path.join(ROOT, 'gateway.schema.json'), 'utf8'));
    assert.deepEqual(committed, printed, 'gateway.schema.json is out of date: regenerate it with `gatehouse config schema > gateway.schema.json`');

    // What an editor needs from it: defaults, closed objects, and room for ${VAR} and { file }.
    assert.equal(printed.$schema, 'https://json-schema.org/draft/2020-12/schema');
    const gateway = printed.properties.gateway;
    assert.equal(gateway.additionalProperties, false);
    const port = gateway.properties.listen.properties.port;
    assert.equal(port.default, 8080);
    assert.ok(port.anyOf.some((alt: { pattern?: string }) => alt.pattern && new RegExp(alt.pattern).test('${PORT}')), 'a port may be "${PORT}"');
    const apiKey = gateway.properties.auth.properties.apiKey;
    assert.ok(apiKey.anyOf.some((alt: { required?: string[] }) => alt.required?.includes('file')), 'apiKey may be { file }');
    assert.equal(printed.properties.webhooks.properties.delivery.properties.retryFor.default, '72h');
  });
});
