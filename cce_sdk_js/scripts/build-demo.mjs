// Build the browser demo: one self-contained HTML file (the lite engine bundled inline, no
// modules, no network), so it opens from disk or any static host.
//   node scripts/build-demo.mjs [--out dist/cce-lite-demo.html]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const outArg = process.argv.indexOf("--out");
const out = path.resolve(outArg > 0 ? process.argv[outArg + 1] : path.join(root, "dist", "cce-lite-demo.html"));

const IMPORT = /^import\s*\{([^}]*)\}\s*from\s*"(\.\/[\w.-]+\.js)";\s*$/gm;
const REEXPORT = /^export\s*\{([^}]*)\}\s*from\s*"(\.\/[\w.-]+\.js)";\s*$/gm;
const DECL = /^export\s+(?:async\s+)?(function|class|const|let)\s+([A-Za-z_$][\w$]*)/gm;
const LIST = /^export\s*\{([^}]*)\};\s*$/gm;
const JSON_IMPORT = /^import\s+([A-Za-z_$][\w$]*)\s+from\s*"\.\/([\w.-]+\.json)"\s+with\s*\{\s*type:\s*"json"\s*\};\s*$/gm;

const names = (list) => list.split(",").map((s) => s.trim()).filter(Boolean).map((s) => {
  const [from, as] = s.split(/\s+as\s+/);
  return { from: from.trim(), as: (as ?? from).trim() };
});

/** Modules reachable from src/index.js, dependencies first. */
function order(entry) {
  const seen = new Set();
  const out2 = [];
  const visit = (file) => {
    if (seen.has(file)) return;
    seen.add(file);
    const src = fs.readFileSync(path.join(root, "src", file), "utf8");
    for (const m of src.matchAll(/from\s*"\.\/([\w.-]+\.js)"/g)) visit(m[1]);
    out2.push(file);
  };
  visit(entry);
  return out2;
}

function wrap(file) {
  let src = fs.readFileSync(path.join(root, "src", file), "utf8");
  const exported = [];
  // a JSON module (the ranking specification) is inlined as a constant
  src = src.replace(JSON_IMPORT, (_, name, json) => `const ${name} = ${JSON.stringify(
    JSON.parse(fs.readFileSync(path.join(root, "src", json), "utf8")))};`);
  src = src.replace(REEXPORT, (_, list, dep) => {
    for (const n of names(list)) exported.push(`${n.as}: __m[${JSON.stringify(dep)}].${n.from}`);
    return "";
  });
  src = src.replace(IMPORT, (_, list, dep) => `const { ${names(list).map((n) => n.from === n.as ? n.as : `${n.from}: ${n.as}`).join(", ")} } = __m[${JSON.stringify(dep)}];`);
  src = src.replace(LIST, (_, list) => {
    for (const n of names(list)) exported.push(`${n.as}: ${n.from}`);
    return "";
  });
  src = src.replace(DECL, (_, kind, name) => {
    exported.push(name);
    return `${kind} ${name}`;
  });
  if (/^\s*(import|export)\b/m.test(src)) throw new Error(`${file}: an import/export the demo bundler does not understand`);
  return `__m[${JSON.stringify(`./${file}`)}] = (function () {\n"use strict";\n${src}\nreturn { ${exported.join(", ")} };\n})();`;
}

const bundle = `var CCE = (function () {\nconst __m = {};\n${order("index.js").map(wrap).join("\n")}\nreturn __m["./index.js"];\n})();`;
const fixture = JSON.parse(fs.readFileSync(path.join(root, "test", "fixtures", "conversation.json"), "utf8"));
const sample = fixture.sessions.lighthouse.map((m) => `${m.role === "user" ? "User" : "Assistant"}: ${m.content}`).join("\n");
const page = fs.readFileSync(path.join(root, "demo", "demo.html"), "utf8")
  .replace("/*BUNDLE*/", () => bundle.replace(/<\/script/gi, "<\\/script"))
  .replace("/*SAMPLE*/", () => JSON.stringify(sample).replace(/<\/script/gi, "<\\/script"))
  .replace("/*DEMO*/", () => fs.readFileSync(path.join(root, "demo", "demo.js"), "utf8"));
fs.mkdirSync(path.dirname(out), { recursive: true });
fs.writeFileSync(out, page);
console.log(`wrote ${path.relative(process.cwd(), out)} (${page.length} bytes)`);
