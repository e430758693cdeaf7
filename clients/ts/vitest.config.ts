import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Integration and browser files each start their own server + IOC; run files in parallel
    // but keep the count bounded.
    maxWorkers: 4,
    minWorkers: 1,
  },
});
