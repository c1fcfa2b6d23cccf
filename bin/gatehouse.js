#!/usr/bin/env node
// The built CLI (npm install runs `npm run build` through `prepare`).
import { runCli } from '../dist/main.js';

process.exitCode = await runCli(process.argv);
