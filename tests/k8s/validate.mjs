// Validates Kubernetes objects offline against the API's OpenAPI schemas, for
// tests/integration/test_k8s_manifests.py: node validate.mjs FILE.yaml (a rendered stream of
// documents). Prints one JSON line per document: {index, kind, name, errors: [...]}.
//
// Two passes per object:
//  * the schema: kubernetes-models' validate() (the OpenAPI schemas compiled with ajv):
//    required fields, types, enums, formats;
//  * strict: every field must be one the API defines. The schemas allow unknown fields (the
//    API server drops them silently, so a typo such as `readinessprobe` would pass), so
//    this pass walks the object along the models' type declarations (.d.ts), which list
//    every field of every type.
// Dependencies: tests/k8s/package.json (npm ci --prefix tests/k8s; scripts/test does it).

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import YAML from "yaml";

const require = createRequire(import.meta.url);

// "v1" -> kubernetes-models/v1/KIND, "apps/v1" -> kubernetes-models/apps/v1/KIND
function modelSpec(apiVersion, kind) {
  return `kubernetes-models/${apiVersion}/${kind}`;
}

// ---- the strict pass: field names from the .d.ts declarations

const declCache = new Map();

function resolveDecl(spec, fromFile) {
  const js = spec.startsWith(".")
    ? path.resolve(path.dirname(fromFile), spec) + ".js"
    : require.resolve(spec);
  return js.replace(/\.(m?js)$/, ".d.ts");
}

function stripComments(text) {
  return text.replace(/\/\*[\s\S]*?\*\//g, "").replace(/^\s*\/\/.*$/gm, "");
}

// Splits "name?: type; name2: type2; ..." of an interface body at depth 0.
function properties(body) {
  const props = new Map();
  let i = 0;
  const re = /\s*"?([A-Za-z0-9_$.\-]+)"?\??\s*:\s*/y;
  while (i < body.length) {
    re.lastIndex = i;
    const m = re.exec(body);
    if (!m) {
      i++;
      continue;
    }
    let j = re.lastIndex;
    let depth = 0;
    const start = j;
    for (; j < body.length; j++) {
      const c = body[j];
      if (c === "{" || c === "<" || c === "(" || c === "[") depth++;
      else if (c === "}" || c === ">" || c === ")" || c === "]") depth--;
      else if (c === ";" && depth === 0) break;
    }
    props.set(m[1], body.slice(start, j).trim());
    i = j + 1;
  }
  return props;
}

function decl(file) {
  if (declCache.has(file)) return declCache.get(file);
  const text = stripComments(readFileSync(file, "utf8"));
  const imports = new Map();
  for (const m of text.matchAll(/import\s*\{([^}]*)\}\s*from\s*"([^"]+)"/g)) {
    for (const part of m[1].split(",")) {
      const [orig, alias] = part.trim().split(/\s+as\s+/);
      if (orig) imports.set((alias || orig).trim(), m[2]);
    }
  }
  // The first interface of the file is the type it declares (extends clauses aside).
  let props = null;
  const head = /export interface \w+(?:\s+extends\s+[^{]+)?\s*\{/.exec(text);
  if (head) {
    let depth = 1;
    let j = head.index + head[0].length;
    const start = j;
    for (; j < text.length && depth > 0; j++) {
      if (text[j] === "{") depth++;
      else if (text[j] === "}") depth--;
    }
    props = properties(text.slice(start, j - 1));
    if (/extends\s+TypeMeta/.test(head[0])) {
      props.set("apiVersion", props.get("apiVersion") || "string");
      props.set("kind", props.get("kind") || "string");
    }
  }
  const d = { imports, props };
  declCache.set(file, d);
  return d;
}

function walkType(value, type, file, where, errors) {
  if (value === null || value === undefined) return;
  let m;
  if ((m = /^Array<([\s\S]+)>$/.exec(type))) {
    if (Array.isArray(value)) value.forEach((v, k) => walkType(v, m[1].trim(), file, `${where}[${k}]`, errors));
    return;
  }
  if ((m = /^\{\s*\[key: string\]:\s*([\s\S]+?);?\s*\}$/.exec(type))) {
    if (value && typeof value === "object" && !Array.isArray(value)) {
      for (const [k, v] of Object.entries(value)) walkType(v, m[1].trim(), file, `${where}.${k}`, errors);
    }
    return;
  }
  const d = decl(file);
  if (/^\w+$/.test(type) && d.imports.has(type)) {
    walkObject(value, resolveDecl(d.imports.get(type), file), where, errors);
  }
  // Anything else is a primitive, a literal or a union: the schema pass checks it.
}

function walkObject(obj, file, where, errors) {
  if (!obj || typeof obj !== "object" || Array.isArray(obj)) return;
  const d = decl(file);
  if (!d.props) return; // a type alias (Quantity, IntOrString, Time...)
  for (const [k, v] of Object.entries(obj)) {
    if (!d.props.has(k)) {
      errors.push(`${where}.${k}: unknown field (not in ${path.basename(file, ".d.ts")})`);
      continue;
    }
    walkType(v, d.props.get(k), file, `${where}.${k}`, errors);
  }
}

// ---- main

async function check(doc) {
  const errors = [];
  const { apiVersion, kind } = doc || {};
  if (typeof apiVersion !== "string" || typeof kind !== "string") {
    return ["apiVersion and kind must be strings"];
  }
  const spec = modelSpec(apiVersion, kind);
  let mod;
  try {
    mod = await import(spec);
  } catch (e) {
    return [`${apiVersion} ${kind}: not a Kubernetes API type (${e.code || e.message})`];
  }
  const Model = mod[kind];
  if (kind === "Secret" && doc.data && typeof doc.data === "object") {
    // kustomize 5 folds long base64 values over lines; the API server's decoder (Go's
    // encoding/base64) skips line breaks, ajv's "byte" format does not.
    for (const [k, v] of Object.entries(doc.data)) {
      if (typeof v === "string") doc.data[k] = v.replace(/[\r\n]/g, "");
    }
  }
  try {
    new Model(doc).validate();
  } catch (e) {
    const details = (e.errors || []).map((x) => `${x.instancePath || "/"} ${x.message}`);
    errors.push(...(details.length ? details : [String(e.message || e)]));
  }
  walkObject(doc, require.resolve(spec).replace(/\.(m?js)$/, ".d.ts"), kind, errors);
  return errors;
}

const file = process.argv[2];
if (!file) {
  console.error("usage: node validate.mjs FILE.yaml");
  process.exit(2);
}
const docs = YAML.parseAllDocuments(readFileSync(file, "utf8"));
let index = 0;
for (const d of docs) {
  const doc = d.toJS();
  if (doc === null || doc === undefined) continue;
  const errors = d.errors.length ? d.errors.map((e) => `YAML: ${e.message}`) : await check(doc);
  console.log(JSON.stringify({ index, kind: doc.kind, name: doc.metadata && doc.metadata.name, errors }));
  index++;
}
