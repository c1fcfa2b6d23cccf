import { runCli } from './main.js';

// A reader that stopped reading (`deliveries list | head -3`) is not an error: stop quietly, as
// Unix tools do on SIGPIPE, instead of printing an EPIPE stack.
for (const stream of [process.stdout, process.stderr]) {
  stream.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EPIPE') process.exit(process.exitCode ?? 0);
    throw err;
  });
}

// The executable entry: `gatehouse …` (bin/gatehouse.js runs the built copy of this file).
process.exitCode = await runCli(process.argv);
