// Namespace test helper: `ip netns exec NS node test/support/run-decap.mjs --vip VIP[,VIP..]
// [--interface IF] [--tun NAME] [--allow-source CIDR[,CIDR..]]` runs runDecap() from src/decap/decap-command.ts (transpiled on the
// fly, so the test needs no `npm run build`) until SIGTERM/SIGINT, and exits with its exit code.
// Its JSON log lines (the counters on exit among them) go to stdout.
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import ts from 'typescript';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Transpiles `entry` and its relative imports below node_modules/.cache; returns the output path. */
function transpileTree(entry) {
  const outDir = join(repoRoot, 'node_modules', '.cache', `dsrlb-run-decap-${process.pid}`);
  mkdirSync(outDir, { recursive: true });
  // Below node_modules the repo's "type": "module" does not apply.
  writeFileSync(join(outDir, 'package.json'), '{"type":"module"}\n');
  const pending = [entry];
  const done = new Set();
  while (pending.length > 0) {
    const source = pending.pop();
    if (done.has(source)) continue;
    done.add(source);
    const text = readFileSync(source, 'utf8');
    for (const match of text.matchAll(/from '(\.{1,2}\/[^']+)\.js'/g)) {
      pending.push(resolve(dirname(source), `${match[1]}.ts`));
    }
    const output = ts.transpileModule(text, {
      compilerOptions: { module: ts.ModuleKind.ES2022, target: ts.ScriptTarget.ES2022 },
    }).outputText;
    const target = join(outDir, relative(repoRoot, source)).replace(/\.ts$/, '.js');
    mkdirSync(dirname(target), { recursive: true });
    writeFileSync(target, output);
  }
  return { outDir, main: join(outDir, relative(repoRoot, entry)).replace(/\.ts$/, '.js') };
}

const { values } = parseArgs({
  options: {
    vip: { type: 'string', multiple: true, default: [] },
    interface: { type: 'string' },
    tun: { type: 'string' },
    'allow-source': { type: 'string', multiple: true, default: [] },
  },
});

const { outDir, main } = transpileTree(join(repoRoot, 'src', 'decap', 'decap-command.ts'));
const { runDecap } = await import(pathToFileURL(main).href);
// The module is loaded: the transpiled copy is no longer needed.
const { rmSync } = await import('node:fs');
rmSync(outDir, { recursive: true, force: true });

const code = await runDecap({ vips: values.vip, interface: values.interface, tunName: values.tun, allowSources: values['allow-source'] });
process.exit(code);
