import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, it } from 'node:test';
import { generatedFiles, undescribedKeys } from '../../scripts/docs.js';
import { configJsonSchema } from '../../src/config/json-schema.js';
import { ROOT } from '../helpers/process.js';

describe('configuration reference (docs/configuration.md and gateway.schema.json, generated from the schema)', () => {
  it('every config key has a description in the zod schema', () => {
    const missing = undescribedKeys();
    assert.deepEqual(
      missing,
      [],
      `keys without a description: ${missing.join(', ')}; add .describe('…') to each in src/config/sections/, then run \`npm run docs\``,
    );
  });

  it('gateway.schema.json keeps each description on its property, also where a leaf takes ${VAR} or { file } (editors show it on hover)', () => {
    const missing = undescribedKeys(configJsonSchema());
    assert.deepEqual(missing, [], `properties of gateway.schema.json without a description: ${missing.join(', ')}`);
  });

  it('the committed gateway.schema.json and docs/configuration.md are what `npm run docs` generates now', () => {
    for (const [file, expected] of Object.entries(generatedFiles())) {
      const name = path.relative(ROOT, file);
      let committed: string;
      try {
        committed = readFileSync(file, 'utf8');
      } catch {
        assert.fail(`${name} is missing: run \`npm run docs\``);
      }
      assert.ok(
        committed === expected,
        `${name} is out of date with the schema in src/config/: run \`npm run docs\` and commit the result`,
      );
    }
  });

  it('the reference lists keys at every depth, with type, default and description', () => {
    const reference = generatedFiles()[path.join(ROOT, 'docs', 'configuration.md')]!;
    const row = (key: string) => reference.split('\n').find((line) => line.startsWith(`| \`${key}\` |`));
    assert.match(row('gateway.auth.apiKeys[].rateLimit.per') ?? '', /\| period like "1m" \| required \| .+ \|$/);
    assert.match(row('gateway.listen.port') ?? '', /\| integer 0–65535 \| `8080` \| .+ \|$/);
    assert.match(row('webhooks.delivery.retryFor') ?? '', /\| duration like "72h" \| `"72h"` \| .+ \|$/);
    assert.match(
      reference,
      /### `storage` with `driver: "postgres"`\n\n[^#]*\| `storage\.url` \| postgres:\/\/ URL \| required \|/,
    );
    assert.match(reference, /### `webhooks\.endpoints\[\]\.verify` with `type: "github"`/);
    assert.match(reference, /### `channels\.<name>` with `kind: "oauth-bot"`/);
    assert.match(reference, /\[Config files\]\(config-files\.md\)/);
  });
});
