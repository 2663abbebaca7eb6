/**
 * A real `qftrio serve --dev` on a fresh SQLite file and a free port, for the
 * tests. `QFTRIO_BIN` names the `qftrio` executable (tests/test_sdk_typescript.py
 * sets it to the virtualenv's); without it, the repository's `.venv` is used.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { setTimeout as sleep } from "node:timers/promises";
import { Client, type Job, type Status } from "qftrio";

const ROOT = fileURLToPath(new URL("../../../../", import.meta.url)); // dist/test -> the repository
export const QFTRIO_BIN = process.env.QFTRIO_BIN ?? join(ROOT, ".venv", "bin", "qftrio");
/** A `--dev` server's credential: tenant `default`, and a worker. */
export const TOKEN = "dev";

export interface Server {
  url: string;
  client: Client;
  stop(): Promise<void>;
}

/** The server of a test file: the one `npm test` shares between the files
 * (`QFTRIO_TEST_URL`, see run.ts), else one of its own. Tests share it by
 * using queues of their own. */
export async function testServer(): Promise<Server> {
  const url = process.env.QFTRIO_TEST_URL;
  return url ? { url, client: new Client(url, TOKEN), stop: async () => {} } : startServer();
}

/** Start a server and wait until it answers (bounded by its start-up, not a clock). */
export async function startServer(): Promise<Server> {
  const dir = mkdtempSync(join(tmpdir(), "qftrio-ts-"));
  const url = `http://127.0.0.1:${await closedPort()}`;
  const child = spawn(
    QFTRIO_BIN,
    ["serve", "--dev", "--db", join(dir, "qftrio.db"), "--bind", url.slice("http://".length)],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  let log = "";
  child.stderr!.setEncoding("utf8").on("data", (chunk: string) => (log += chunk));
  const failed = new Promise<never>((_, reject) => {
    child.once("error", reject);
    child.once("exit", (code) => reject(new Error(`qftrio serve exited with ${code} before it answered:\n${log}`)));
  });
  const client = new Client(url, TOKEN);
  const healthy = (async () => {
    for (;;) {
      try {
        if ((await client.health()).status === "ok") return;
      } catch {
        // not listening yet
      }
      await sleep(50);
    }
  })();
  await Promise.race([healthy, failed]);
  return {
    url,
    client,
    async stop() {
      await stopChild(child);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  await exited;
}

/** Poll *jobId* until *done* holds. The cap is generous: the wait is bounded
 * by the work, and the cap only turns a hang into a failure. */
export async function waitForJob(
  client: Client,
  jobId: string,
  done: (job: Job) => boolean = (job) => (["completed", "failed", "cancelled"] as Status[]).includes(job.status),
  capMs = 30_000,
): Promise<Job> {
  const end = Date.now() + capMs;
  for (;;) {
    const job = await client.jobGet(jobId);
    if (done(job)) return job;
    if (Date.now() > end) throw new Error(`job ${jobId} still ${job.status} (attempt ${job.attempt}) after ${capMs} ms`);
    await sleep(50);
  }
}

/** The first of *events* (a list that grows) for which *predicate* holds. */
export function until<T>(events: T[], predicate: (event: T) => boolean, capMs = 30_000): Promise<T> {
  const end = Date.now() + capMs;
  return (async () => {
    for (;;) {
      const found = events.find(predicate);
      if (found !== undefined) return found;
      if (Date.now() > end) throw new Error(`no such event after ${capMs} ms: ${JSON.stringify(events)}`);
      await sleep(20);
    }
  })();
}

/** A port nothing listens on (it was free a moment ago). */
export function closedPort(): Promise<number> {
  return new Promise((resolve) => {
    const probe = createServer().listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}
