import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { configJsonSchema } from '../../src/config/json-schema.js';
import { runCli } from '../helpers/process.js';

describe('gatehouse config schema', () => {
  it('prints the JSON Schema generated from the zod schema (the committed gateway.schema.json is checked in reference.test.ts)', async () => {
    const result = await runCli(['config', 'schema']);
    assert.equal(result.code, 0, result.stderr);
    assert.deepEqual(JSON.parse(result.stdout), configJsonSchema());
    const printed = JSON.parse(result.stdout);

    // What an editor needs from it: defaults, descriptions, closed objects, and room for ${VAR} and { file }.
    assert.equal(printed.$schema, 'https://json-schema.org/draft/2020-12/schema');
    const gateway = printed.properties.gateway;
    assert.equal(gateway.additionalProperties, false);
    const port = gateway.properties.listen.properties.port;
    assert.equal(port.default, 8080);
    assert.match(port.description, /port/);
    assert.ok(
      port.anyOf.some((alt: { pattern?: string }) => alt.pattern && new RegExp(alt.pattern).test('${PORT}')),
      'a port may be "${PORT}"',
    );
    const apiKey = gateway.properties.auth.properties.apiKey;
    assert.ok(
      apiKey.anyOf.some((alt: { required?: string[] }) => alt.required?.includes('file')),
      'apiKey may be { file }',
    );
    assert.match(apiKey.description, /X-API-Key/);
    // apiKeys are parsed by hand (unknown items to zod), yet an editor still knows an entry's keys.
    const entry = gateway.properties.auth.properties.apiKeys.items;
    assert.deepEqual(Object.keys(entry.properties), ['id', 'hash', 'expiresAt', 'scopes', 'rateLimit']);
    assert.equal(entry.additionalProperties, false);
    assert.equal(printed.properties.webhooks.properties.delivery.properties.retryFor.default, '72h');
    assert.ok(!JSON.stringify(printed).includes('docsType'), 'docs-only hints stay out of the JSON Schema');
  });
});
