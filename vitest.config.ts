import { defineConfig } from 'vitest/config';

// Namespace tests share the host's network stack and the two cores: run files one at a time.
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/support/run-tmpdir.ts'],
    fileParallelism: false,
    testTimeout: 60_000,
    hookTimeout: 60_000,
  },
});
