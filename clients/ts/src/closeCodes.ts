/**
 * WebSocket close codes (PROTOCOL.md section 8) and ERROR codes (section 6) of the stream. The
 * table itself is src/codeTable.ts, generated from protocol/close_codes.json, the single source.
 */
import { CLOSE_CODES, CloseCode, ErrorCode } from "./codeTable.js";

export { CLOSE_CODES, CloseCode, ErrorCode };
export type CloseClass = "reconnect" | "terminal";

const table: Readonly<Record<number, { name: string; class: CloseClass } | undefined>> = CLOSE_CODES;

/**
 * Reconnect or terminal, with the protocol's rule for codes not in the table: reconnect in
 * 1000-3999, terminal otherwise (the range's terminal exceptions are in the table).
 */
export function closeClass(code: number): CloseClass {
  const known = table[code];
  if (known) return known.class;
  return code >= 1000 && code <= 3999 ? "reconnect" : "terminal";
}

export function closeName(code: number): string {
  return table[code]?.name ?? `CODE_${code}`;
}
