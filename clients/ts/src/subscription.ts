/**
 * One subscription's state in the session core: its states and one transition table (as
 * connection.ts has for the connection). The Python client's session core has the same states,
 * events and table (clients/py/pvwire_client/subscription.py); PROTOCOL.md section 12 shows it.
 *
 * - REGISTERING: no token; a fresh one is being registered (after "renew", or added without one);
 *   `Session.setToken` hands it over.
 * - WAITING: holds a token and waits for a connection's HELLO to attach it.
 * - ATTACHING: its ATTACH was sent and has no answer yet.
 * - ATTACHED: the server attached it as `att`; its entries are routed to it.
 * - ABANDONED: removed while its ATTACH had no answer: an ATTACHED answering it is detached.
 * - CLOSED: removed, or ended for good ("failed"); nothing leaves this state.
 *
 * Events: token (a token arrives), expiring (the token expires within 1 s: renew before
 * attaching), attach (ATTACH sent), attached (ATTACHED with the token's channels, or any ATTACHED
 * for an abandoned one), mismatch (ATTACHED naming other channels), renew (ERROR 4401/4402 for the
 * first time: register again), refused (any other ERROR answering the ATTACH), ended (the server's
 * DETACHED), lost (the connection ended), closed (a terminal close, or a HELLO of another
 * version), remove (the application ends it).
 *
 * `token` is held exactly from WAITING to ATTACHED and `att` exactly in ATTACHED: `move` sets both
 * with the state, so they cannot disagree with it.
 */
import type { Held } from "./held.js";
export const SUBSCRIPTION_STATES = ["REGISTERING", "WAITING", "ATTACHING", "ATTACHED", "ABANDONED", "CLOSED"] as const;
export type SubscriptionState = (typeof SUBSCRIPTION_STATES)[number];
export const SUBSCRIPTION_EVENTS = ["token", "expiring", "attach", "attached", "mismatch", "renew", "refused", "ended", "lost", "closed", "remove"] as const;
export type SubscriptionEvent = (typeof SUBSCRIPTION_EVENTS)[number];

/** state x event -> next state; a pair not listed is a bug of the caller or of the session. */
export const SUBSCRIPTION_TRANSITIONS: Readonly<Record<SubscriptionState, Partial<Record<SubscriptionEvent, SubscriptionState>>>> = {
  REGISTERING: { token: "WAITING", lost: "REGISTERING", closed: "CLOSED", remove: "CLOSED" },
  WAITING: { attach: "ATTACHING", expiring: "REGISTERING", lost: "WAITING", closed: "CLOSED", remove: "CLOSED" },
  ATTACHING: { attached: "ATTACHED", mismatch: "CLOSED", renew: "REGISTERING", refused: "CLOSED", lost: "WAITING", remove: "ABANDONED" },
  ATTACHED: { ended: "CLOSED", lost: "WAITING", remove: "CLOSED" },
  ABANDONED: { attached: "CLOSED", refused: "CLOSED", lost: "CLOSED" },
  CLOSED: {},
};

const HOLDS_TOKEN: readonly SubscriptionState[] = ["WAITING", "ATTACHING", "ATTACHED"];

/** An event the subscription's state does not allow (a bug of the caller or the session). */
export class TransitionError extends Error {
  override name = "TransitionError";
}

/** The state after `event` in `state`; a TransitionError when the table has none. */
export function subscriptionTransition(state: SubscriptionState, event: SubscriptionEvent): SubscriptionState {
  const next = SUBSCRIPTION_TRANSITIONS[state][event];
  if (next === undefined) throw new TransitionError(`illegal subscription transition: ${event} in state ${state}`);
  return next;
}

/** What the session knows of one subscription (`key`). */
export interface Subscription<K> {
  readonly key: K;
  /** The token's channels when the client knows them (an ATTACHED naming others fails it). */
  ids: readonly string[] | undefined;
  expiresAt: number | undefined;
  readonly renewable: boolean;
  /** The token asked for `backfill`: re-attach with `since`. */
  readonly backfill: boolean;
  state: SubscriptionState;
  /** Held in WAITING, ATTACHING and ATTACHED only. */
  token: string | undefined;
  /** The attachment, in ATTACHED only. */
  att: number | undefined;
  /** Channels of the attachment (ATTACHED ids). */
  count: number;
  /** A token was refused (4401/4402) and registered again: one more refusal before an ATTACHED
   * ends the subscription, so a server refusing every token causes no loop. */
  renewed: boolean;
  /** What it holds of the past of each channel of the last ATTACHED (held.ts): the rows it
   * lacks of a HISTORY, the next ATTACH's `since` (section 2.8). undefined: not tracked. */
  held: Held | undefined;
}

export function newSubscription<K>(key: K, ids: readonly string[] | undefined, o: { expiresAt: number | undefined; renewable: boolean; backfill: boolean }): Subscription<K> {
  return { key, ids, ...o, state: "REGISTERING", token: undefined, att: undefined, count: 0, renewed: false, held: undefined };
}

/**
 * Take `event` (subscriptionTransition): `token` comes with the event "token", `att` with
 * "attached"; the state's fields change with it, and nothing changes when it throws.
 */
export function move<K>(sub: Subscription<K>, event: SubscriptionEvent, data: { token?: string; att?: number } = {}): SubscriptionState {
  const state = subscriptionTransition(sub.state, event);
  const holdsToken = HOLDS_TOKEN.includes(state);
  const token = event === "token" ? data.token : holdsToken ? sub.token : undefined;
  const att = state === "ATTACHED" ? data.att : undefined;
  if ((token === undefined) === holdsToken || (att === undefined) === (state === "ATTACHED")) {
    throw new TransitionError(`${event} in state ${sub.state} without a token or att`);
  }
  sub.state = state;
  sub.token = token;
  sub.att = att;
  return state;
}
