#!/usr/bin/python3
"""The operators' view end to end: a real gradsyncd, real worker processes
(gs-test-worker), gradsyncctl, and a third-party client (Debian's
python3-grpcio, stubs built only from reflected descriptors; see
grpc_client.py).

usage: test_ops.py BIN_DIR    exit 0 pass, 1 fail, 77 skip (no python3-grpcio)
"""
import json, os, re, signal, subprocess, sys, tempfile, time

BIN = os.path.abspath(sys.argv[1])
HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3"
TOKEN = "ops-test-token-%d" % os.getpid()
from opsutil import check, cleanup, finish, start


def gradsyncd(*extra):
    d = start([os.path.join(BIN, "gradsyncd"), "--world-size", "2", *extra],
              stdout=subprocess.PIPE, stderr=open(LOG, "a"), text=True)
    line = d.stdout.readline().strip()
    m = re.match(r"gradsyncd listening on (\S+):(\d+)$", line)
    if not m:
        raise SystemExit("gradsyncd did not start: %r" % line)
    return d, "127.0.0.1:" + m.group(2)


def worker(addr, rank, hold_ms):
    env = dict(os.environ, GRADSYNC_COORDINATOR=addr, GRADSYNC_RANK=str(rank), GRADSYNC_SIZE="2",
               GRADSYNC_JOB_TOKEN=TOKEN)
    return start([os.path.join(BIN, "gs-test-worker"), "hold", str(hold_ms)], env=env,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def client(addr, token, *args, timeout=60):
    r = subprocess.run([PY, os.path.join(HERE, "grpc_client.py"), addr, token, *args],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode == 77:
        print(r.stdout, r.stderr)
        cleanup()
        sys.exit(77)
    return r


def ctl(addr, *args, token=TOKEN, timeout=60):
    env = dict(os.environ, GRADSYNC_JOB_TOKEN=token)
    env.pop("GRADSYNC_COORDINATOR", None)
    return subprocess.run([os.path.join(BIN, "gradsyncctl"), "--addr", addr, *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


def wait_for(pred, what, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.2)
    check(False, "in time: " + what)
    return False


def parse_prometheus(text):
    """Checks the text exposition format line by line; returns {name: value}."""
    types, values = {}, {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            continue
        m = re.match(r"# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$", line)
        if m:
            types[m.group(1)] = m.group(2)
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"(,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*")*\})? ([-+0-9.eE]+|NaN|[+-]Inf)$', line)
        if not m:
            raise ValueError("not Prometheus text: %r" % line)
        if m.group(1) not in types:
            raise ValueError("sample without # TYPE: %r" % line)
        if types[m.group(1)] == "counter" and not m.group(1).endswith("_total"):
            raise ValueError("counter not named *_total: %s" % m.group(1))
        values[m.group(1)] = float(m.group(4))
    return values


LOG = tempfile.mktemp(prefix="gs-test-ops-", suffix=".log")
try:
    if subprocess.run([PY, "-c", "import grpc, google.protobuf"]).returncode != 0:
        print("SKIP: Debian python3-grpcio / python3-protobuf not installed")
        sys.exit(77)

    # ---- a job whose rank 1 has not submitted (it sleeps before its op) ----
    # A long grace: the drain after SIGTERM (below) outlasts the probes.
    d, addr = gradsyncd("--token", TOKEN, "--stall-warning-s", "1", "--shutdown-grace-s", "120")
    w0 = worker(addr, 0, 0)
    w1 = worker(addr, 1, 600000)  # stopped before submitting: killed below

    def pending_named():
        r = client(addr, TOKEN, "call", "ListPending", "{}")
        return r.returncode == 0 and "hold/tensor" in r.stdout

    wait_for(pending_named, "rank 0's tensor pending")
    watch = start([PY, os.path.join(HERE, "grpc_client.py"), addr, TOKEN, "watch", "50", "EVENT_STALL"],
                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                  env=dict(os.environ, WATCH_TIMEOUT="60"))

    r = client(addr, "", "reflect")
    check(r.returncode == 0, "reflection answers without a token: " + r.stderr[-300:])
    refl = json.loads(r.stdout)
    services = ["gradsync.v1.Coordinator", "gradsync.v1.Diagnostics", "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"]
    check(refl["services_v1"] == services, "v1 lists every service: %s" % refl["services_v1"])
    check(refl["services_v1alpha"] == services, "v1alpha lists every service")
    check(refl["by_symbol_diagnostics"] == ["gradsync/v1/diagnostics.proto",
                                           "gradsync/v1/diagnostics_messages.proto",
                                           "gradsync/v1/messages.proto"],
          "file by symbol with dependencies: %s" % refl["by_symbol_diagnostics"])
    check(refl["by_file_coordinator"] == ["gradsync/v1/coordinator.proto", "gradsync/v1/messages.proto"],
          "file by name: %s" % refl["by_file_coordinator"])
    check(refl["unknown_symbol"] == [5, "symbol not found: no.such.Symbol"],
          "unknown symbol -> NOT_FOUND error response: %s" % refl["unknown_symbol"])
    check(refl["unknown_file"][0] == 5, "unknown file -> NOT_FOUND error response")
    check(refl["diagnostics_methods"] == ["GetStatus", "ListPending", "ListStalls", "ListLocalVars",
                                          "WatchEvents", "GetMetrics", "StartTimeline",
                                          "StopTimeline", "AbortJob"], "Diagnostics methods reflected")
    check(refl["settings_entry"] == "SettingsEntry" and refl["settings_is_map"],
          "map field reflected as a standard SettingsEntry map entry")

    r = client(addr, TOKEN, "call", "ListPending", "{}")
    lp = json.loads(r.stdout)
    t = lp["tensors"][0]
    check(len(lp["tensors"]) == 1 and t["name"] == "hold/tensor" and t["missing_ranks"] == [1]
          and t["submitted_ranks"] == [0] and t["op"] == "OP_ALLREDUCE" and t["shape"] == ["64"],
          "ListPending (reflected stubs) names the tensor and the missing rank: %s" % t)
    r = client(addr, TOKEN, "call", "ListPending", '{"missing_ranks":[0]}')
    check(r.returncode == 0 and json.loads(r.stdout)["tensors"] == [],
          "ListPending filtered by a rank that is not missing: nothing")
    r = client(addr, TOKEN, "call", "ListPending", '{"name_prefix":"hold/"}')
    check(json.loads(r.stdout)["total"] == 1, "ListPending filtered by name prefix")
    r = client(addr, TOKEN, "call", "ListPending", '{"page_token":"bogus"}')
    check(r.returncode == 3 and "INVALID_ARGUMENT" in r.stdout, "a bad page token is refused")
    # rank 0 reports what it is blocked on after it has submitted: wait for it
    def blocked_reported():
        r = client(addr, TOKEN, "call", "GetStatus", "{}")
        return r.returncode == 0 and json.loads(r.stdout)["ranks"][0].get("blocked_on")

    wait_for(blocked_reported, "rank 0's blocked-on report")
    r = client(addr, TOKEN, "call", "GetStatus", "{}")
    st = json.loads(r.stdout)
    check(st["world_size"] == 2 and st["version"] and st["world_ready"]
          and [x["state"] for x in st["ranks"]] == ["connected", "connected"]
          and st["ranks"][0]["blocked_on"] == ["hold/tensor"] and st["settings"]["job_token"] == "(set)",
          "GetStatus (reflected stubs): world, version, ranks, blocked-on, settings")

    r = ctl(addr, "pending")
    check(r.returncode == 0 and re.search(r"^hold/tensor\s+allreduce\s+int32\s+\[64\]\s+\S+\s+\[0\]\s+\[1\]",
                                          r.stdout, re.M) is not None,
          "gradsyncctl pending names the tensor and missing rank 1:\n" + r.stdout)
    r = ctl(addr, "pending", "--json", "--rank", "1")
    check(r.returncode == 0 and json.loads(r.stdout)[0]["missing_ranks"] == [1],
          "gradsyncctl pending --json --rank 1")
    r = ctl(addr, "--json", "stalls")

    def stalled():
        s = json.loads(ctl(addr, "--json", "stalls").stdout)
        # the report comes from the stall check, a tick after the entry
        # became old enough to be listed as stalled
        return s["stalled"] and s["waits"] and "Missing ranks:" in s["last_stall_report"]

    wait_for(stalled, "ListStalls shows the stall")
    s = json.loads(ctl(addr, "--json", "stalls").stdout)
    check(s["waits"] == [{"rank": 0, "waits_on": [{"name": "hold/tensor", "pending": True,
                                                    "missing_ranks": [1]}]}],
          "stalls: rank 0 waits on hold/tensor, missing from rank 1: %s" % s["waits"])
    check("Missing ranks:" in s["last_stall_report"] and "hold/tensor" in s["last_stall_report"],
          "stalls: the latest stall report")

    r = ctl(addr, "metrics")
    try:
        m = parse_prometheus(r.stdout)
        check(m["gradsync_pending_tensors"] == 1 and m["gradsync_live_ranks"] == 2
              and "gradsync_stalls_total" in m and "gradsync_ranks_lost_total" in m
              and "gradsync_cache_misses_total" in m and "gradsync_bytes_total" in m,
              "GetMetrics parses as Prometheus text with the gauges and counters")
    except ValueError as e:
        check(False, "GetMetrics parses as Prometheus text: %s" % e)

    # token rules: Diagnostics needs the token, Health and reflection do not
    r = client(addr, "", "call", "GetStatus", "{}")
    check(r.returncode == 3 and "UNAUTHENTICATED" in r.stdout, "GetStatus without the token refused")
    r = client(addr, "wrong", "call", "ListPending", "{}")
    check("UNAUTHENTICATED" in r.stdout, "ListPending with a wrong token refused")
    r = client(addr, "", "call", "AbortJob", '{"reason":"x"}')
    check("UNAUTHENTICATED" in r.stdout, "AbortJob without the token refused")
    r = ctl(addr, "status", token="")
    check(r.returncode == 1 and "refused" in r.stderr, "gradsyncctl status without token: exit 1")
    r = client(addr, "", "health", "")
    check(r.stdout.strip() == "SERVING", "Health/Check without a token: SERVING")
    r = client(addr, "", "health", "no.such.Service")
    check(r.stdout.strip() == "NOT_FOUND", "Health/Check of an unknown service: NOT_FOUND")
    r = ctl(addr, "health", "gradsync.v1.Diagnostics", token="")
    check(r.returncode == 0 and r.stdout.strip() == "SERVING", "gradsyncctl health: exit 0")
    r = ctl(addr, "health", "nope")
    check(r.returncode == 3 and r.stdout.strip() == "NOT_FOUND", "gradsyncctl health nope: exit 3")

    # the event stream delivered the stall
    out, _ = watch.communicate(timeout=60)
    events = [e for e in (json.loads(l) for l in out.splitlines() if l.strip()) if "kind" in e]
    kinds = [e["kind"] for e in events]
    stall = [e for e in events if e["kind"] == "EVENT_STALL"]
    check("EVENT_WORLD_READY" in kinds and stall and "hold/tensor" in stall[0]["message"]
          and "\n1 (" in stall[0]["message"],
          "WatchEvents delivered world-ready and the stall naming rank 1: %s" % kinds[:8])

    # SIGTERM: gradsyncd drains with its port open. Health/Watch sees
    # NOT_SERVING on its open stream; Health/Check probes (python3-grpcio,
    # gradsyncctl) get NOT_SERVING rather than a refused connection; Join and
    # Session are refused as shutting down; a second SIGTERM ends the drain.
    hw = start([PY, os.path.join(HERE, "grpc_client.py"), addr, "", "health-watch", ""],
               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = hw.stdout.readline()  # the watch is up: it got the current status
    d.send_signal(signal.SIGTERM)
    second = hw.stdout.readline()
    check([first.strip(), second.strip()] == ["SERVING", "NOT_SERVING"],
          "Health/Watch: SERVING, then NOT_SERVING on SIGTERM: %r" % [first, second])
    out0, _ = w0.communicate(timeout=60)
    check(w0.returncode != 0 and "it was shut down while the job ran" in out0,
          "the waiting rank is told the coordinator was shut down: " + out0[-300:])
    for name in ("", "gradsync.v1.Coordinator", "gradsync.v1.Diagnostics", "grpc.health.v1.Health"):
        r = client(addr, "", "health", name)
        check(r.stdout.strip() == "NOT_SERVING",
              "during the drain Health/Check %r: NOT_SERVING: %r" % (name, r.stdout + r.stderr[-200:]))
    r = client(addr, "", "health", "no.such.Service")
    check(r.stdout.strip() == "NOT_FOUND", "during the drain an unknown service: NOT_FOUND")
    # GetStatus: the coordinator drains and the ranks' sessions are ended
    # (not "connected" as the engine last saw them)
    r = client(addr, TOKEN, "call", "GetStatus", "{}")
    st = json.loads(r.stdout) if r.returncode == 0 else {}
    check(st.get("coordinator_state") == "draining"
          and [x["state"] for x in st.get("ranks", [])] == ["closed", "closed"],
          "during the drain GetStatus: coordinator draining, ranks closed: %r"
          % [st.get("coordinator_state"), [x["state"] for x in st.get("ranks", [])], r.stderr[-200:]])
    r = ctl(addr, "status")
    check(r.returncode == 0 and "DRAINING (SIGTERM/SIGINT: sessions ended, ranks refused)" in r.stdout,
          "during the drain gradsyncctl status says DRAINING:\n" + r.stdout)
    r = ctl(addr, "ranks")
    check(r.returncode == 0 and re.search(r"^0\s+closed\s", r.stdout, re.M)
          and re.search(r"^1\s+closed\s", r.stdout, re.M),
          "during the drain gradsyncctl ranks: both closed:\n" + r.stdout)
    r = ctl(addr, "health", token="")
    check(r.returncode == 3 and r.stdout.strip() == "NOT_SERVING",
          "during the drain gradsyncctl health: NOT_SERVING, exit 3: %r" % [r.returncode, r.stdout])
    import grpc
    sys.path.insert(0, os.path.join(HERE, "..", "integration"))
    import rawproto
    pb = rawproto.load_messages(os.path.join(HERE, "..", ".."))
    ch = grpc.insecure_channel(addr)
    auth = (("authorization", "Bearer " + TOKEN),)
    refusal = "gradsyncd is shutting down (SIGTERM/SIGINT) and takes no new ranks"
    try:
        ch.unary_unary("/gradsync.v1.Coordinator/Join",
                       request_serializer=pb.JoinRequest.SerializeToString,
                       response_deserializer=pb.JoinResponse.FromString)(
            pb.JoinRequest(rank=0, size=2, local_rank=0, local_size=2, host="late", pid=1,
                           version="0.1.0"), metadata=auth, timeout=10)
        check(False, "during the drain Join is refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAVAILABLE and refusal in e.details(),
              "during the drain Join: UNAVAILABLE %r" % e.details())
    try:
        list(ch.stream_stream("/gradsync.v1.Coordinator/Session",
                              request_serializer=pb.RankMessage.SerializeToString,
                              response_deserializer=pb.PlanMessage.FromString)(
            iter([pb.RankMessage(hello=pb.SessionHello(rank=0, epoch=1, secret=b"x"))]),
            metadata=auth, timeout=10))
        check(False, "during the drain Session is refused")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.UNAVAILABLE and refusal in e.details(),
              "during the drain Session: UNAVAILABLE %r" % e.details())
    kv_refusal = ("gradsyncd is shutting down (SIGTERM/SIGINT) and takes no rendezvous writes; "
                  "'%s' was not %s: the job it served has ended")
    for method, req, resp, verb in (
            ("KvSet", pb.KvSetRequest(key="drain/key", value=b"v"), pb.KvSetResponse, "stored"),
            ("KvDelete", pb.KvDeleteRequest(key="drain/key"), pb.KvDeleteResponse, "deleted")):
        try:
            ch.unary_unary("/gradsync.v1.Coordinator/" + method,
                           request_serializer=type(req).SerializeToString,
                           response_deserializer=resp.FromString)(req, metadata=auth, timeout=10)
            check(False, "during the drain %s is refused" % method)
        except grpc.RpcError as e:
            check(e.code() == grpc.StatusCode.UNAVAILABLE
                  and kv_refusal % ("drain/key", verb) in e.details(),
                  "during the drain %s: UNAVAILABLE %r" % (method, e.details()))
    ch.close()
    check(d.poll() is None, "gradsyncd still drains (--shutdown-grace-s 120)")
    d.send_signal(signal.SIGTERM)  # the second: closes now
    d.wait(timeout=60)
    check(d.returncode == 0, "after a second SIGTERM gradsyncd exits 0: %r" % d.returncode)
    out, _ = hw.communicate(timeout=60)
    check(out.split() == ["UNAVAILABLE"],
          "Health/Watch ends (UNAVAILABLE) when the listener closes: %r" % out)
    log = open(LOG).read()
    check("draining for 118.0 s: health NOT_SERVING" in log and "received SIGTERM again: closing now" in log,
          "gradsyncd logged the drain and its early end")
    w1.kill()
    w1.wait(timeout=60)
    r = ctl(addr, "health", token="")
    check(r.returncode == 1 and "unreachable" in r.stderr, "gradsyncctl against a stopped gradsyncd: exit 1")

    # ---- --diagnostics-open: reads without the token, AbortJob still needs it ----
    tl1 = tempfile.mktemp(prefix="gs-test-ops-", suffix=".json")
    d, addr = gradsyncd("--token", TOKEN, "--diagnostics-open", "--timeline", tl1)
    w0 = worker(addr, 0, 0)
    w1 = worker(addr, 1, 600000)
    wait_for(lambda: "hold/tensor" in ctl(addr, "pending", token="").stdout, "open pending")
    r = ctl(addr, "timeline", "stop", token="")
    check(r.returncode == 1 and "refused" in r.stderr, "timeline stop without the token refused")
    r = ctl(addr, "--json", "timeline", "stop")
    check(r.returncode == 0 and json.loads(r.stdout)["path"] == tl1, "timeline stop: " + r.stdout)
    try:
        ev = json.load(open(tl1))
        hold = [e["pid"] for e in ev if e.get("name") == "process_name"
                and e["args"]["name"] == "hold/tensor"]
        phases = [e["ph"] for e in ev if hold and e["pid"] == hold[0] and e["ph"] in "BE"]
        check(hold and phases == ["B", "E"]
              and any(e.get("name") == "rank 0 submitted" for e in ev),
              "a timeline stopped mid-step is valid JSON, its open span closed: %s" % phases)
    except ValueError as e:
        check(False, "the timeline stopped mid-step parses as JSON: %s" % e)
    os.unlink(tl1)
    r = ctl(addr, "timeline", "stop")
    check(r.returncode == 1 and "no timeline is running" in r.stderr,
          "timeline stop with none running: " + r.stderr)
    r = ctl(addr, "status", token="")
    check(r.returncode == 0 and "2 connected" in r.stdout, "--diagnostics-open: status without token")
    fp = re.search(r"^fast path: +(\d+) (rounds?), (\d+) (tensors?), (\d+) (collectives?) ",
                   r.stdout, re.M)
    check(fp and all((fp.group(i) == "1") == (not fp.group(i + 1).endswith("s"))
                     for i in (1, 3, 5)),
          "status's fast path line: singular for 1, plural otherwise:\n" + r.stdout)
    r = ctl(addr, "abort", "no token", token="")
    check(r.returncode == 1 and "refused" in r.stderr, "--diagnostics-open: abort without token refused")
    r = ctl(addr, "abort", "operator test abort")
    check(r.returncode == 0, "abort with the token: exit 0")
    out0, _ = w0.communicate(timeout=60)
    check(w0.returncode != 0 and "operator test abort" in out0,
          "the waiting rank gets the operator's reason: " + out0[-300:])
    # One job per coordinator: gradsyncd exits 3 (the job failed) once the
    # aborted job's sessions closed, or --shutdown-grace-s after the abort
    # for a rank that does not look (rank 1 sleeps before its op).
    d.wait(timeout=60)
    w1.kill()
    w1.wait(timeout=60)
    check(d.returncode == 3, "gradsyncd exits 3 after the operator's abort: %r" % d.returncode)

    # ---- /metrics over HTTP, JSON log lines ----
    import urllib.request, urllib.error
    open(LOG, "w").close()
    d, addr = gradsyncd("--metrics-listen", "127.0.0.1:0", "--log-format", "json")
    second = d.stdout.readline().strip()
    m = re.match(r"gradsyncd metrics on (http://127\.0\.0\.1:\d+/metrics)$", second)
    check(m is not None, "second stdout line names the metrics URL: %r" % second)
    body = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
    try:
        vals = parse_prometheus(body)
        check(vals["gradsync_world_size"] == 2 and vals["gradsync_live_ranks"] == 0
              and vals["gradsync_pending_tensors"] == 0 and vals["gradsync_plans_total"] == 0,
              "GET /metrics parses as Prometheus text")
    except ValueError as e:
        check(False, "GET /metrics parses as Prometheus text: %s" % e)
    try:
        urllib.request.urlopen(m.group(1).replace("/metrics", "/other"), timeout=10)
        check(False, "GET /other is refused")
    except urllib.error.HTTPError as e:
        check(e.code == 404, "GET /other: 404")
    d.send_signal(signal.SIGTERM)
    d.wait(timeout=60)
    lines = open(LOG).read().splitlines()
    try:
        objs = [json.loads(l) for l in lines]
        check(all(set(o) == {"time", "level", "prog", "msg"} for o in objs)
              and any(o["msg"].startswith("settings: ") for o in objs)
              and not any(o["level"] == "error" for o in objs),
              "--log-format json: one JSON object per line, settings logged, no error on SIGTERM")
    except ValueError as e:
        check(False, "--log-format json lines parse: %s %r" % (e, lines[:3]))

    # ---- the timeline of a 3-step demo job: HOROVOD_TIMELINE, and
    # horovodrun's --timeline-filename on gradsync-run (a relative path: the
    # launcher's directory) ----
    def demo_timeline(how, tl, extra_args=(), env_extra=None, cwd=None):
        r = subprocess.run([os.path.join(BIN, "gradsync-run"), "-np", "2", *extra_args,
                            os.path.join(BIN, "gradsync-train"), "--steps", "3"],
                           env=dict(os.environ, **(env_extra or {})), capture_output=True,
                           text=True, timeout=120, cwd=cwd)
        check(r.returncode == 0, how + ": the 3-step demo runs: " + r.stderr[-500:])
        try:
            ev = json.load(open(tl))
            rows = {e["args"]["name"]: e["pid"] for e in ev if e.get("name") == "process_name"}
            layers = ["fc1/weight", "fc1/bias", "fc2/weight", "fc2/bias", "fc3/weight", "fc3/bias"]
            ok = all(n in rows for n in layers)
            for n in layers:
                mine = [e for e in ev if n in rows and e["pid"] == rows[n]]
                spans = [e["name"] for e in mine if e["ph"] == "B"]
                subs = [e["name"] for e in mine if e["ph"] == "i" and e["name"].endswith("submitted")]
                ok = ok and spans.count("NEGOTIATE_ALLREDUCE") == 3 and spans.count("ALLREDUCE") == 3
                ok = ok and subs.count("rank 0 submitted") == 3 and subs.count("rank 1 submitted") == 3
                ok = ok and sum(e["ph"] == "B" for e in mine) == sum(e["ph"] == "E" for e in mine)
            check(ok, how + ": the demo's timeline parses and has, for every layer, 3 negotiations, "
                  "3 allreduces and every rank's submissions (%d events)" % len(ev))
            os.unlink(tl)
        except (ValueError, OSError) as e:
            check(False, how + ": the demo's timeline parses as JSON: %s" % e)

    tl = tempfile.mktemp(prefix="gs-test-ops-", suffix=".json")
    demo_timeline("HOROVOD_TIMELINE", tl, env_extra={"HOROVOD_TIMELINE": tl})
    tldir = tempfile.mkdtemp(prefix="gs-test-ops-")
    demo_timeline("--timeline-filename", os.path.join(tldir, "tl.json"),
                  ["--timeline-filename", "tl.json"], cwd=tldir)
    os.rmdir(tldir)
    r = subprocess.run([os.path.join(BIN, "gradsync-run"), "-np", "1", "--timeline-filename=",
                        "true"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "--timeline-filename needs a value (FILE)" in r.stderr,
          "--timeline-filename without a file: exit 2: " + r.stderr[:300])
    r = subprocess.run([os.path.join(BIN, "gradsync-run"), "-np", "1", "--cycle-time-ms", "-1",
                        "true"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "--cycle-time-ms (gradsyncd's --cycle-time-ms): " in r.stderr,
          "--cycle-time-ms -1 refused by the settings table: " + r.stderr[:300])
    r = subprocess.run([os.path.join(BIN, "gradsync-run"), "-np", "1", "--fusion-threshold-mb",
                        "lots", "true"], capture_output=True, text=True, timeout=60)
    check(r.returncode == 2 and "--fusion-threshold-mb needs a non-negative number (MB), got "
          "'lots'" in r.stderr, "--fusion-threshold-mb lots: " + r.stderr[:300])

    # ---- gradsyncctl usage errors ----
    r = ctl("127.0.0.1:1", "bogus")
    check(r.returncode == 2, "unknown command: exit 2")
    r = ctl("127.0.0.1:1", "abort")
    check(r.returncode == 2, "abort without a reason: exit 2")
    r = ctl("127.0.0.1:1", "pending", "--page-size", "0")
    check(r.returncode == 2, "bad --page-size: exit 2")
    r = subprocess.run([os.path.join(BIN, "gradsyncctl"), "--version"], capture_output=True, text=True)
    check(r.returncode == 0 and r.stdout.startswith("gradsyncctl "), "gradsyncctl --version")
    for prog in ("gradsyncd", "gradsync-run", "gradsync-train", "gradsync-bench"):
        r = subprocess.run([os.path.join(BIN, prog), "--version"], capture_output=True, text=True)
        check(r.returncode == 0 and r.stdout.startswith(prog + " 0."), prog + " --version: " + r.stdout)
finally:
    cleanup()

finish(LOG)
