import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { environmentWithFiles, readEnvFile } from '../../src/config/env-file.js';
import { UsageError } from '../../src/errors.js';

const dir = mkdtempSync(path.join(tmpdir(), 'gatehouse-env-file-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let count = 0;
function envFile(text: string): string {
  const file = path.join(dir, `env-${++count}`);
  writeFileSync(file, text);
  return file;
}

/** The one-line problem readEnvFile throws for `text`. */
function problemOf(text: string): string {
  const file = envFile(text);
  try {
    readEnvFile(file);
  } catch (err) {
    assert.ok(err instanceof UsageError, String(err));
    assert.ok(!err.message.includes('\n'), err.message);
    return err.message.slice(`env file ${file}: `.length);
  }
  assert.fail(`accepted: ${JSON.stringify(text)}`);
}

describe('env files: what systemd and util.parseEnv read alike is accepted', () => {
  it('assignments, export, comments (# and ;), quotes, multi-line quoted values, CRLF', () => {
    const values = readEnvFile(
      envFile(
        [
          '# a comment',
          '; systemd also takes this one',
          '',
          'PLAIN=abc123',
          '  INDENTED = spaced out  ',
          'export EXPORTED=yes',
          'EMPTY=',
          'EQUALS=a=b=c',
          `SINGLE='x#y z\\w "q"'`,
          'DOUBLE="a # b \'c\'"',
          'PEM="-----BEGIN KEY-----',
          '# not a comment inside quotes',
          '-----END KEY-----"',
          'LATER=1',
          'LATER=2',
        ].join('\r\n') + '\r\n',
      ),
    );
    assert.deepEqual(
      { ...values },
      {
        PLAIN: 'abc123',
        INDENTED: 'spaced out',
        EXPORTED: 'yes',
        EMPTY: '',
        EQUALS: 'a=b=c',
        SINGLE: 'x#y z\\w "q"',
        DOUBLE: "a # b 'c'",
        PEM: '-----BEGIN KEY-----\n# not a comment inside quotes\n-----END KEY-----',
        LATER: '2',
      },
    );
  });

  it('refuses, with the line, what util.parseEnv would read silently otherwise (or systemd differently)', () => {
    const cases: [string, RegExp][] = [
      ['A=1\nnot an assignment\n', /^line 2: not NAME=value \(a comment line starts with #\)$/],
      ['1ABC=x\n', /^line 1: not NAME=value: a name is letters/],
      ['export\tTAB=x\n', /^line 1: not NAME=value/],
      ['SECRET=abc#def\n', /^line 1: an unquoted value holding #: put the whole value in single quotes/],
      ['A=x\nB=a\\b\n', /^line 2: an unquoted value holding \\/],
      ['A=it"s\n', /^line 1: an unquoted value holding "/],
      ['A=`cmd`\n', /^line 1: an unquoted value holding `/],
      ['A="has \\"escaped\\" quotes"\n', /^line 1: a backslash inside double quotes/],
      ['A="open\nB=2\n', /^line 1: the double quote is never closed$/],
      ["A='x'y\n", /^line 1: text after the closing quote/],
      ['A="x" # comment\n', /^line 1: text after the closing quote/],
      ['A="multi\nline" tail\n', /^line 2: text after the closing quote/],
      ['__proto__=x\n', /^line 1: __proto__ cannot be read by Node's util\.parseEnv$/],
    ];
    for (const [text, expected] of cases) assert.match(problemOf(text), expected, JSON.stringify(text));
  });

  it('a named pipe nobody writes to, or a huge file, is refused at once, not read (outside attack: a FIFO held every listener at a reload)', () => {
    const fifo = path.join(dir, 'fifo');
    execFileSync('mkfifo', [fifo]); // opened blocking, the test would hang here
    assert.throws(() => readEnvFile(fifo), {
      name: 'UsageError',
      message: `env file ${fifo} is not a regular file (a pipe, socket or device)`,
    });
    const huge = envFile(`A=${'x'.repeat(2 * 1024 * 1024)}\n`);
    assert.throws(() => readEnvFile(huge), { name: 'UsageError', message: /is 2097155 bytes: more than 1048576/ });
  });

  it('a missing file is one line naming its absolute path', () => {
    const file = path.join(dir, 'absent');
    assert.throws(() => readEnvFile(path.relative(process.cwd(), file)), {
      name: 'UsageError',
      message: `env file ${file} does not exist`,
    });
  });
});

describe('environmentWithFiles: the view ${VAR} is expanded from', () => {
  it('a file wins over the process environment, a later file over an earlier one; the rest comes through', () => {
    const first = envFile('A=first\nB=first\n');
    const second = envFile('B=second\n');
    const view = environmentWithFiles([first, second], { A: 'process', C: 'process', PATH: '/bin' });
    assert.deepEqual({ ...view }, { A: 'first', B: 'second', C: 'process', PATH: '/bin' });
  });

  it('without files it is the environment itself; with them, process.env is left alone', () => {
    const base = { A: 'process' };
    assert.equal(environmentWithFiles([], base), base);
    const before = { ...process.env };
    environmentWithFiles([envFile('GATEHOUSE_TEST_ONLY_IN_FILE=1\n')]);
    assert.deepEqual({ ...process.env }, before);
  });

  it('a variable named like an Object member is an ordinary variable', () => {
    const view = environmentWithFiles([envFile('constructor=c\ntoString=t\n')], {});
    assert.equal(view.constructor, 'c');
    assert.equal(view.toString, 't');
  });
});
