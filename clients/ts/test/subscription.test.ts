// The subscription state table of the TypeScript client's session core (src/subscription.ts):
// the shared cases of protocol/cases/ take every listed transition, every unlisted one throws, and
// the fields that belong to a state follow it. The Python client's table is held to the same
// (tests/test_pyclient_subscription.py, which also compares the two tables and PROTOCOL.md's).
import { describe, expect, it } from "vitest";
import { decode, encode } from "../src/msgpack.js";
import { Session } from "../src/session.js";
import {
  move, newSubscription, SUBSCRIPTION_EVENTS, SUBSCRIPTION_STATES, SUBSCRIPTION_TRANSITIONS, subscriptionTransition, TransitionError,
  type Subscription, type SubscriptionState,
} from "../src/subscription.js";
import { files, loadCase, runCase, Runner } from "./caseRunner.js";

const listed = SUBSCRIPTION_STATES.flatMap((s) => Object.keys(SUBSCRIPTION_TRANSITIONS[s]).map((e) => `${s} ${e}`)).sort();
const LIVE: readonly SubscriptionState[] = ["REGISTERING", "WAITING", "ATTACHING", "ATTACHED"];

/** The session's own maps agree with its subscriptions' states. */
function checkSession(session: Session<string>): void {
  const inner = session as unknown as { subs: Map<string, Subscription<string>>; byAtt: Map<number, Subscription<string>> };
  const subs = [...inner.subs.values()];
  for (const sub of subs) {
    expect(LIVE, sub.state).toContain(sub.state);
    expect(sub.att !== undefined, `att in ${sub.state}`).toBe(sub.state === "ATTACHED");
    expect(sub.token !== undefined, `token in ${sub.state}`).toBe(["WAITING", "ATTACHING", "ATTACHED"].includes(sub.state));
  }
  expect(new Set(inner.byAtt.values())).toEqual(new Set(subs.filter((s) => s.state === "ATTACHED")));
}

describe("subscription state table", () => {
  it("has every transition taken by the shared cases, and no other", () => {
    const taken = new Set<string>();
    for (const file of files) {
      const c = loadCase(file);
      const r = new Runner(c.options ?? {}, (_key, state, event, next) => {
        expect(SUBSCRIPTION_TRANSITIONS[state][event], `${state} ${event}`).toBe(next);
        taken.add(`${state} ${event}`);
      });
      runCase(file, r, c.steps, () => checkSession(r.session));
    }
    expect([...taken].sort()).toEqual(listed);
  });

  it("throws for every pair it does not list; CLOSED has no way out", () => {
    for (const state of SUBSCRIPTION_STATES) {
      for (const event of SUBSCRIPTION_EVENTS) {
        const next = SUBSCRIPTION_TRANSITIONS[state][event];
        if (next !== undefined) expect(subscriptionTransition(state, event)).toBe(next);
        else expect(() => subscriptionTransition(state, event)).toThrow(new TransitionError(`illegal subscription transition: ${event} in state ${state}`));
      }
    }
    expect(SUBSCRIPTION_TRANSITIONS.CLOSED).toEqual({});
  });

  it("sets the token and att with the state, and changes nothing when it throws", () => {
    const sub = newSubscription("k", ["ca://X"], { expiresAt: undefined, renewable: true, backfill: false });
    expect(() => move(sub, "token")).toThrow(TransitionError); // WAITING holds a token
    expect([sub.state, sub.token]).toEqual(["REGISTERING", undefined]);
    move(sub, "token", { token: "t" });
    expect(() => move(sub, "attached", { att: 1 })).toThrow(TransitionError);
    move(sub, "attach");
    expect(() => move(sub, "attached")).toThrow(TransitionError); // ATTACHED has an att
    expect([sub.state, sub.token, sub.att]).toEqual(["ATTACHING", "t", undefined]);
    move(sub, "attached", { att: 3 });
    expect([sub.state, sub.token, sub.att]).toEqual(["ATTACHED", "t", 3]);
    move(sub, "lost");
    expect([sub.state, sub.token, sub.att]).toEqual(["WAITING", "t", undefined]);
    move(sub, "remove");
    expect([sub.state, sub.token, sub.att]).toEqual(["CLOSED", undefined, undefined]);
  });

  it("refuses a token for a subscription that is not registering, leaving it as it was", () => {
    const s = new Session<string>();
    s.add("a", "tok-a", ["ca://X"], { now: 0 });
    expect(s.state("a")).toBe("WAITING");
    expect(() => s.setToken("a", "tok-a2", undefined, { now: 0 })).toThrow(/token in state WAITING/);
    s.connectionMade(0);
    s.receive(encode([0, 1, "test", 20, 15000, 65536]), 0);
    expect(s.dataToSend().map((d) => decode(d))).toEqual([[16, 1, "tok-a"]]);
    expect(s.state("a")).toBe("ATTACHING");
    expect(s.state("b")).toBeUndefined();
  });
});
