// The Node client's default token (src/storedToken.ts): PVWIRE_TOKEN first, else the token
// `pvwire login` stored, renewed at a token endpoint served here over real HTTP on 127.0.0.1
// when it has expired, and written back with mode 0600.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { defaultGetToken } from "../src/storedToken.js";

describe("the token pvwire login stored, in Node", () => {
  let server: Server;
  let endpoint = "";
  const forms: URLSearchParams[] = [];
  let cache = "";
  const saved = { XDG_CACHE_HOME: process.env.XDG_CACHE_HOME, PVWIRE_TOKEN: process.env.PVWIRE_TOKEN };
  const file = () => join(cache, "pvwire", "token.json");
  const getToken = () => defaultGetToken(globalThis.fetch.bind(globalThis) as never)!;
  const store = (extra: Record<string, unknown>) => {
    mkdirSync(join(cache, "pvwire"), { recursive: true });
    writeFileSync(file(), JSON.stringify({ issuer: "http://idp", client_id: "pvwire-cli", token_endpoint: endpoint, access_token: "old", ...extra }), { mode: 0o600 });
  };

  beforeAll(async () => {
    server = createServer((req, res) => {
      let body = "";
      req.on("data", (d: Buffer) => { body += d.toString(); });
      req.on("end", () => {
        const form = new URLSearchParams(body);
        forms.push(form);
        const ok = form.get("refresh_token") === "r1" || form.get("client_secret") === "s3cret";
        res.writeHead(ok ? 200 : 400, { "content-type": "application/json" });
        res.end(JSON.stringify(ok ? { access_token: `new-${forms.length}`, expires_in: 300, refresh_token: "r2" } : { error: "invalid_grant", error_description: "Token is not active" }));
      });
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const address = server.address();
    endpoint = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}/token`;
  });
  afterAll(() => { server.close(); });
  afterEach(() => {
    for (const [k, v] of Object.entries(saved)) { if (v === undefined) delete process.env[k]; else process.env[k] = v; }
    if (cache) rmSync(cache, { recursive: true, force: true });
    forms.length = 0;
  });
  const fresh = () => {
    cache = mkdtempSync(join(tmpdir(), "pvwire-cache-"));
    process.env.XDG_CACHE_HOME = cache;
    delete process.env.PVWIRE_TOKEN;
  };

  it("PVWIRE_TOKEN wins; nobody logged in is anonymous", async () => {
    fresh();
    expect(await getToken()()).toBeUndefined();
    process.env.PVWIRE_TOKEN = "from-env";
    store({ expires_at: Date.now() / 1000 + 600 });
    expect(await getToken()()).toBe("from-env");
  });

  it("a valid stored token is used as it is", async () => {
    fresh();
    store({ expires_at: Date.now() / 1000 + 600, refresh_token: "r1" });
    expect(await getToken()()).toBe("old");
    expect(forms).toEqual([]);
  });

  it("an expired one is renewed with the refresh token and stored again, 0600", async () => {
    fresh();
    store({ expires_at: Date.now() / 1000 - 1, refresh_token: "r1" });
    expect(await getToken()()).toBe("new-1");
    expect(forms[0]?.get("grant_type")).toBe("refresh_token");
    const stored = JSON.parse(readFileSync(file(), "utf8")) as { access_token: string; refresh_token: string; expires_at: number };
    expect([stored.access_token, stored.refresh_token]).toEqual(["new-1", "r2"]);
    expect(stored.expires_at).toBeGreaterThan(Date.now() / 1000);
    expect(statSync(file()).mode & 0o777).toBe(0o600);
  });

  it("a service's is renewed with its secret; a refused renewal says so", async () => {
    fresh();
    store({ expires_at: 0, client_secret: "s3cret" });
    expect(await getToken()()).toBe("new-1");
    expect(forms[0]?.get("grant_type")).toBe("client_credentials");
    store({ expires_at: 0, refresh_token: "revoked" });
    await expect(getToken()()).rejects.toThrow(/invalid_grant/);
  });
});
