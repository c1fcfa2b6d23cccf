import { Command, CommanderError } from 'commander';
import { registerChannelsCommands } from './cli/channels.js';
import { registerConfigCommands } from './cli/config.js';
import { registerGatewayCommands } from './cli/gateway.js';
import { registerStartCommand } from './cli/start.js';
import { registerStorageCommands } from './cli/storage.js';
import { registerWebhooksCommands } from './cli/webhooks.js';
import { ConfigError, UsageError } from './errors.js';
import { POSTGRES_SCHEMA_VERSION } from './storage/postgres/migrations.js';
import { SQLITE_SCHEMA_VERSION } from './storage/sqlite/events.js';
import { VERSION } from './version.js';

/** Commander's codes for a command or flag it does not know: exit 2. */
const UNKNOWN_COMMAND_LINE = new Set(['commander.unknownCommand', 'commander.unknownOption']);

/**
 * The CLI: one module per command group, one error funnel.
 * Returns the exit code: 0 ok, 2 an unknown command or flag, 1 every other problem (a config
 * or usage problem: a missing argument or command, a bad flag value), printed to stderr.
 * `start` resolves only when the server has stopped.
 */
export async function runCli(argv: readonly string[]): Promise<number> {
  const program = buildProgram();
  try {
    await program.parseAsync(argv);
    // A command that printed its own failure (e.g. `config check --json`) sets process.exitCode.
    return Number(process.exitCode ?? 0);
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.exitCode === 0) return 0;
      return UNKNOWN_COMMAND_LINE.has(err.code) ? 2 : 1;
    }
    if (err instanceof ConfigError) {
      process.stderr.write(`gatehouse: invalid configuration\n${err.problems.map((p) => `  - ${p}`).join('\n')}\n`);
      return 1;
    }
    if (err instanceof UsageError) {
      process.stderr.write(`gatehouse: ${err.message}\n`);
      return 1;
    }
    process.stderr.write(`gatehouse: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    return 1;
  }
}

/** The commander program with every command registered (docs/cli.md is checked against it). */
export function buildProgram(): Command {
  const program = new Command()
    .name('gatehouse')
    .description('Authentication edge for internal HTTP APIs, with a durable webhook receiver.')
    // The first line is the version alone (scripts read it); the second what storage it can open and migrate to.
    .version(
      `${VERSION}\nstorage schema versions: sqlite ${SQLITE_SCHEMA_VERSION}, postgres ${POSTGRES_SCHEMA_VERSION}`,
    )
    .exitOverride()
    .showHelpAfterError()
    .addHelpText(
      'after',
      [
        '',
        'Environment:',
        '  GATEHOUSE_CONFIG      the config file of a command run without --config (else ./gateway.json5)',
        '  GATEHOUSE_SECRET_KEY  the key that seals stored Gmail and channel logins (read at start)',
        '',
        '`start`, `config check` and `config print` also read variables from --env-file <file>.',
      ].join('\n'),
    );
  registerStartCommand(program);
  registerConfigCommands(program);
  registerGatewayCommands(program);
  registerWebhooksCommands(program);
  registerStorageCommands(program);
  registerChannelsCommands(program);
  return program;
}
