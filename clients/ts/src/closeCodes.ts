/**
 * WebSocket close codes of the stream (PROTOCOL.md section 8). A copy of
 * protocol/close_codes.json, the single source; test/closeCodes.test.ts fails if they differ.
 */
export type CloseClass = "reconnect" | "terminal";

export const CLOSE_CODES = {
  1000: { name: "NORMAL", class: "terminal" },
  1001: { name: "GOING_AWAY", class: "reconnect" },
  1002: { name: "PROTOCOL_ERROR", class: "reconnect" },
  1006: { name: "ABNORMAL", class: "reconnect" },
  1007: { name: "INVALID_DATA", class: "terminal" },
  1008: { name: "POLICY", class: "terminal" },
  1009: { name: "TOO_BIG", class: "terminal" },
  1011: { name: "INTERNAL", class: "reconnect" },
  1012: { name: "RESTART", class: "reconnect" },
  1013: { name: "TRY_AGAIN", class: "reconnect" },
  4000: { name: "HEARTBEAT_TIMEOUT", class: "reconnect" },
  4008: { name: "SLOW", class: "reconnect" },
  4401: { name: "BAD_TOKEN", class: "terminal" },
  4402: { name: "TOKEN_EXPIRED", class: "terminal" },
  4403: { name: "FORBIDDEN", class: "terminal" },
  4406: { name: "UNSUPPORTED", class: "terminal" },
} as const satisfies Record<number, { name: string; class: CloseClass }>;

export const CloseCode = {
  NORMAL: 1000, GOING_AWAY: 1001, PROTOCOL_ERROR: 1002, ABNORMAL: 1006, INVALID_DATA: 1007, POLICY: 1008, TOO_BIG: 1009, INTERNAL: 1011,
  RESTART: 1012, TRY_AGAIN: 1013, HEARTBEAT_TIMEOUT: 4000, SLOW: 4008, BAD_TOKEN: 4401,
  TOKEN_EXPIRED: 4402, FORBIDDEN: 4403, UNSUPPORTED: 4406,
} as const;

/** Reconnect or terminal, with the protocol's rule for codes not in the table. */
export function closeClass(code: number): CloseClass {
  const known = (CLOSE_CODES as Record<number, { class: CloseClass } | undefined>)[code];
  if (known) return known.class;
  return code >= 1000 && code <= 3999 ? "reconnect" : "terminal";
}

export function closeName(code: number): string {
  return (CLOSE_CODES as Record<number, { name: string } | undefined>)[code]?.name ?? `CODE_${code}`;
}
