// The package ships what package.json lists: every entry of "files" exists, the README among them.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const pkg = JSON.parse(fs.readFileSync(path.join(root, "package.json"), "utf8"));

test("every file package.json lists exists, and the README says how to use both parts", () => {
  for (const entry of pkg.files) assert.ok(fs.existsSync(path.join(root, entry)), entry);
  assert.ok(pkg.files.includes("README.md"));
  const readme = fs.readFileSync(path.join(root, "README.md"), "utf8");
  for (const name of ["CCEClient", "createEngine", "context(", "search("]) assert.ok(readme.includes(name), name);
  assert.ok(fs.existsSync(path.join(root, pkg.types)));
});
