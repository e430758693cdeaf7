import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { CLOSE_CODES, CloseCode, ErrorCode } from "../src/index.js";

const script = join(import.meta.dirname, "../scripts/gen-close-codes.mjs");
const sourcePath = join(import.meta.dirname, "../../../protocol/close_codes.json");
type Row = { code: number; name: string; class?: string };
const source = JSON.parse(readFileSync(sourcePath, "utf8")) as { codes: Row[]; errors: Row[] };

function check(from = sourcePath): number {
  try {
    execFileSync(process.execPath, [script, "--check", "--source", from], { stdio: "pipe" });
    return 0;
  } catch (err) {
    return (err as { status: number }).status;
  }
}

describe("the generated code table", () => {
  it("is what the generator makes of protocol/close_codes.json", () => {
    expect(check()).toBe(0);
  });
  it("is found stale when the source changes", () => {
    const dir = mkdtempSync(join(tmpdir(), "pvwire-codes-"));
    try {
      const changed = { ...source, errors: [...source.errors, { code: 4499, name: "NEW_ONE", meaning: "" }] };
      const path = join(dir, "close_codes.json");
      writeFileSync(path, JSON.stringify(changed));
      expect(check(path)).toBe(1);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
  it("holds every close and ERROR code by name", () => {
    for (const c of source.codes) {
      expect(CLOSE_CODES[c.code as keyof typeof CLOSE_CODES]).toEqual({ name: c.name, class: c.class });
      expect(CloseCode[c.name as keyof typeof CloseCode]).toBe(c.code);
    }
    expect(ErrorCode).toEqual(Object.fromEntries(source.errors.map((e) => [e.name, e.code])));
  });
});
