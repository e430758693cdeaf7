// Runs one scripted exchange of protocol/cases/ against the TypeScript client's session core, as
// the Python client's tests/test_pyclient_cases.py does; protocol/cases/README.md says what a case
// holds. Messages are encoded here from their JSON form, so the core decodes real bytes; entries
// are merged with applyEntry and a lost connection with linkLost, as the client does.
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { expect } from "vitest";
import { applyEntry, initialState, linkLost, SEVERITIES, type ChangedField, type ChannelState } from "../src/channel.js";
import { decode, encode, type Encodable } from "../src/msgpack.js";
import { Session, type SessionOptions } from "../src/session.js";
import { parseExact } from "./exactJson.js";

export const root = join(import.meta.dirname, "../../../protocol");
export const files = readdirSync(join(root, "cases")).filter((f) => f.endsWith(".json")).sort();
const OUTPUTS = ["sent", "close", "updates", "history", "failed", "renew", "pongs", "errors", "malformed", "connected", "closed"] as const;

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
export type Step = Record<string, Json>;
interface Update { sub: string; sid: number; changed: ChangedField[]; state: Record<string, unknown> }

/** A state in the cases' language-neutral form. */
function neutral(s: ChannelState): Record<string, unknown> {
  return {
    id: s.id,
    value: s.value ?? null,
    serial: s.serial ?? null,
    conflated: s.conflated,
    time: s.time ? [s.time.seconds, s.time.nanoseconds] : null,
    alarm: s.alarm ? [SEVERITIES.indexOf(s.alarm.severity), s.alarm.status, s.alarm.message] : null,
    metadata: s.metadata,
    connection: s.connection,
    reason: s.reason,
  };
}

export class Runner {
  readonly session: Session<string>;
  now = 0;
  states = new Map<string, ChannelState[]>();
  out: Record<string, unknown> = {};
  closing = false;

  constructor(options: Record<string, Json>, onTransition?: SessionOptions["onTransition"]) {
    const timeout = options.request_timeout_s;
    this.session = new Session<string>({
      requestTimeoutMs: typeof timeout === "number" ? timeout * 1000 : undefined,
      reconnect: options.reconnect === false ? false : undefined,
      onTransition,
    });
  }

  record(kind: string, item: unknown): void {
    if (["malformed", "connected", "close", "closed"].includes(kind)) this.out[kind] = item;
    else ((this.out[kind] ??= []) as unknown[]).push(item);
  }

  update(sub: string, sid: number, state: ChannelState, changed: ChangedField[]): void {
    this.record("updates", { sub, sid, changed, state: neutral(state) });
  }

  /** What the client's pump does: send, close what the session wants closed, apply. */
  pump(): void {
    const session = this.session;
    for (;;) {
      for (const d of session.dataToSend()) this.record("sent", decode(d));
      if (session.closeRequest !== undefined && !this.closing) {
        this.closing = true;
        this.record("close", session.closeRequest.code);
        session.connectionLost(session.closeRequest.code, session.closeRequest.reason);
      }
      const ev = session.nextEvent();
      if (ev === undefined) return;
      switch (ev.type) {
        case "attached": {
          const old = this.states.get(ev.key) ?? [];
          this.states.set(ev.key, ev.ids.map((id, sid) => (old[sid]?.id === id ? old[sid]! : initialState(id, sid))));
          break;
        }
        case "entries": {
          const states = this.states.get(ev.key)!;
          for (const e of ev.entries) {
            const [next, changed] = applyEntry(states[e.sid]!, e, ev.snapshot);
            states[e.sid] = next;
            this.update(ev.key, e.sid, next, changed);
          }
          break;
        }
        case "history": {
          const h = ev.history;
          const NS = 1_000_000_000n;
          this.record("history", {
            sub: ev.key, sid: h.sid, resolution: h.resolution,
            t: Array.from(h.t, (t) => [Number(t / NS), Number(t % NS)]),
            gap: Array.from(h.gap),
            ...(h.reason !== undefined ? { reason: h.reason } : {}),
          });
          break;
        }
        case "lost":
          for (const [key, states] of this.states) {
            if (!session.has(key)) continue;
            states.forEach((s, sid) => {
              const next = linkLost(s, ev.reason);
              if (next === undefined) return;
              states[sid] = next;
              this.update(key, sid, next, ["connection"]);
            });
          }
          break;
        case "failed":
          this.record("failed", { sub: ev.key, kind: ev.kind, code: ev.code });
          break;
        case "renew":
          this.record("renew", ev.key);
          break;
        case "pong":
          this.record("pongs", { nonce: ev.nonce, ok: ev.rttMs !== null });
          break;
        case "serverError":
          this.record("errors", { code: ev.code });
          break;
        case "malformed":
          this.record("malformed", true);
          break;
        case "connected":
          this.record("connected", true);
          break;
        case "closed":
          // With `within` (seconds) only for a drain's close (4012), as the cases write it.
          this.record("closed", ev.withinMs === undefined ? { code: ev.code, reconnect: ev.reconnect } : { code: ev.code, reconnect: ev.reconnect, within: ev.withinMs / 1000 });
          break;
      }
    }
  }

