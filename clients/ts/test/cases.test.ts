// The scripted exchanges of protocol/cases/ against the TypeScript client's session core. The Python
// client runs the same files (tests/test_pyclient_cases.py); caseRunner.ts runs one.
import { describe, expect, it } from "vitest";
import { files, loadCase, runCase, Runner } from "./caseRunner.js";

describe("protocol/cases", () => {
  it("are there", () => expect(files.length).toBeGreaterThanOrEqual(10));
  for (const file of files) {
    it(file.replace(/\.json$/, ""), () => {
      const c = loadCase(file);
      const r = new Runner(c.options ?? {});
      runCase(file, r, c.steps);
      expect(r.out, "outputs never expected").toEqual({});
    });
  }
});
