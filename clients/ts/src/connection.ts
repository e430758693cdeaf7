/**
 * The client's connection state machine, one table (as h11's _state.py):
 *
 *   disconnected --open--> connecting --hello--> connected
 *   connecting/connected --lost--> connecting   (a reconnect close code: retry after backoff)
 *   any --closed--> disconnected                (terminal close code, or close() by the app)
 */
export type ConnectionState = "disconnected" | "connecting" | "connected";
export type ConnectionEvent = "open" | "hello" | "lost" | "closed";

export const TRANSITIONS: Readonly<Record<ConnectionState, Partial<Record<ConnectionEvent, ConnectionState>>>> = {
  disconnected: { open: "connecting", closed: "disconnected" },
  connecting: { open: "connecting", hello: "connected", lost: "connecting", closed: "disconnected" },
  connected: { lost: "connecting", closed: "disconnected" },
};

export function transition(state: ConnectionState, event: ConnectionEvent): ConnectionState {
  const next = TRANSITIONS[state][event];
  if (next === undefined) throw new Error(`illegal connection transition: ${event} in state ${state}`);
  return next;
}

export interface BackoffOptions {
  /** First retry at most this late (ms). Default 500. */
  baseMs?: number;
  /**
   * Cap (ms). Default 5,000: a few seconds, so a client is back within one short wait of the
   * server's return (after a 30 s outage a 30 s cap left clients away for up to 23 s after the
   * server was back, 5 s for at most 4.2 s: bench/README.md, bench/resume.py).
   */
  maxMs?: number;
}

/** The defaults, shared with the Python client (PROTOCOL.md section 8). */
export const DEFAULT_BACKOFF: Readonly<Required<BackoffOptions>> = { baseMs: 500, maxMs: 5_000 };

/**
 * Full jitter: random(0, min(max, base * 2^attempt)) (PROTOCOL.md section 8). `attempt` counts
 * the retries since the last HELLO: a server that answered starts the next outage from 0.
 */
export function backoffDelay(attempt: number, o: Required<BackoffOptions>, random: () => number): number {
  return random() * Math.min(o.maxMs, o.baseMs * 2 ** attempt);
}
