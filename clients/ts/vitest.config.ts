import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    // Generous: CI is a 2-core machine that may be busy, and waits inside tests go up to 30 s.
    testTimeout: 120_000,
    hookTimeout: 120_000,
    // Integration and browser files each start their own server + IOC (+ Chromium): two at a
    // time on 2 cores; four made the machine itself the bottleneck and waits time out.
    maxWorkers: 2,
    minWorkers: 1,
  },
});
