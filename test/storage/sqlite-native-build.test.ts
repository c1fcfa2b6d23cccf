import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, test } from 'node:test';
import { UsageError } from '../../src/errors.js';
import { assertSafeSqliteBuild, unsafeBuildProblem } from '../../src/storage/sqlite/database.js';

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-addon-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const installed = path.join(
  path.dirname(createRequire(import.meta.url).resolve('better-sqlite3/package.json')),
  'build',
  'Release',
  'better_sqlite3.node',
);

// The abort of nodejs/node#65446, reproduced: statements dropped by the hundred thousand are collected
// by GCs the allocation triggers; a build against Node 24.19+ headers dies with SIGABRT on the first.
// This proves the build the suite runs on (each Node major in CI) is one that survives it.
test('the installed better-sqlite3 survives the garbage collection of many statements', () => {
  const script = `
    const Database = require(${JSON.stringify(createRequire(import.meta.url).resolve('better-sqlite3'))});
    const db = new Database(':memory:');
    let junk = [];
    for (let i = 0; i < 300000; i++) { db.prepare('SELECT 1'); if (i % 1000 === 0) junk = []; junk.push(new Array(100).fill(i)); }
    process.stdout.write('collected');`;
  const run = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 60_000 });
  assert.equal(run.signal, null, `aborted by ${run.signal}: ${run.stderr.slice(0, 600)}`);
  assert.equal(run.status, 0, run.stderr.slice(0, 600));
  assert.equal(run.stdout, 'collected');
});

test('the installed better-sqlite3 build is accepted', () => {
  assert.equal(unsafeBuildProblem(installed), null);
  assert.doesNotThrow(() => assertSafeSqliteBuild());
});

test('a build that imports RemoveEnvironmentCleanupHook is refused, naming the file and the fixes', () => {
  const bad = path.join(dir, 'bad.node');
  copyFileSync(installed, bad);
  // What a build against Node 24.19+ headers adds to the addon's dynamic symbols (Itanium mangling).
  writeFileSync(bad, '\0_ZN4node28RemoveEnvironmentCleanupHookEPN2v87IsolateEPFvPvES3_\0', { flag: 'a' });
  assert.throws(
    () => assertSafeSqliteBuild(bad),
    (err: unknown) => {
      assert.ok(err instanceof UsageError);
      assert.match(err.message, new RegExp(`native module \\(${bad.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}\\)`));
      assert.match(err.message, /nodejs\/node#65446/);
      assert.match(err.message, /24\.18\.1 headers/);
      assert.match(err.message, /storage\.driver "postgres"/);
      return true;
    },
  );
});

test('an addon that cannot be read is left to the loader to report', () => {
  assert.equal(unsafeBuildProblem(path.join(dir, 'missing.node')), null);
});
