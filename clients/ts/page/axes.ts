// Chart axes of the demo page: tick choice (pure, unit-tested) and the tick labels as DOM text
// beside the canvas, reusing their elements so a 60 Hz redraw does not churn the DOM.

export interface Tick {
  /** Position along the axis, 0 (start) to 1 (end). */
  readonly at: number;
  readonly label: string;
}

/**
 * About `target` "nice" tick values (1, 2 or 5 × 10^k apart) inside [lo, hi], with labels that
 * show just enough decimals to tell neighbouring ticks apart.
 */
export function niceTicks(lo: number, hi: number, target = 5): { value: number; label: string }[] {
  if (!Number.isFinite(lo) || !Number.isFinite(hi) || hi <= lo) return [];
  const raw = (hi - lo) / Math.max(1, target);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? 10 * mag;
  const decimals = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  const out: { value: number; label: string }[] = [];
  // Round the first tick up to a multiple of step; the epsilon keeps a tick at exactly hi.
  for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) {
    const value = Number(v.toFixed(decimals));
    out.push({ value, label: value.toFixed(decimals) });
  }
  return out;
}

/** Time ticks every `stepS` seconds of the local clock inside [fromMs, toMs], as HH:MM:SS. */
export function timeTicks(fromMs: number, toMs: number, stepS: number): { value: number; label: string }[] {
  const out: { value: number; label: string }[] = [];
  const step = stepS * 1000;
  for (let t = Math.ceil(fromMs / step) * step; t <= toMs; t += step) {
    const d = new Date(t);
    const two = (n: number) => String(n).padStart(2, "0");
    out.push({ value: t, label: `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}` });
  }
  return out;
}

/** Show `ticks` in `box` along `axis`; `at` is a fraction of the box (0 = left / top). */
export function placeTicks(box: HTMLElement, ticks: readonly Tick[], axis: "x" | "y"): void {
  while (box.children.length > ticks.length) box.lastElementChild!.remove();
  while (box.children.length < ticks.length) box.appendChild(document.createElement("span"));
  ticks.forEach((t, i) => {
    const el = box.children[i] as HTMLElement;
    if (el.textContent !== t.label) el.textContent = t.label;
    const pos = `${(t.at * 100).toFixed(2)}%`;
    if (axis === "x") { if (el.style.left !== pos) el.style.left = pos; }
    else if (el.style.top !== pos) el.style.top = pos;
  });
}
