// The pvwire status page (/status): who is connected to both endpoints (/stream and /pvws/pv),
// which upstream channels are open, and how the event loop and the tick are doing. It polls the
// GraphQL `server` query once a second; rates (frames/s, kB/s, ticks/s, tick time) are computed
// from two successive polls, so they show "–" until the second one.
//
// `clients` and `channels` need an admin identity (the admin group, or without one configured, a
// request from the server's own machine): without it the page shows the server's public figures
// and says why the tables are empty.
import { RequestError } from "../src/errors.js";
import { graphqlRequest } from "../src/graphql.js";

const POLL_MS = 1000;

const PUBLIC_QUERY = "{ server { version uptime tickMs loopLagMs ticks tickSeconds } }";
const ADMIN_QUERY = `{ server {
  clients { id address endpoint identity attachments channels queuedBytes conflated framesSent bytesSent connectedSeconds }
  channels { id subscribers updates updateRate connection lastUpdate }
} }`;

interface PublicInfo { version: string; uptime: number; tickMs: number; loopLagMs: number; ticks: number; tickSeconds: number }
interface ClientRow {
  id: number; address: string; endpoint: string; identity: string; attachments: number; channels: number;
  queuedBytes: number; conflated: number; framesSent: number; bytesSent: number; connectedSeconds: number;
}
interface ChannelRow { id: string; subscribers: number; updates: number; updateRate: number; connection: string; lastUpdate: number | null }

/** One poll's answer and when it arrived (performance.now(), ms). */
interface Poll { at: number; info: PublicInfo; clients: Map<string, ClientRow> | undefined }

// Each endpoint numbers its own clients from 1: a client is known by its endpoint and number.
const clientKey = (c: ClientRow) => `${c.endpoint}/${c.id}`;

const params = new URLSearchParams(location.search);
const endpoint = `${params.get("server") ?? location.origin}/graphql`;
const fetchFn = globalThis.fetch.bind(globalThis);

const $ = (id: string) => document.getElementById(id) as HTMLElement;

function duration(seconds: number): string {
  const s = Math.floor(seconds);
  const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  if (d > 0) return `${d}d ${h}h`;
  if (h > 0) return `${h}h ${m}m`;
  if (m > 0) return `${m}m ${s % 60}s`;
  return `${s}s`;
}

function rate(now: number, before: number | undefined, seconds: number): string {
  return before === undefined || seconds <= 0 ? "–" : ((now - before) / seconds).toFixed(1);
}

