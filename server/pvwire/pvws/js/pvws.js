// pvws.js, served by pvwire at /pvws/js/pvws.js: the browser client of the pvws protocol for pages
// written against pvws' own (dbwr's displays, pvws' example pages). Same global class and calls:
//
//   const pvws = new PVWS("ws://host/pvws/pv", connected => ..., message => ...);
//   pvws.open();             // connect_handler(false) now, connect_handler(true) once open
//   pvws.subscribe("PV");    // or an array of names; clear(...) the same way
//   pvws.write("PV", 3.14);  // number or text
//   pvws.list(); pvws.ping(); pvws.close();
//
// message_handler receives every message the server sends. For an `update` it receives the PV's
// merged state (every field received so far for that PV, starting from {pv, readonly: true}), with
// base64 arrays decoded into `value` as a plain array (b64dbl, b64flt: numbers; b64srt, b64int:
// signed integers; b64byt: bytes 0..255). A socket that closes, for any reason, including close(),
// is opened again after `reconnect_ms`; the page subscribes again when connect_handler(true) comes
// (the server forgets a closed socket's subscriptions). While connected and idle (nothing received
// for `idle_check_ms`) the client asks the server for a WebSocket ping, which keeps proxies that
// close idle connections from doing so.
"use strict";

class PVWS {
  /**
   * @param url WebSocket URL of the pvws endpoint, e.g. "ws://host:8080/pvws/pv"
   * @param connect_handler called with true when connected, false when not (also before opening)
   * @param message_handler called with each message (for updates: the PV's merged state)
   */
  constructor(url, connect_handler, message_handler) {
    this.url = url;
    this.connect_handler = connect_handler;
    this.message_handler = message_handler;
    this.socket = null;
    this.values = {}; // PV name -> merged state of its updates
    // PVs cleared and not subscribed again: an update already on its way when clear() was
    // called is dropped, or the PV would come back into `values` and to the page after it.
    this.cleared = new Set();
    this.idle = true;
    this.idle_timer = null;
    this.reconnect_timer = null;
  }

  /** Connect (again). */
  open() {
    if (this.reconnect_timer !== null) {
      clearTimeout(this.reconnect_timer);
      this.reconnect_timer = null;
    }
    this.connect_handler(false);
    const socket = new WebSocket(this.url);
    this.socket = socket;
    // Handlers ignore a socket that is no longer the current one (open() called again).
    socket.onopen = () => { if (socket === this.socket) this.handleConnection(); };
    socket.onmessage = (event) => { if (socket === this.socket) this.handleMessage(event.data); };
    socket.onclose = (event) => { if (socket === this.socket) this.handleClose(event); };
    socket.onerror = () => { if (socket === this.socket) this.handleError(); };
  }

  handleConnection() {
    this.idle = true;
    this.connect_handler(true);
    if (this.idle_timer === null) {
      this.idle_timer = setInterval(() => this.checkIdle(), this.idle_check_ms);
    }
  }

  checkIdle() {
    if (this.idle) this.ping();
    this.idle = true;
  }

  stopIdleCheck() {
    if (this.idle_timer !== null) clearInterval(this.idle_timer);
    this.idle_timer = null;
  }

  handleMessage(text) {
    this.idle = false;
    let message;
    try {
      message = JSON.parse(text);
    } catch (e) {
      console.error("pvws: not JSON from " + this.url + ": " + String(text).slice(0, 200));
      return;
    }
    if (message === null || typeof message !== "object" || message.type !== "update") {
      this.message_handler(message);
      return;
    }
    for (const field in PVWS_ARRAYS) {
      if (message[field] !== undefined) {
        message.value = PVWS_ARRAYS[field](pvwsBytes(message[field]));
        delete message[field];
        break;
      }
    }
    if (this.cleared.has(message.pv)) return;
    let merged = this.values[message.pv];
    if (merged === undefined) merged = this.values[message.pv] = { pv: message.pv, readonly: true };
    Object.assign(merged, message);
    this.message_handler(merged);
  }

  handleError() {
    console.error("pvws: error on " + this.url);
    this.close();
  }

  handleClose(event) {
    this.stopIdleCheck();
    this.connect_handler(false);
    console.log("pvws: " + this.url + " closed (" + event.code + (event.reason ? ", " + event.reason : "")
      + "), reconnecting in " + this.reconnect_ms + " ms");
    if (this.reconnect_timer === null) {
      this.reconnect_timer = setTimeout(() => { this.reconnect_timer = null; this.open(); }, this.reconnect_ms);
    }
  }

  send(message) {
    if (this.socket === null || this.socket.readyState !== WebSocket.OPEN) {
      console.warn("pvws: not connected to " + this.url + ", not sent: " + message.type);
      return false;
    }
    this.socket.send(JSON.stringify(message));
    return true;
  }

  /** Ask the server for a WebSocket ping (the browser answers it with a pong). */
  ping() {
    this.send({ type: "ping" });
  }

  /** @param pvs PV name or array of names */
  subscribe(pvs) {
    const names = Array.isArray(pvs) ? pvs : [pvs];
    for (const name of names) this.cleared.delete(name);
    this.send({ type: "subscribe", pvs: names });
  }

  /** @param pvs PV name or array of names; their merged states are forgotten */
  clear(pvs) {
    const names = Array.isArray(pvs) ? pvs : [pvs];
    this.send({ type: "clear", pvs: names });
    for (const name of names) {
      this.cleared.add(name);
      delete this.values[name];
    }
  }

  /** The server answers with {type: "list", pvs: [...]}. */
  list() {
    this.send({ type: "list" });
  }

  /** @param pv subscribed PV name  @param value number or text */
  write(pv, value) {
    this.send({ type: "write", pv: pv, value: value });
  }

  /** Close the socket; it is opened again after reconnect_ms, as after any other close. */
  close() {
    this.stopIdleCheck();
    if (this.socket !== null) this.socket.close();
  }
}

PVWS.prototype.reconnect_ms = 10000;
PVWS.prototype.idle_check_ms = 30000;

/** Base64 text to bytes: base64.js' toByteArray when the page loaded it, else atob. */
function pvwsBytes(text) {
  if (typeof toByteArray === "function") return toByteArray(text);
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** A little-endian element array of `bytes` as a plain array (JSON.stringify-able). */
function pvwsElements(bytes, size, read) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const out = new Array(Math.floor(bytes.byteLength / size));
  for (let i = 0; i < out.length; i++) out[i] = read(view, i * size);
  return out;
}

// pvws' array fields, all little-endian.
const PVWS_ARRAYS = {
  b64dbl: (b) => pvwsElements(b, 8, (v, o) => v.getFloat64(o, true)),
  b64flt: (b) => pvwsElements(b, 4, (v, o) => v.getFloat32(o, true)),
  b64srt: (b) => pvwsElements(b, 2, (v, o) => v.getInt16(o, true)),
  b64int: (b) => pvwsElements(b, 4, (v, o) => v.getInt32(o, true)),
  b64byt: (b) => Array.from(b),
};
