// node validate.mjs FILE...: validates every document of the Kubernetes
// manifests against the API's JSON schemas, with the npm package
// kubernetes-models (one model class per apiVersion/kind, generated from
// the Kubernetes OpenAPI spec; validate() throws on any violation).
// Run by docker/k8s/check.sh, which installs kubernetes-models and yaml.
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

let bad = 0;
let checked = 0;
for (const file of process.argv.slice(2)) {
  const docs = parseAllDocuments(readFileSync(file, "utf8"));
  for (const doc of docs) {
    if (doc.errors.length) {
      console.error(`${file}: YAML: ${doc.errors.map((e) => e.message).join("; ")}`);
      bad++;
      continue;
    }
    const obj = doc.toJS();
    if (obj === null) continue;
    const where = `${file}: ${obj.kind ?? "?"} ${obj.metadata?.name ?? "?"}`;
    let Model;
    try {
      const mod = await import(`kubernetes-models/${obj.apiVersion}/${obj.kind}`);
      Model = mod[obj.kind];
    } catch (e) {
      console.error(`${where}: unknown apiVersion/kind ${obj.apiVersion}/${obj.kind}`);
      bad++;
      continue;
    }
    try {
      new Model(obj).validate();
      console.log(`${where}: valid ${obj.apiVersion} ${obj.kind}`);
      checked++;
    } catch (e) {
      console.error(`${where}: ${e.message}`);
      bad++;
    }
  }
}
console.log(`${checked} valid, ${bad} invalid`);
process.exit(bad ? 1 : 0);
