import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { ROOT } from '../helpers/process.js';

// bin/gatehouse.js is copied into a package of its own, so the real dist/ (which other tests and
// processes use) is never touched.
const dirs: string[] = [];
function packageWithBin(dist?: Record<string, string>): string {
  const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-bin-'));
  dirs.push(dir);
  cpSync(path.join(ROOT, 'bin'), path.join(dir, 'bin'), { recursive: true });
  writeFileSync(
    path.join(dir, 'package.json'),
    JSON.stringify({ name: 'gatehouse', version: '0.0.0', type: 'module' }),
  );
  if (dist) {
    mkdirSync(path.join(dir, 'dist'));
    for (const [name, text] of Object.entries(dist)) writeFileSync(path.join(dir, 'dist', name), text);
  }
  return dir;
}
function runBin(dir: string, args: string[]) {
  return spawnSync(process.execPath, [path.join(dir, 'bin/gatehouse.js'), ...args], {
    encoding: 'utf8',
    timeout: 30_000,
  });
}
after(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

describe('bin/gatehouse.js', () => {
  it('without dist/: exit 1 and what to run on stderr, not a module-not-found stack', () => {
    const dir = packageWithBin();
    const result = runBin(dir, ['--version']);
    assert.equal(result.status, 1);
    assert.equal(result.stdout, '');
    assert.match(result.stderr, /^gatehouse: the compiled CLI is missing \(.*dist[/\\]bin\.js\)\.$/m);
    assert.match(result.stderr, /npm run build/);
    assert.doesNotMatch(result.stderr, /ERR_MODULE_NOT_FOUND|\n\s+at /);
  });

  it('with dist/: runs dist/bin.js with the arguments', () => {
    const dir = packageWithBin({ 'bin.js': 'process.stdout.write(JSON.stringify(process.argv.slice(2)));\n' });
    const result = runBin(dir, ['config', 'check', '--config', 'x.json5']);
    assert.equal(result.status, 0, result.stderr);
    assert.deepEqual(JSON.parse(result.stdout), ['config', 'check', '--config', 'x.json5']);
  });

  it('a dependency missing from an install still fails loudly (the check does not hide it)', () => {
    const dir = packageWithBin({ 'bin.js': "import 'gatehouse-no-such-dependency';\n" });
    const result = runBin(dir, ['--version']);
    assert.notEqual(result.status, 0);
    assert.match(result.stderr, /ERR_MODULE_NOT_FOUND/);
    assert.match(result.stderr, /gatehouse-no-such-dependency/);
    assert.doesNotMatch(result.stderr, /npm run build/);
  });
});
