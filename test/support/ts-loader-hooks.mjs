// The hooks of ts-loader.mjs (module.register runs them on the loader thread).

import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const compilerOptions = {
  module: ts.ModuleKind.ESNext,
  target: ts.ScriptTarget.ES2022,
  sourceMap: false,
  inlineSourceMap: true,
  esModuleInterop: true,
};

export async function resolve(specifier, context, nextResolve) {
  const parent = context.parentURL;
  if (parent?.endsWith('.ts') && (specifier.startsWith('./') || specifier.startsWith('../') || specifier.startsWith('/')) && specifier.endsWith('.js')) {
    const candidate = new URL(specifier.slice(0, -3) + '.ts', parent);
    if (existsSync(fileURLToPath(candidate))) return { url: candidate.href, shortCircuit: true };
  }
  return nextResolve(specifier, context);
}

export async function load(url, context, nextLoad) {
  if (!url.startsWith('file:') || !url.endsWith('.ts')) return nextLoad(url, context);
  const source = readFileSync(fileURLToPath(url), 'utf8');
  const { outputText } = ts.transpileModule(source, { compilerOptions, fileName: fileURLToPath(url) });
  return { format: 'module', source: outputText, shortCircuit: true };
}
