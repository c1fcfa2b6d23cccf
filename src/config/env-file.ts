import { closeSync, constants, fstatSync, openSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { parseEnv } from 'node:util';
import { UsageError } from '../errors.js';
import { describeFileError } from './load.js';

/** Far more than any env file: read whole on the main thread at every reload, so bounded. */
const MAX_ENV_FILE_BYTES = 1024 * 1024;

/**
 * `--env-file`: the environment `${VAR}` references are expanded from, read again at every reload.
 *
 * Precedence, as systemd's EnvironmentFile= has it over Environment=: a variable in a file wins
 * over the process environment, and a later file over an earlier one. The other way round (the
 * process environment winning, as docker's `-e` over `--env-file`) would make a variable that
 * was also in the process environment at start (a unit that names the file in EnvironmentFile=
 * too, a shell that sourced it) impossible to rotate by editing the file: the reload would keep
 * the value from the start, which is the failure these files exist to fix.
 */
export function environmentWithFiles(
  files: readonly string[],
  base: NodeJS.ProcessEnv = process.env,
): NodeJS.ProcessEnv {
  if (files.length === 0) return base;
  // No prototype: a variable named like an Object.prototype member is just a variable.
  const view: NodeJS.ProcessEnv = Object.assign(Object.create(null) as NodeJS.ProcessEnv, base);
  for (const file of files) Object.assign(view, readEnvFile(file));
  return view;
}

/**
 * One env file's variables, parsed by Node's own `util.parseEnv`. That parser never reports a
 * problem: a line it cannot read is dropped or glued to the next one, an unquoted `#` cuts the
 * value, `\"` ends a double-quoted one. So every line is checked first, and only the forms that
 * systemd's EnvironmentFile= and util.parseEnv read alike are accepted (the same file can serve
 * both); anything else is a UsageError naming the file and line, never a silently wrong secret.
 *
 * Accepted: `NAME=value`, `export NAME=value`, blank lines, `#` and `;` comment lines, values in
 * single or double quotes (which may span lines). Refused: a line that is not an assignment, an
 * unquoted value holding a quote, `#` or backslash, a backslash inside double quotes, a quote left
 * open, and text after the closing quote.
 */
export function readEnvFile(file: string): Record<string, string> {
  const absolute = path.resolve(file);
  let text: string;
  let fd: number | undefined;
  try {
    // O_NONBLOCK: a named pipe nobody writes to must not hold the process (and every listener) at a reload.
    fd = openSync(absolute, constants.O_RDONLY | constants.O_NONBLOCK);
    const stat = fstatSync(fd);
    if (!stat.isFile()) throw new UsageError(`env file ${absolute} is not a regular file (a pipe, socket or device)`);
    if (stat.size > MAX_ENV_FILE_BYTES)
      throw new UsageError(
        `env file ${absolute} is ${stat.size} bytes: more than ${MAX_ENV_FILE_BYTES} is not an env file`,
      );
    text = readFileSync(fd, 'utf8');
  } catch (err) {
    if (err instanceof UsageError) throw err;
    throw new UsageError(`env file ${absolute} ${describeFileError(err)}`);
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
  const lines = text.split(/\r?\n/);
  const problem = (line: number, reason: string) => new UsageError(`env file ${absolute}: line ${line + 1}: ${reason}`);
  const names = new Map<string, number>();
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!.trim();
    if (line === '' || line.startsWith('#')) continue;
    if (line.startsWith(';')) {
      lines[i] = ''; // systemd's other comment: util.parseEnv would read it as part of the next line
      continue;
    }
    const assignment = ASSIGNMENT.exec(line);
    if (!assignment)
      throw problem(
        i,
        line.includes('=')
          ? 'not NAME=value: a name is letters, digits and _, not starting with a digit'
          : 'not NAME=value (a comment line starts with #)',
      );
    const [, name, value] = assignment as unknown as [string, string, string];
    names.set(name, i);
    const quote = value[0];
    if (quote === '"' || quote === "'") {
      const first = i;
      let closing = value.indexOf(quote, 1);
      let content = value.slice(1, closing === -1 ? undefined : closing);
      let rest = closing === -1 ? '' : value.slice(closing + 1);
      while (closing === -1 && ++i < lines.length) {
        closing = lines[i]!.indexOf(quote);
        content += '\n' + lines[i]!.slice(0, closing === -1 ? undefined : closing);
        rest = closing === -1 ? '' : lines[i]!.slice(closing + 1);
      }
      if (closing === -1) throw problem(first, `the ${quote === '"' ? 'double' : 'single'} quote is never closed`);
      if (quote === '"' && content.includes('\\'))
        throw problem(
          first,
          'a backslash inside double quotes (systemd and Node read escapes differently): use single quotes',
        );
      if (rest.trim() !== '') throw problem(i, 'text after the closing quote: quote the whole value');
    } else if (/["'`#\\]/.test(value)) {
      const found = /["'`#\\]/.exec(value)![0];
      throw problem(i, `an unquoted value holding ${found}: put the whole value in single quotes ('…')`);
    }
  }
  const parsed = parseEnv(lines.join('\n'));
  for (const [name, line] of names)
    if (!Object.hasOwn(parsed, name)) throw problem(line, `${name} cannot be read by Node's util.parseEnv`);
  return parsed as Record<string, string>;
}

/** `NAME=value` or `export NAME=value` (one space, as util.parseEnv strips it), spaces around `=` allowed; the value as written. */
const ASSIGNMENT = /^(?:export )?([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*(.*)$/;
