// A third-party client no one here wrote: npm's grpc-js-reflection-client
// over @grpc/grpc-js. Lists gradsyncd's services by reflection (v1 and
// v1alpha), fetches descriptors by symbol and by file, then calls
// Diagnostics and Health through stubs built ONLY from the reflected
// descriptors. Prints one JSON object; the test (test_node_client.py)
// checks it.
//
// usage: node node_client.js HOST:PORT TOKEN
// Run from a directory whose node_modules has both packages (the test
// copies it beside its npm cache).
"use strict";
const { GrpcReflection } = require("grpc-js-reflection-client");
const grpc = require("@grpc/grpc-js");

const [target, token] = process.argv.slice(2);
const creds = grpc.credentials.createInsecure();
const loadOpts = { keepCase: true, longs: String, enums: String, defaults: true };

// protobufjs, which grpc-js-reflection-client uses to turn the reflected
// FileDescriptorProtos into stubs, does not rebuild map fields from a
// descriptor's XxxEntry types: a map arrives as a list of {key, value}.
function asMap(v) {
  return Array.isArray(v) ? Object.fromEntries(v.map((e) => [e.key, e.value])) : v;
}

function unary(client, method, req, md) {
  return new Promise((resolve) =>
    client[method](req, md || new grpc.Metadata(), { deadline: Date.now() + 10000 }, (err, rep) =>
      resolve(err ? { code: grpc.status[err.code], details: err.details } : rep)));
}

(async () => {
  const out = {};
  for (const version of ["v1", "v1alpha"]) {
    const r = new GrpcReflection(target, creds, {}, version);
    out["services_" + version] = (await r.listServices()).sort();
  }
  const r = new GrpcReflection(target, creds, {}, "v1");
  out.diagnostics_methods = (await r.listMethods("gradsync.v1.Diagnostics")).map((m) => m.name);
  const byFile = await r.getDescriptorByFileName("gradsync/v1/diagnostics_messages.proto");
  out.pending_tensor_fields = Object.keys(
    byFile.getProtobufJsRoot().lookupType("gradsync.v1.PendingTensor").fields);
  try {
    await r.getDescriptorBySymbol("no.such.Symbol");
    out.unknown_symbol = "no error";
  } catch (e) {
    out.unknown_symbol = String(e.message || e);
  }

  const md = new grpc.Metadata();
  md.add("authorization", "Bearer " + token);
  const dpkg = (await r.getDescriptorBySymbol("gradsync.v1.Diagnostics")).getPackageObject(loadOpts);
  const diag = new dpkg.gradsync.v1.Diagnostics(target, creds);
  out.get_status = await unary(diag, "GetStatus", {}, md);
  out.settings_arrived_as = Array.isArray(out.get_status.settings) ? "list of {key, value}" : "map";
  if (out.get_status.settings) out.get_status.settings = asMap(out.get_status.settings);
  out.list_pending = await unary(diag, "ListPending", { missing_ranks: [1] }, md);
  out.get_status_no_token = await unary(diag, "GetStatus", {});

  const hpkg = (await r.getDescriptorBySymbol("grpc.health.v1.Health")).getPackageObject(loadOpts);
  const health = new hpkg.grpc.health.v1.Health(target, creds);
  out.health = await unary(health, "Check", { service: "" });
  out.health_diagnostics = await unary(health, "Check", { service: "gradsync.v1.Diagnostics" });
  out.health_unknown = await unary(health, "Check", { service: "no.such.Service" });
  diag.close();
  health.close();
  console.log(JSON.stringify(out, null, 1));
})().catch((e) => {
  console.error("node client failed:", e);
  process.exit(1);
});