function localTime(posixSeconds: number): string {
  const d = new Date(posixSeconds * 1000);
  const pad = (n: number, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

/** A row of cells, each with a data-testid of its column, so tests and people find them alike. */
function row(cells: [testid: string, text: string, cls?: string][]): HTMLTableRowElement {
  const tr = document.createElement("tr");
  for (const [testid, text, cls] of cells) {
    const td = document.createElement("td");
    td.dataset.testid = testid;
    td.className = cls ?? testid;
    td.textContent = text;
    tr.appendChild(td);
  }
  return tr;
}

function renderHeader(now: Poll, before: Poll | undefined): void {
  const info = now.info;
  $("version").textContent = info.version;
  $("uptime").textContent = duration(info.uptime);
  $("loop-lag").textContent = `${info.loopLagMs.toFixed(1)} ms`;
  // Mean time spent in one tick over the last poll interval (the tick period is info.tickMs).
  const ticks = before ? info.ticks - before.info.ticks : 0;
  const spent = before ? info.tickSeconds - before.info.tickSeconds : 0;
  $("tick-time").textContent = ticks > 0 ? `${((spent / ticks) * 1000).toFixed(3)} ms of ${info.tickMs} ms` : `– of ${info.tickMs} ms`;
  $("tick-rate").textContent = before ? rate(info.ticks, before.info.ticks, (now.at - before.at) / 1000) : "–";
}

function renderClients(now: Poll, before: Poll | undefined): void {
  const clients = [...(now.clients?.values() ?? [])].sort((a, b) => a.endpoint.localeCompare(b.endpoint) || a.id - b.id);
  const seconds = before ? (now.at - before.at) / 1000 : 0;
  const body = $("clients");
  body.replaceChildren(...clients.map((c) => {
    const prev = before?.clients?.get(clientKey(c));
    const tr = row([
      ["id", String(c.id), "num"],
      ["endpoint", c.endpoint],
      ["address", c.address],
      ["identity", c.identity],
      ["channels", String(c.channels), "num"],
      ["attachments", String(c.attachments), "num"],
      ["queued", String(c.queuedBytes), "num queued"],
      ["conflated", String(c.conflated), "num conflated"],
      ["frame-rate", rate(c.framesSent, prev?.framesSent, seconds), "num"],
      ["byte-rate", prev ? rate(c.bytesSent / 1000, prev.bytesSent / 1000, seconds) : "–", "num"],
      ["connected", duration(c.connectedSeconds), "num"],
    ]);
    tr.dataset.clientId = String(c.id);
    tr.dataset.endpoint = c.endpoint;
    if (c.queuedBytes > 0 || (prev !== undefined && c.conflated > prev.conflated)) tr.classList.add("behind");
    return tr;
  }));
  $("client-count").textContent = String(clients.length);
}

function renderChannels(channels: ChannelRow[]): void {
  const nowSeconds = Date.now() / 1000;
  const body = $("channels");
  body.replaceChildren(...[...channels].sort((a, b) => a.id.localeCompare(b.id)).map((ch) => {
    const tr = row([
      ["id", ch.id],
      ["subscribers", String(ch.subscribers), "num"],
      ["update-rate", ch.updateRate.toFixed(1), "num"],
      ["updates", String(ch.updates), "num"],
      ["connection", ch.connection, `connection conn-${ch.connection}`],
      ["last-update", ch.lastUpdate === null ? "–" : localTime(ch.lastUpdate), "last-update"],
    ]);
    if (ch.lastUpdate !== null) {
      const age = document.createElement("span");
      age.className = "age";
      age.textContent = `${duration(Math.max(0, nowSeconds - ch.lastUpdate))} ago`;
      tr.lastElementChild!.appendChild(age);
    }
    tr.dataset.channel = ch.id;
    return tr;
  }));
  $("channel-count").textContent = String(channels.length);
}

let previous: Poll | undefined;

async function poll(): Promise<void> {
  const errors: string[] = [];
  const [pub, admin] = await Promise.allSettled([
    graphqlRequest<{ server: PublicInfo }>(fetchFn, endpoint, PUBLIC_QUERY, {}),
    graphqlRequest<{ server: { clients: ClientRow[]; channels: ChannelRow[] } }>(fetchFn, endpoint, ADMIN_QUERY, {}),
  ]);
  const refreshed = $("refreshed");
  if (pub.status === "rejected") {
    errors.push(`server unreachable: ${(pub.reason as Error).message}`);
    refreshed.className = "conn-disconnected";
  } else {
    const now: Poll = { at: performance.now(), info: pub.value.server, clients: undefined };
    if (admin.status === "fulfilled") {
      now.clients = new Map(admin.value.server.clients.map((c) => [clientKey(c), c]));
      renderChannels(admin.value.server.channels);
    } else {
      const reason = admin.reason as Error;
      const forbidden = reason instanceof RequestError && reason.code === "FORBIDDEN";
      errors.push(forbidden ? `clients and channels are for administrators: ${reason.message}` : reason.message);
      renderChannels([]);
    }
    renderHeader(now, previous);
    renderClients(now, previous);
    previous = now;
    refreshed.textContent = new Date().toLocaleTimeString();
    refreshed.className = "conn-connected";
  }
  $("error").textContent = errors.join("; ");
}

// One poll at a time: the next starts a second after the previous ended, so a slow server is
// never sent a pile of overlapping queries.
async function loop(): Promise<void> {
  try {
    await poll();
  } catch (err) {
    $("error").textContent = (err as Error).message;
  }
  setTimeout(() => void loop(), POLL_MS);
}
void loop();
