// The TypeScript client's session core fed mutated server messages, in memory, as the Python
// client's is (tests/test_pyclient_session_fuzz.py): frames derived from the server-to-client
// golden vectors by a seeded mutator (bit flips, truncation, inserted bytes, splices). Driven as
// the client's pump drives it, a close asked for is carried out and the connection opened again.
// Nothing may throw, every close asked for has a documented code, and the subscription (when it
// did not end) attaches again and applies a snapshot on a fresh connection.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { CloseCode } from "../src/closeCodes.js";
import { decode, encode, type Encodable } from "../src/msgpack.js";
import { Session, type SessionEvent } from "../src/session.js";

const vectors = join(import.meta.dirname, "../../../protocol/vectors");
const IDS = ["ca://X", "ca://Y"];
const HELLO = encode([0, 1, "fuzz", 20, 15000, 65536]);
const entry: Encodable = [0, 31, 1.5, 1, 1700000000, 0, 0, 0, "", { units: "mA" }, 1, ""];
const corpus: Uint8Array[] = [
  ...readdirSync(vectors).filter((f) => f.endsWith(".json"))
    .filter((f) => (JSON.parse(readFileSync(join(vectors, f), "utf8")) as { direction: string }).direction === "server")
    .map((f) => new Uint8Array(readFileSync(join(vectors, f.replace(/\.json$/, ".bin"))))),
  ...([[1, 1, 1, IDS], [2, 1, 1, [entry, [1, 16, 4, "not found"]]], [3, 2, [[1, [[0, 3, 2.5, 2, 1700000001, 0]]]]],
    [5, null, 4403, "no longer readable"], [4, null, 1], [7, 1]] as Encodable[]).map((m) => encode(m)),
];
const KNOWN_CLOSES: number[] = [CloseCode.PROTOCOL_ERROR, CloseCode.HEARTBEAT_TIMEOUT, CloseCode.NORMAL];

/** mulberry32: a small seeded PRNG, so a failing seed can be replayed. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function mutate(r: () => number): Uint8Array {
  const pick = () => corpus[Math.floor(r() * corpus.length)]!;
  const f = Array.from(pick());
  switch (Math.floor(r() * 4)) {
    case 0: for (let i = 0; i < 1 + r() * 4 && f.length; i++) f[Math.floor(r() * f.length)]! ^= 1 << Math.floor(r() * 8); break;
    case 1: f.length = Math.floor(r() * f.length); break;
    case 2: f.splice(Math.floor(r() * (f.length + 1)), 0, ...[0xdd, 0xff, 0xff, 0xff, 0xff, 0xc1, 0xd4, 0xc7, 0x01].slice(0, 1 + Math.floor(r() * 8))); break;
    default: { const g = pick(); f.splice(Math.floor(r() * f.length), f.length, ...g.subarray(Math.floor(r() * g.length))); }
  }
  return new Uint8Array(f);
}

function drain(s: Session<string>): SessionEvent<string>[] {
  s.dataToSend();
  const out: SessionEvent<string>[] = [];
  for (let e = s.nextEvent(); e !== undefined; e = s.nextEvent()) out.push(e);
  return out;
}

describe("session core under mutated server messages", () => {
  for (let seed = 1; seed <= 150; seed++) {
    it(`seed ${seed}`, () => {
      const r = rng(seed);
      const s = new Session<string>();
      s.add("a", "tok-a", IDS, { now: 0 });
      let now = 0;
      let failed = false;
      s.connectionMade(now);
      s.receive(HELLO, now);
      for (let i = 0; i < 150; i++) {
        now += r() * 1000;
        s.receive(r() < 0.7 ? mutate(r) : corpus[Math.floor(r() * corpus.length)]!, now);
        if (r() < 0.05) s.timer(now + (r() < 0.5 ? 1000 : 40_000));
        failed ||= drain(s).some((e) => e.type === "failed");
        const close = s.closeRequest;
        if (close !== undefined) {
          expect(KNOWN_CLOSES).toContain(close.code);
          s.connectionLost(close.code, close.reason);
          drain(s);
          if (close.code === CloseCode.NORMAL) return; // a HELLO of another version ends the session
          s.connectionMade(now);
          s.receive(HELLO, now);
        }
      }
      if (s.closeRequest === undefined) s.connectionLost(CloseCode.ABNORMAL, "");
      drain(s);
      s.connectionMade(now);
      s.receive(HELLO, now);
      const sent = s.dataToSend().map((d) => decode(d) as [number, number, string]);
      if (failed || !s.has("a")) return void expect(sent).toEqual([]);
      expect(sent.length).toBe(1);
      expect(sent[0]![0]).toBe(16);
      s.receive(encode([1, sent[0]![1], 9, IDS]), now);
      s.receive(encode([2, 1, 9, [[0, 16, 1, ""]]]), now);
      expect(drain(s).some((e) => e.type === "entries" && e.key === "a")).toBe(true);
    });
  }
});
