#!/usr/bin/env node
// The built CLI: `npm install` runs `npm run build` (the `prepare` script), which writes dist/.
import '../dist/bin.js';
