// The ranking specification is one file, sql/ranking_v1.json (shipped with the Python package);
// src/ranking_v1.json is a symbolic link to it, which `npm pack` would leave out. Before packing
// (`prepack`) the link is replaced by a copy of the file; after packing (`postpack`) the link is
// put back, so the repository keeps one definition.
//   node scripts/pack-spec.mjs copy | link
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const target = path.join(root, "src", "ranking_v1.json");
const source = path.join("..", "..", "sql", "ranking_v1.json"); // relative to src/
const mode = process.argv[2];
if (mode === "copy") {
  const text = fs.readFileSync(target, "utf8"); // through the link
  fs.unlinkSync(target);
  fs.writeFileSync(target, text);
} else if (mode === "link") {
  const real = fs.readFileSync(path.join(root, "src", source), "utf8");
  if (fs.readFileSync(target, "utf8") !== real) throw new Error("src/ranking_v1.json differs from sql/ranking_v1.json");
  fs.unlinkSync(target);
  fs.symlinkSync(source, target);
} else {
  throw new Error("usage: node scripts/pack-spec.mjs copy | link");
}
