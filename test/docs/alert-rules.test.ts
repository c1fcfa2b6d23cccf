import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { describe, it } from 'node:test';
import { readDoc, ROOT, splitFences } from './markdown.js';
import { promtoolMissing } from '../helpers/promtool.js';

// The example alert rules: examples/prometheus/alerts.yml (shipped in the package) and the copy in
// docs/observability.md. Their expressions are tested against a running gatehouse in
// test/e2e/alert-rules.test.ts.

const EXAMPLE = 'examples/prometheus/alerts.yml';

/** The yaml blocks of the "## Example alert rules" section, in order. */
function sectionRules(): string[] {
  const { prose, blocks } = splitFences(readDoc('docs/observability.md'));
  const section = prose.findIndex((line) => line === '## Example alert rules');
  assert.ok(section >= 0, 'no "## Example alert rules" section');
  const next = prose.findIndex((line, i) => i > section && line.startsWith('## '));
  const rules = blocks.filter(
    (block) => block.lang === 'yaml' && block.line > section && (next === -1 || block.line < next),
  );
  assert.ok(rules.length > 0, 'no yaml block in the section');
  return rules.map((block) => `${block.lines.join('\n')}\n`);
}

function checkRules(text: string): string {
  const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-rules-'));
  try {
    const file = path.join(dir, 'rules.yml');
    writeFileSync(file, text);
    return execFileSync('promtool', ['check', 'rules', file], { encoding: 'utf8' });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('the example alert rules', () => {
  it('docs/observability.md shows examples/prometheus/alerts.yml as it is, in its first yaml block', () => {
    assert.equal(sectionRules()[0], readFileSync(path.join(ROOT, EXAMPLE), 'utf8'));
  });

  it(`parse with promtool check rules: ${EXAMPLE} and every block of the section`, { skip: promtoolMissing }, () => {
    const out = execFileSync('promtool', ['check', 'rules', path.join(ROOT, EXAMPLE)], { encoding: 'utf8' });
    assert.match(out, /SUCCESS: \d+ rules found/);
    for (const block of sectionRules()) assert.match(checkRules(block), /SUCCESS: \d+ rules found/);
  });

  it('the file has a rule for each state an operator is paged for', () => {
    const alerts = [...readFileSync(path.join(ROOT, EXAMPLE), 'utf8').matchAll(/- alert: (\w+)/g)].map((m) => m[1]);
    for (const wanted of [
      'GatehouseDown',
      'GatehouseNotReady',
      'GatehouseWebhooksUnavailable',
      'GatehouseDeliveryLag',
      'GatehouseDeadLettersGrowing',
      'GatehouseLockoutsSpiking',
      'GatehouseCertificateExpiring',
      'GatehouseConfigReloadRejected',
    ])
      assert.ok(alerts.includes(wanted), `${wanted} is missing`);
  });
});
