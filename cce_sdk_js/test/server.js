// Start a real `cce serve rest` (from CCE_PYTHON or the repository's .venv) for the tests.
import { spawn } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
export const repo = path.resolve(here, "..", "..");

export function python() {
  if (process.env.CCE_PYTHON) return process.env.CCE_PYTHON;
  const venv = path.join(repo, ".venv", "bin", "python");
  return fs.existsSync(venv) ? venv : "python3";
}

export function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

/** Run `cce serve <kind>` on a free port over a new data folder; resolves when /health answers. */
export async function startServer(kind, env = {}, args = []) {
  const port = await freePort();
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "cce-js-"));
  const code = "import sys; from cce_duck.cli import main; sys.argv[0] = 'cce'; main()";
  const child = spawn(python(), ["-c", code, "serve", kind, "--port", String(port), "--data-dir", dataDir,
    "--embedder", "hash", ...args], {
    env: { ...process.env, CCE_EMBEDDER: "hash", ...env }, stdio: ["ignore", "pipe", "pipe"],
  });
  let log = "";
  child.stdout.on("data", (d) => { log += d; });
  child.stderr.on("data", (d) => { log += d; });
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 90_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`cce serve ${kind} exited (${child.exitCode}):\n${log}`);
    try {
      const res = await fetch(`${url}/health`);
      if (res.ok) break;
    } catch { /* not up yet */ }
    if (Date.now() > deadline) { child.kill("SIGKILL"); throw new Error(`cce serve ${kind} did not start:\n${log}`); }
    await new Promise((r) => setTimeout(r, 200));
  }
  return {
    url, port, dataDir, child, log: () => log,
    async stop() {
      if (child.exitCode === null) {
        const done = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
        await done;
        clearTimeout(timer);
      }
      fs.rmSync(dataDir, { recursive: true, force: true });
      return child.exitCode;
    },
  };
}
