// A module loader for child node processes that run the TypeScript sources directly (node 20 has
// no type stripping, and dist/ may be older than the sources under test): a relative `.js`
// specifier from a `.ts` module resolves to the `.ts` file next to it, and `.ts` files are
// transpiled one by one with TypeScript's transpileModule (no type check: tsc does that).
// Use: node --import ./test/support/ts-loader.mjs file.ts

import { register } from 'node:module';

register('./ts-loader-hooks.mjs', import.meta.url);
