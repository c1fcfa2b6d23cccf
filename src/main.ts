import { Command, CommanderError } from 'commander';
import { registerChannelsCommands } from './cli/channels.js';
import { registerConfigCommands } from './cli/config.js';
import { registerGatewayCommands } from './cli/gateway.js';
import { registerStartCommand } from './cli/start.js';
import { registerStorageCommands } from './cli/storage.js';
import { registerWebhooksCommands } from './cli/webhooks.js';
import { ConfigError, UsageError } from './errors.js';
import { VERSION } from './version.js';

/**
 * The CLI: one module per command group, one error funnel.
 * Returns the exit code: 0 ok, 1 a config or usage problem (printed), 2 a bad command line.
 * `start` resolves only when the server has stopped.
 */
export async function runCli(argv: readonly string[]): Promise<number> {
  const program = new Command()
    .name('gatehouse')
    .description('Authentication edge for internal HTTP APIs, with a durable webhook receiver.')
    .version(VERSION)
    .exitOverride()
    .showHelpAfterError();
  registerStartCommand(program);
  registerConfigCommands(program);
  registerGatewayCommands(program);
  registerWebhooksCommands(program);
  registerStorageCommands(program);
  registerChannelsCommands(program);

  try {
    await program.parseAsync(argv);
    return 0;
  } catch (err) {
    if (err instanceof CommanderError) return err.exitCode === 0 ? 0 : 2;
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
