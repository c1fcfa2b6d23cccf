import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { readDoc, splitFences } from './markdown.js';

function promtool(): string | undefined {
  try {
    execFileSync('promtool', ['--version'], { stdio: 'ignore' });
    return 'promtool';
  } catch {
    return undefined;
  }
}

describe('docs/observability.md: the example alert rules', () => {
  it(
    'parse with promtool check rules (skipped without promtool: apt-get install prometheus)',
    { skip: promtool() === undefined },
    () => {
      const { prose, blocks } = splitFences(readDoc('docs/observability.md'));
      const section = prose.findIndex((line) => line === '## Example alert rules');
      assert.ok(section >= 0, 'no "## Example alert rules" section');
      const rules = blocks.find((block) => block.lang === 'yaml' && block.line > section);
      assert.ok(rules, 'no yaml block in the section');
      const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-rules-'));
      try {
        const file = path.join(dir, 'rules.yml');
        writeFileSync(file, `${rules.lines.join('\n')}\n`);
        const out = execFileSync('promtool', ['check', 'rules', file], { encoding: 'utf8' });
        assert.match(out, /SUCCESS: \d+ rules found/);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );
});
