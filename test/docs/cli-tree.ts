import type { Command, Option } from 'commander';

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

/** The CLI's own command tree, as src/main.ts builds it (nothing is parsed, no action runs). */
export async function loadCliTree(): Promise<CliCommand> {
  const { buildProgram } = await import('../../src/main.js');
  return describe(buildProgram(), []);
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
