// Micro-benchmark: milliseconds to load a large config (8 services x 1,000 reals; 2,000 services x
// 4 reals), in parts: the whole readConfigFile as the daemon's reload calls it, parseConfigYaml
// (YAML text -> plain document), validateConfig (document -> frozen Config), and for reference the
// yaml library's line-aware parseDocument and toJS alone. Median and best of a few runs each.
// `--dist DIR` times another build (e.g. one compiled with tsc --outDir); default ../../dist.

import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { LineCounter, parseDocument } from 'yaml';
import { CONFIG_SHAPES, generateConfigText } from './config-shapes.js';
import { flags } from './micro-setup.js';

const opts = flags();
const quick = opts.quick === true;
const distDir = typeof opts.dist === 'string' ? resolve(opts.dist) : new URL('../../dist/', import.meta.url).pathname;
const dist = (path) => import(pathToFileURL(join(distDir, path)).href);
const validate = await dist('config/validate.js');
const load = await dist('config/load.js');

/** Median and best milliseconds of `runs` calls of `fn` after one warm-up call. */
async function time(fn, runs) {
  await fn();
  const times = [];
  for (let r = 0; r < runs; r++) {
    const t0 = performance.now();
    await fn();
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return { medianMs: round(times[Math.floor(times.length / 2)]), bestMs: round(times[0]) };
}

/**
 * The longest the main thread went without running a 1 ms timer while `fn` ran: what a health
 * probe's timer or an admin request would have waited.
 */
async function longestStallMs(fn) {
  let last = performance.now();
  let longest = 0;
  const timer = setInterval(() => {
    const now = performance.now();
    longest = Math.max(longest, now - last);
    last = now;
  }, 1);
  await new Promise((r) => setTimeout(r, 5));
  last = performance.now();
  await fn();
  longest = Math.max(longest, performance.now() - last);
  clearInterval(timer);
  return round(longest);
}

function round(ms) {
  return Math.round(ms * 10) / 10;
}

const dir = await mkdtemp(join(tmpdir(), 'dsrlb-config-bench-'));
const cases = [];
try {
  for (const shape of CONFIG_SHAPES) {
    const text = generateConfigText(shape);
    const file = join(dir, `${shape.name}.yaml`);
    await writeFile(file, text);
    const runs = quick ? 3 : 7;
    const check = await load.readConfigFile(file);
    if (!check.result.ok) throw new Error(validate.formatProblems(check.result.problems));
    const raw = validate.parseConfigYaml(text);
    if (!raw.ok) throw new Error(validate.formatProblems(raw.problems));
    const parts = {
      readConfigFile: await time(() => load.readConfigFile(file), runs),
      parseConfigYaml: await time(() => validate.parseConfigYaml(text), runs),
      validateConfig: await time(() => validate.validateConfig(raw.raw, { sourcePath: file }), runs),
      yamlParseDocument: await time(() => parseDocument(text, { uniqueKeys: true, prettyErrors: true, merge: true, lineCounter: new LineCounter() }), runs),
      yamlToJS: await (async () => {
        const doc = parseDocument(text, { uniqueKeys: true, merge: true });
        return time(() => doc.toJS({ maxAliasCount: 100 }), runs);
      })(),
    };
    const stall = { readConfigFile: await longestStallMs(() => load.readConfigFile(file)) };
    // The off-thread loader, where the build has one: same result, the main thread free meanwhile.
    if (typeof load.readConfigFileOffThread === 'function') {
      parts.readConfigFileOffThread = await time(() => load.readConfigFileOffThread(file), runs);
      stall.readConfigFileOffThread = await longestStallMs(() => load.readConfigFileOffThread(file));
    }
    cases.push({ shape: shape.name, services: shape.services, realsPerService: shape.realsPerService, bytes: Buffer.byteLength(text), lines: text.split('\n').length, runs, parts, longestStallMs: stall });
  }
} finally {
  await rm(dir, { recursive: true, force: true });
}
process.stdout.write(`${JSON.stringify({ bench: 'config-load', dist: distDir, cases })}\n`);
