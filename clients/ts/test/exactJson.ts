/** JSON.parse that keeps integers beyond 2^53 exact (as BigInt), e.g. uint64 max or a time in
 * ns: the vectors and the cases hold both. */
export function parseExact(text: string): unknown {
  const marked = text.replace(/(?<=[\[,:\s])(-?\d{16,})(?=[\s,\]}])/g, '"$$big:$1"');
  return JSON.parse(marked, (_k, v: unknown) => (typeof v === "string" && v.startsWith("$big:") ? BigInt(v.slice(5)) : v));
}