  step(step: Step): void {
    const s = this.session;
    if (typeof step.at === "number") this.now = step.at * 1000;
    if ("subscribe" in step) {
      const ids = step.ids as string[] | null | undefined;
      const expires = step.expires_at;
      s.add(step.subscribe as string, step.token as string, ids ?? undefined, {
        expiresAt: typeof expires === "number" ? expires * 1000 : undefined,
        renewable: step.renewable !== false,
        backfill: step.backfill === true,
        now: this.now,
      });
    } else if ("unsubscribe" in step) {
      s.remove(step.unsubscribe as string, this.now);
    } else if ("renewed" in step) {
      s.setToken(step.renewed as string, step.token as string, undefined, { now: this.now });
    } else if ("ping" in step) {
      expect(s.ping(step.ping as number | string, this.now)).toBe(step.sent ?? true);
    } else if ("open" in step) {
      this.closing = false;
      s.connectionMade(this.now);
    } else if ("receive" in step) {
      s.receive(encode(step.receive as Encodable), this.now);
    } else if ("receive_vector" in step) {
      s.receive(new Uint8Array(readFileSync(join(root, "vectors", `${step.receive_vector as string}.bin`))), this.now);
    } else if ("receive_text" in step) {
      s.receive(step.receive_text, this.now);
    } else if ("closed" in step) {
      const [code, reason] = step.closed as [number, string];
      s.connectionLost(code, reason);
    } else if ("connect_failed" in step) {
      s.connectFailed(step.connect_failed as string);
    } else if ("timer" in step) {
      s.timer(this.now);
    } else if ("expect" in step) {
      this.expect(step.expect as Record<string, Json>);
      return;
    } else {
      throw new Error(`unknown step ${JSON.stringify(step)}`);
    }
    this.pump();
  }

  expect(want: Record<string, Json>): void {
    const got = this.out;
    this.out = {};
    if ("deadline" in want) expect(this.session.deadline(), "deadline").toBe((want.deadline as number) * 1000);
    for (const kind of OUTPUTS) {
      if (!(kind in want)) expect(got[kind], `unexpected ${kind}`).toBeUndefined();
      else if (kind === "updates") checkUpdates((got.updates ?? []) as Update[], want.updates as unknown as Update[]);
      else expect(got[kind], kind).toEqual(want[kind]);
    }
  }
}

function checkUpdates(got: Update[], want: Update[]): void {
  expect(got.length, JSON.stringify(got)).toBe(want.length);
  got.forEach((g, i) => {
    const w = want[i]!;
    expect([g.sub, g.sid, g.changed]).toEqual([w.sub, w.sid, w.changed]);
    for (const [name, value] of Object.entries(w.state ?? {})) {
      if (name === "reason_starts") expect(String(g.state.reason).startsWith(value as string), `${g.state.reason} starts ${value}`).toBe(true);
      else expect(g.state[name], name).toEqual(value);
    }
  });
}

export interface Case { options?: Record<string, Json>; steps: Step[] }

export function loadCase(file: string): Case {
  return parseExact(readFileSync(join(root, "cases", file), "utf8")) as Case;
}

/** Run every step of `file`, naming the step that failed; `after` runs after each step. */
export function runCase(file: string, r: Runner, steps: readonly Step[], after: () => void = () => undefined): void {
  steps.forEach((step, i) => {
    try {
      r.step(step);
      after();
    } catch (err) {
      throw new Error(`${file} step ${i} ${JSON.stringify(step).slice(0, 200)}: ${(err as Error).message}`);
    }
  });
}
