// Bundle the demo page (page/) with the library into server/pvwire/static/ (served at `/`).
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
  entryPoints: [join(here, "../page/main.ts")],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  sourcemap: true,
  outfile: join(out, "app.js"),
  logLevel: "warning",
});
copyFileSync(join(here, "../page/index.html"), join(out, "index.html"));
copyFileSync(join(here, "../page/app.css"), join(out, "app.css"));
