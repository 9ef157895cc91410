#!/usr/bin/python3
"""npm's @grpc/grpc-js + grpc-js-reflection-client against a live job: a
real gradsyncd with a token, two gs-test-worker ranks, rank 1 held before it
submits. node_client.js lists the services by reflection and calls
Diagnostics (GetStatus, ListPending) and Health with stubs built only from
the reflected descriptors; this script checks what it printed.

The two npm packages are installed once into $GRADSYNC_NPM_CACHE/grpc
(default /var/cache/gradsync/npm/grpc), outside the clone, so a CI run
installs them once. SKIP (77) only when node/npm are missing or npm cannot
reach its registry.

usage: test_node_client.py BIN_DIR    exit 0 pass, 1 fail, 77 skip
"""
import json, os, re, shutil, signal, subprocess, sys, tempfile, time

BIN = sys.argv[1]
HERE = os.path.dirname(os.path.abspath(__file__))
CACHE = os.path.join(os.environ.get("GRADSYNC_NPM_CACHE", "/var/cache/gradsync/npm"), "grpc")
PACKAGES = ["@grpc/grpc-js@1", "grpc-js-reflection-client@1"]
TOKEN = "node-test-token-%d" % os.getpid()
from opsutil import check, cleanup, finish, start


def npm_install():
    """Installs the packages into CACHE unless they are there. Returns None
    or the reason to skip."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return "%s is not installed (scripts/install-deps.sh installs Debian's)" % tool
    mods = os.path.join(CACHE, "node_modules")
    if all(os.path.isdir(os.path.join(mods, p.rsplit("@", 1)[0])) for p in PACKAGES):
        return None
    os.makedirs(CACHE, exist_ok=True)
    r = subprocess.run(["npm", "install", "--prefix", CACHE, "--no-audit", "--no-fund", *PACKAGES],
                       capture_output=True, text=True, timeout=300)
    if r.returncode == 0:
        return None
    print(r.stdout[-2000:], r.stderr[-2000:])
    # Only a registry that cannot be reached is a reason to skip; any other
    # npm failure is a failure.
    if re.search(r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ETIMEDOUT|ECONNRESET|ENETUNREACH|network",
                 r.stderr):
        return "npm cannot reach its registry"
    raise SystemExit("npm install failed (exit %d)" % r.returncode)


def worker(addr, rank, hold_ms):
    env = dict(os.environ, GRADSYNC_COORDINATOR=addr, GRADSYNC_RANK=str(rank), GRADSYNC_SIZE="2",
               GRADSYNC_JOB_TOKEN=TOKEN)
    return start([os.path.join(BIN, "gs-test-worker"), "hold", str(hold_ms)], env=env,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def node_client(addr, token):
    r = subprocess.run(["node", os.path.join(CACHE, "node_client.js"), addr, token],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        return None
    return json.loads(r.stdout)


LOG = tempfile.mktemp(prefix="gs-test-node-", suffix=".log")
try:
    why = npm_install()
    if why:
        print("SKIP:", why)
        sys.exit(77)
    # Node resolves packages from the script's directory upwards: run a copy
    # beside the cached node_modules.
    shutil.copy(os.path.join(HERE, "node_client.js"), os.path.join(CACHE, "node_client.js"))
    ver = subprocess.run(["node", "-e", "console.log(require('@grpc/grpc-js/package.json').version"
                          "+' '+require('grpc-js-reflection-client/package.json').version)"],
                         cwd=CACHE, capture_output=True, text=True).stdout.split()
    print("node %s, @grpc/grpc-js %s, grpc-js-reflection-client %s"
          % (subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip(),
             *ver))

    d = start([os.path.join(BIN, "gradsyncd"), "--world-size", "2", "--token", TOKEN],
              stdout=subprocess.PIPE, stderr=open(LOG, "w"), text=True)
    m = re.match(r"gradsyncd listening on \S+:(\d+)$", d.stdout.readline().strip())
    if not m:
        raise SystemExit("gradsyncd did not start; log: " + LOG)
    addr = "127.0.0.1:" + m.group(1)
    w0 = worker(addr, 0, 0)
    w1 = worker(addr, 1, 600000)  # held before it submits: killed below

    # Wait (through gradsyncctl) until rank 0's tensor is pending and rank 0
    # reported it waits on it (that report follows the submission).
    end = time.time() + 60
    while time.time() < end:
        r = subprocess.run([os.path.join(BIN, "gradsyncctl"), "--addr", addr, "--token", TOKEN,
                            "ranks"], capture_output=True, text=True, timeout=30)
        if re.search(r"^0\s+connected\s.*hold/tensor$", r.stdout, re.M):
            break
        time.sleep(0.2)
    check(re.search(r"^0\s+connected\s.*hold/tensor$", r.stdout, re.M) is not None,
          "rank 0 waits on its pending tensor (gradsyncctl ranks):\n" + r.stdout)

    out = node_client(addr, TOKEN)
    check(out is not None, "node client ran")
    if out is not None:
        print(json.dumps({k: v for k, v in out.items() if k != "get_status"}, indent=1))
        services = ["gradsync.v1.Coordinator", "gradsync.v1.Diagnostics", "grpc.health.v1.Health",
                    "grpc.reflection.v1.ServerReflection",
                    "grpc.reflection.v1alpha.ServerReflection"]
        check(out["services_v1"] == services, "reflection v1 lists every service: %s"
              % out["services_v1"])
        check(out["services_v1alpha"] == services, "reflection v1alpha lists every service")
        check(out["diagnostics_methods"] == ["GetStatus", "ListPending", "ListStalls",
                                             "ListLocalVars", "WatchEvents", "GetMetrics",
                                             "StartTimeline", "StopTimeline", "AbortJob"],
              "listMethods(gradsync.v1.Diagnostics): %s" % out["diagnostics_methods"])
        check(set(out["pending_tensor_fields"]) >= {"name", "op", "dtype", "shape",
                                                    "missingRanks", "submittedRanks"},
              "descriptor by file name: PendingTensor's fields")
        check("no.such.Symbol" in out["unknown_symbol"] or "not found" in out["unknown_symbol"],
              "unknown symbol -> an error, not a crash: " + out["unknown_symbol"])
        st = out["get_status"]
        check(st.get("world_size") == 2 and st.get("world_ready") is True
              and [x["state"] for x in st.get("ranks", [])] == ["connected", "connected"]
              and st["ranks"][0].get("blocked_on") == ["hold/tensor"]
              and st.get("settings", {}).get("job_token") == "(set)"
              and st.get("version", "").startswith("0."),
              "GetStatus via reflected stub: world, ranks, blocked-on, settings map, version")
        lp = out["list_pending"]
        t = (lp.get("tensors") or [{}])[0]
        check(len(lp.get("tensors", [])) == 1 and t.get("name") == "hold/tensor"
              and t.get("op") == "OP_ALLREDUCE" and t.get("shape") == ["64"]
              and t.get("submitted_ranks") == [0] and t.get("missing_ranks") == [1]
              and lp.get("total") == 1,
              "ListPending via reflected stub names the tensor and missing rank 1: %s" % lp)
        check(out["get_status_no_token"].get("code") == "UNAUTHENTICATED"
              and "job token" in out["get_status_no_token"].get("details", ""),
              "GetStatus without the token: UNAUTHENTICATED: %s" % out["get_status_no_token"])
        check(out["health"] == {"status": "SERVING"}, "Health/Check '': SERVING (no token)")
        check(out["health_diagnostics"] == {"status": "SERVING"},
              "Health/Check gradsync.v1.Diagnostics: SERVING")
        check(out["health_unknown"].get("code") == "NOT_FOUND",
              "Health/Check of an unknown service: NOT_FOUND: %s" % out["health_unknown"])
    d.send_signal(signal.SIGTERM)
    d.wait(timeout=60)
finally:
    cleanup()

finish(LOG)
