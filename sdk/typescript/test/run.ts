// `npm test`: one server for every test file (each file starts its own
// when run alone), then Node's test runner over the built tests.

import { spawn } from "node:child_process";
import { readdirSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { startServer } from "./server.js";

const here = fileURLToPath(new URL(".", import.meta.url));
const files = readdirSync(here).filter((name) => name.endsWith(".test.js")).sort().map((name) => here + name);
const server = await startServer();
let status: number | null = 1;
try {
  // A test that fails may leave a worker running: each file's process ends
  // when its tests have, and a test that hangs fails after a minute.
  const options = ["--test", "--test-concurrency=1", "--test-force-exit", "--test-timeout=60000"];
  const runner = spawn(process.execPath, [...options, ...process.argv.slice(2), ...files], {
    env: { ...process.env, QFTRIO_TEST_URL: server.url },
    stdio: "inherit",
  });
  status = await new Promise<number | null>((resolve) => runner.once("exit", resolve));
} finally {
  await server.stop();
}
process.exit(status ?? 1);
