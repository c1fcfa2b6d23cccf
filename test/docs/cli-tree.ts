import { Command, type Option } from 'commander';

/** One command of the CLI: its full name (`gatehouse webhooks deliveries list`), flags and subcommands. */
export interface CliCommand {
  name: string;
  /** Long flags (`--config`, `--no-watch`), and the short ones (`-c`) beside them. */
  longFlags: string[];
  shortFlags: string[];
  /** Flags that take a value (`--config <file>`): the next word is theirs. */
  valued: Set<string>;
  /** Whether it takes positional arguments. */
  takesArguments: boolean;
  subcommands: Map<string, CliCommand>;
}

/**
 * The CLI's own command tree, built in-process: src/main.ts builds its commander program inside
 * runCli, so runCli is called with parsing stubbed out, and the program it built is read.
 * Nothing runs: no command's action is reached.
 */
export async function loadCliTree(): Promise<CliCommand> {
  let program: Command | undefined;
  const parseAsync = Command.prototype.parseAsync;
  Command.prototype.parseAsync = async function captureProgram(this: Command) {
    program = this;
    return this;
  };
  try {
    const { runCli } = (await import('../../src/main.js')) as { runCli: (argv: readonly string[]) => Promise<number> };
    await runCli(['node', 'gatehouse']);
  } finally {
    Command.prototype.parseAsync = parseAsync;
  }
  if (!program) throw new Error('runCli did not parse a commander program');
  return describe(program, []);
}

function describe(command: Command, parents: string[]): CliCommand {
  const name = [...parents, command.name()].join(' ');
  const options: readonly Option[] = command.options;
  const valued = new Set<string>();
  for (const option of options) {
    if (option.required || option.optional) for (const flag of [option.long, option.short]) if (flag) valued.add(flag);
  }
  return {
    name,
    longFlags: options.flatMap((option) => (option.long ? [option.long] : [])),
    shortFlags: options.flatMap((option) => (option.short ? [option.short] : [])),
    valued,
    takesArguments: command.registeredArguments.length > 0,
    subcommands: new Map(command.commands.map((sub) => [sub.name(), describe(sub, [...parents, command.name()])])),
  };
}

/** Every command of the tree, the root first. */
export function allCommands(root: CliCommand): CliCommand[] {
  return [root, ...[...root.subcommands.values()].flatMap(allCommands)];
}
