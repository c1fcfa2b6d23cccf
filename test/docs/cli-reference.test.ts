import assert from 'node:assert/strict';
import { before, describe, it } from 'node:test';
import { allCommands, type CliCommand, loadCliTree } from './cli-tree.js';
import { codeSpans, docFiles, readDoc, splitFences } from './markdown.js';

/**
 * docs/cli.md documents each command under a heading that is its full name (`### gatehouse storage copy`),
 * followed by a table whose first column holds its flags (`-c, --config <file>`). `-h, --help`, which
 * every command has, is said once at the top rather than in each table.
 */
function documentedCommands(): Map<string, { line: number; flags: string[] }> {
  const documented = new Map<string, { line: number; flags: string[] }>();
  let current: { line: number; flags: string[] } | undefined;
  splitFences(readDoc('docs/cli.md')).prose.forEach((line, i) => {
    const heading = /^#{1,6}\s+(.*?)\s*$/.exec(line);
    if (heading) {
      const name = heading[1]!.replace(/`/g, '');
      current = /^gatehouse( [a-z][a-z0-9-]*)*$/.test(name) ? { line: i + 1, flags: [] } : undefined;
      if (current) {
        assert.ok(!documented.has(name), `docs/cli.md:${i + 1}: ${name} is documented twice`);
        documented.set(name, current);
      }
      return;
    }
    const row = /^\|([^|]*)\|/.exec(line);
    if (current && row && !/^\s*:?-+:?\s*$/.test(row[1]!)) {
      for (const flag of row[1]!.matchAll(/(?<![\w-])--?[a-zA-Z][\w-]*/g)) current.flags.push(flag[0]);
    }
  });
  return documented;
}

/** A command line as the docs show it, checked against the tree: the reason it would not run, or undefined. */
function checkCommandLine(root: CliCommand, words: string[]): string | undefined {
  let command = root;
  let open = false; // `gatehouse channels …`: any of its subcommands
  for (let i = 1; i < words.length; i++) {
    const word = words[i]!.replace(/^\[+/, '').replace(/[\]]+$/, '');
    if (word === '' || word === '\\' || word === 'options' || word === 'command') continue;
    if (word === '…' || word === '...') {
      open = true;
      continue;
    }
    if (word.startsWith('-')) {
      const flag = word.split('=')[0]!;
      if (flag === '--help' || flag === '-h' || (command === root && (flag === '--version' || flag === '-V'))) {
        open = true;
        continue;
      }
      if (!command.longFlags.includes(flag) && !command.shortFlags.includes(flag))
        return `${command.name} has no flag ${flag}`;
      if (command.valued.has(flag) && !word.includes('=')) i++;
      continue;
    }
    if (command.subcommands.size > 0 && word.includes('|')) {
      // `deliveries list|show|retry|purge`: each must be a subcommand; what follows is not checked.
      const unknown = word.split('|').filter((name) => !command.subcommands.has(name));
      return unknown.length > 0 ? `${command.name} has no subcommand ${unknown.join(', ')}` : undefined;
    }
    if (command.subcommands.size > 0) {
      const sub = command.subcommands.get(word);
      if (!sub) return `${command.name} has no subcommand ${word}`;
      command = sub;
      continue;
    }
    if (!command.takesArguments) return `${command.name} takes no argument (${word})`;
  }
  if (command.subcommands.size > 0 && !open) return `${command.name} needs a subcommand`;
  return undefined;
}

/** The words of a shell command up to where it ends (a comment, a pipe, a redirection, `&&`, `;`, `&`, `)`). */
function wordsOf(text: string): string[] {
  const words: string[] = [];
  for (const raw of text.trim().split(/\s+/)) {
    if (/^(#|\||&&|&|;|>|>>|2>|2>&1|<)/.test(raw)) break;
    const ends = /[;)]$/.test(raw) && !/^\(/.test(raw);
    const word = raw.replace(/[;)]+$/, '').replace(/^["']|["']$/g, '');
    if (word) words.push(word);
    if (ends) break;
  }
  return words;
}

/**
 * Where a gatehouse command starts in a line of a shell block: the start of the line (after a `$ `
 * prompt), after `&&`, `;`, `(` or `$(`, or after `docker [compose] exec [-T] <container>`.
 */
const COMMAND_START =
  /(?:^\s*(?:\$\s+)?|&&\s*|;\s*|\$?\(\s*|\bexec\s+(?:-T\s+)?[\w.-]+\s+)(?:npx\s+)?(gatehouse|node\s+\S*bin\/gatehouse\.js)(?=\s|$)/g;
const NOT_SHELL = new Set([
  'text',
  'json',
  'json5',
  'jsonc',
  'yaml',
  'yml',
  'js',
  'javascript',
  'ts',
  'typescript',
  'http',
  'ini',
  'toml',
]);

describe('docs/cli.md matches the CLI', () => {
  let root: CliCommand;
  before(async () => {
    root = await loadCliTree();
  });

  it('every command of the CLI is documented, and every documented command exists', () => {
    const documented = documentedCommands();
    const inCli = allCommands(root).map((command) => command.name);
    assert.deepEqual(
      {
        missingFromDocs: inCli.filter((name) => !documented.has(name)),
        notInCli: [...documented.keys()].filter((name) => !inCli.includes(name)),
      },
      { missingFromDocs: [], notInCli: [] },
    );
  });

  it("each command's flags are the ones documented, both ways", () => {
    const documented = documentedCommands();
    const differences: string[] = [];
    for (const command of allCommands(root)) {
      const docs = documented.get(command.name);
      if (!docs) continue; // reported by the test above
      const inCli = [...command.longFlags, ...command.shortFlags];
      for (const flag of inCli)
        if (!docs.flags.includes(flag)) differences.push(`${command.name}: ${flag} is not in docs/cli.md`);
      for (const flag of docs.flags)
        if (!inCli.includes(flag)) differences.push(`docs/cli.md:${docs.line}: ${command.name} has no flag ${flag}`);
    }
    assert.deepEqual(differences, []);
  });

  it('every gatehouse command the docs show exists, with its flags', () => {
    const problems: string[] = [];
    let checked = 0;
    for (const file of docFiles()) {
      const { prose, blocks } = splitFences(readDoc(file));
      for (const block of blocks) {
        if (NOT_SHELL.has(block.lang)) continue;
        // A line ending in `\` goes on in the next one.
        const lines = block.lines.map((line, i) => ({ line, at: block.line + i }));
        for (let i = lines.length - 2; i >= 0; i--) {
          if (lines[i]!.line.endsWith('\\'))
            lines.splice(i, 2, { line: `${lines[i]!.line.slice(0, -1)} ${lines[i + 1]!.line}`, at: lines[i]!.at });
        }
        lines.forEach(({ line, at }) => {
          for (const start of line.matchAll(COMMAND_START)) {
            const words = ['gatehouse', ...wordsOf(line.slice(start.index! + start[0].length))];
            const why = checkCommandLine(root, words);
            checked++;
            if (why) problems.push(`${file}:${at}: ${words.join(' ')}: ${why}`);
          }
        });
      }
      // Inline code that names a command (`gatehouse storage reseal`), not a log line (`gatehouse started`).
      prose.forEach((line, i) => {
        for (const span of codeSpans(line)) {
          const words = wordsOf(span);
          if (
            words[0] !== 'gatehouse' ||
            words.length < 2 ||
            !(root.subcommands.has(words[1]!) || words[1]!.startsWith('-'))
          )
            continue;
          const why = checkCommandLine(root, words);
          checked++;
          if (why) problems.push(`${file}:${i + 1}: \`${span}\`: ${why}`);
        }
      });
    }
    assert.ok(checked > 50, `only ${checked} command lines found: is the parsing broken?`);
    assert.deepEqual(problems, []);
  });

  it('the command-line check refuses what the CLI would', () => {
    assert.equal(checkCommandLine(root, ['gatehouse', 'storage', 'copy', '--to', 'postgres://x', '--json']), undefined);
    assert.match(checkCommandLine(root, ['gatehouse', 'storage', 'copy', '--from', 'x']) ?? '', /no flag --from/);
    assert.match(checkCommandLine(root, ['gatehouse', 'webhooks', 'delivery', 'list']) ?? '', /no subcommand delivery/);
    assert.match(checkCommandLine(root, ['gatehouse', 'webhooks']) ?? '', /needs a subcommand/);
    assert.match(checkCommandLine(root, ['gatehouse', 'storage', 'migrate', 'now']) ?? '', /takes no argument/);
  });
});
