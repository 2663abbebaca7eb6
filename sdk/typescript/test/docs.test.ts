// docs/sdk-typescript.md shows what the package has: the example as it is,
// and every method of the client.

import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { Client } from "qftrio";

const read = (path: string) => readFileSync(new URL(path, import.meta.url), "utf8");
const docs = read("../../../../docs/sdk-typescript.md");

test("the docs show examples/worker.ts as it is", () => {
  const shown = /`sdk\/typescript\/examples\/worker\.ts`:\n\n```ts\n([\s\S]*?)```\n/.exec(docs);
  assert.ok(shown, "the docs show the example");
  assert.equal(shown[1], read("../../examples/worker.ts"));
});

test("the docs name every method of the client", () => {
  const methods = Object.getOwnPropertyNames(Client.prototype).filter((name) => name !== "constructor");
  assert.deepEqual(methods.filter((name) => !docs.includes(`\`${name}(`) && !docs.includes(` ${name}(`)), []);
});
