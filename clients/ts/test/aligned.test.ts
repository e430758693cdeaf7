// ndarray data arrives aligned (PROTOCOL.md section 3, Padding): through the real server over a
// real WebSocket, every array of a float64 waveform and of int32, float32 and uint16 images is a
// TypedArray over the received message's own ArrayBuffer, i.e. the client made no copy.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import WebSocket from "ws";
import { NdArray, PvwireClient, type ChannelState, type TypedArray, type WebSocketConstructor } from "../src/index.js";
import { stackUnavailable, startStack, until, type Stack } from "./stack.js";

const skip = stackUnavailable();
if (skip) throw new Error(`alignment tests cannot run: ${skip}`);

// Every ArrayBuffer the WebSocket delivered (ws converts each binary message once, and every
// listener, the client's included, gets that same object).
const received = new WeakSet<ArrayBuffer>();
class RecordingWebSocket extends WebSocket {
  constructor(url: string, protocols?: string | string[]) {
    super(url, protocols);
    this.on("message", (data: unknown) => { if (data instanceof ArrayBuffer) received.add(data); });
  }
}

const IDS = [
  "sim://counter?rate=10",
  "sim://waveform?length=100000&rate=5",
  "sim://image?width=300&height=300&dtype=int32&rate=5",
  "sim://image?width=300&height=300&dtype=float32&rate=5",
  "sim://image?width=512&height=512&dtype=uint16&rate=5",
];
const DTYPES = ["float64", "int32", "float32", "uint16"];

describe("aligned ndarray data over the real server", () => {
  let stack: Stack;
  let client: PvwireClient;

  beforeAll(async () => {
    stack = await startStack();
    client = new PvwireClient(stack.url, { WebSocket: RecordingWebSocket as unknown as WebSocketConstructor });
  });
  afterAll(async () => {
    client?.close();
    await stack?.stop();
  });

  it("views every array in the received message, aligned", async () => {
    const seen = new Map<string, { data: TypedArray; dtype: string }[]>();
    const sub = client.subscribe(IDS, (st: ChannelState) => {
      const v = st.value;
      const data = v instanceof NdArray ? v.data : ArrayBuffer.isView(v) ? (v as TypedArray) : undefined;
      if (data === undefined) return;
      const dtype = v instanceof NdArray ? v.dtype : "float64";
      const list = seen.get(st.id) ?? [];
      // Checked when it arrives: the client's buffer is the message the WebSocket delivered.
      list.push({ data, dtype: received.has(data.buffer as ArrayBuffer) ? dtype : "copied" });
      seen.set(st.id, list);
    });
    try {
      // The snapshot and at least three DATA messages for each array channel (seq and att widths
      // and the groups before differ from one message to the next).
      await until(() => IDS.slice(1).every((id) => (seen.get(id)?.length ?? 0) >= 4), 60_000, "four values of each array channel");
    } finally {
      sub.unsubscribe();
    }
    IDS.slice(1).forEach((id, i) => {
      for (const { data, dtype } of seen.get(id)!) {
        expect(dtype).toBe(DTYPES[i]);
        expect(data.byteOffset % 8).toBe(0);
        expect(data.length).toBeGreaterThan(0);
      }
    });
  }, 90_000);
});
