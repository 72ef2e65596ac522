#!/usr/bin/env node
// Entry point of the `dsrlb` command: the compiled CLI lives in dist/ (npm run build).
import { main, hideBin } from '../dist/cli/main.js';

const code = await main(hideBin(process.argv));
// `run` never resolves; every other command exits with its code.
process.exitCode = code;
