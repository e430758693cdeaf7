// Where the token comes from in Node when the caller gives no getToken: PVWIRE_TOKEN, else the
// token `pvwire login` stored ($XDG_CACHE_HOME/pvwire/token.json, written by the Python client's
// login.py), renewed through the identity provider when it expires. In a browser: none (the page
// signs in itself). Node's modules are imported by a name the bundler does not see, so the page's
// bundle neither includes nor needs them.
import type { FetchLike } from "./graphql.js";

/** Renewed this long before it expires, as login.py does: a request in flight still carries it. */
const RENEW_MARGIN_S = 30;

interface NodeProcess { versions?: { node?: string }; env: Record<string, string | undefined> }
interface NodeFs {
  readFile(path: string, encoding: "utf8"): Promise<string>;
  writeFile(path: string, data: string, options: { mode: number }): Promise<void>;
  rename(from: string, to: string): Promise<void>;
  chmod(path: string, mode: number): Promise<void>;
}
interface NodeOs { homedir(): string }

interface Stored {
  issuer: string; client_id: string; token_endpoint: string; client_secret?: string;
  access_token: string; expires_at: number; refresh_token?: string;
}

const nodeImport = (name: string): Promise<unknown> => import(name);

/** The default getToken in Node (see the file's comment), or undefined elsewhere. */
export function defaultGetToken(fetchFn: FetchLike): (() => Promise<string | undefined>) | undefined {
  const proc = (globalThis as { process?: NodeProcess }).process;
  if (!proc?.versions?.node) return undefined;
  return async () => {
    const env = proc.env.PVWIRE_TOKEN;
    if (env !== undefined) return env || undefined;
    return storedToken(proc, fetchFn);
  };
}

async function storedToken(proc: NodeProcess, fetchFn: FetchLike): Promise<string | undefined> {
  const fs = (await nodeImport("node:fs/promises")) as NodeFs;
  const os = (await nodeImport("node:os")) as NodeOs;
  const path = `${proc.env.XDG_CACHE_HOME || `${os.homedir()}/.cache`}/pvwire/token.json`;
  let stored: Stored;
  try {
    stored = JSON.parse(await fs.readFile(path, "utf8")) as Stored;
  } catch {
    return undefined; // nobody logged in: anonymous
  }
  if (Date.now() / 1000 < stored.expires_at - RENEW_MARGIN_S) return stored.access_token;
  const form: Record<string, string> = { client_id: stored.client_id };
  if (stored.client_secret) Object.assign(form, { grant_type: "client_credentials", client_secret: stored.client_secret });
  else if (stored.refresh_token) Object.assign(form, { grant_type: "refresh_token", refresh_token: stored.refresh_token });
  else throw new Error("the stored token expired and cannot be renewed: pvwire login");
  const res = await fetchFn(stored.token_endpoint, {
    method: "POST",
    headers: { "content-type": "application/x-www-form-urlencoded" },
    body: new URLSearchParams(form).toString(),
  });
  const body = (await res.json()) as { access_token?: string; expires_in?: number; refresh_token?: string; error?: string; error_description?: string };
  if (!res.ok || !body.access_token) throw new Error(`renewing the stored token: ${body.error ?? res.status} ${body.error_description ?? ""}`.trim());
  const renewed: Stored = {
    ...stored,
    access_token: body.access_token,
    expires_at: Date.now() / 1000 + (body.expires_in ?? 60),
    refresh_token: body.refresh_token ?? stored.refresh_token ?? "",
  };
  // Written 0600 to a new file, then renamed over the old one: never readable by others.
  await fs.writeFile(`${path}.tmp`, JSON.stringify(renewed), { mode: 0o600 });
  await fs.chmod(`${path}.tmp`, 0o600);
  await fs.rename(`${path}.tmp`, path);
  return renewed.access_token;
}
