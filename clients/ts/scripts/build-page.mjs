// Bundle the demo page and the status page (page/) with the library into server/pvwire/static/
// (served at `/` and `/status`).
// Everything is bundled: no CDN, works offline.
import { build } from "esbuild";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "../../../server/pvwire/static");
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });
await build({
  entryPoints: { app: join(here, "../page/main.ts"), status: join(here, "../page/status.ts") },
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  sourcemap: true,
  outdir: out,
  logLevel: "warning",
});
for (const file of ["index.html", "app.css", "status.html", "status.css"]) {
  copyFileSync(join(here, "../page", file), join(out, file));
}
