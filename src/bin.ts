import { runCli } from './main.js';

// The executable entry: `gatehouse …` (bin/gatehouse.js runs the built copy of this file).
process.exitCode = await runCli(process.argv);
