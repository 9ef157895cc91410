#!/usr/bin/env python3
"""Security tests of gradsyncd and the worker library (issue 8), with real
processes on 127.0.0.1 and Debian's python3-grpcio as a client nobody here
wrote (generic calls on raw bytes: the protobuf messages are encoded by hand
below, so malformed ones are easy to make).

(The rogue ring connection is tested in tests/unit/test_ring.c, where a
rank can be held back deterministically while the rogue connects.)

Each test reproduces an attack or a careless mistake and checks what users
rely on: the error (status and text), that the coordinator keeps serving the
others, and that the job's results are unchanged (gs-test-worker's "ops"
mode checks every value against a locally computed reference).

Usage: test_security.py BIN_DIR [TEST ...]. Exit 0 = all passed, 1 = a
failure, 77 = skipped (python3-grpcio missing). Every process it starts is
killed at the end; every wait has a bound.
"""
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

try:
    import grpc
except ImportError:
    print("SKIP: python3-grpcio is not installed (apt-get install python3-grpcio)")
    sys.exit(77)

from rawproto import sanitized, vm_hwm_kib  # noqa: E402
import testprocs  # noqa: E402
from testprocs import issue_cert, make_ca, output  # noqa: E402

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/bin")
TMP = tempfile.mkdtemp(prefix="gs-sec-test-")
PROCS = []
SVC = "/gradsync.v1.Coordinator/"

# ---- protobuf by hand -------------------------------------------------------


def varint(n):
    out = b""
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def f_varint(field, n):
    return varint(field << 3) + varint(n)


def f_bytes(field, data):
    if isinstance(data, str):
        data = data.encode()
    return varint(field << 3 | 2) + varint(len(data)) + data


def join_request(rank, size, host="rogue", pid=4242):
    return (f_varint(2, rank) + f_varint(3, size) + f_bytes(6, host) + f_varint(7, pid) +
            f_bytes(8, "0.1.0"))


def parse(buf):
    """Top-level fields of a message: {field: [values]} (bytes or ints)."""
    out, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(buf, i)
        elif wt == 2:
            n, i = read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(field, []).append(v)
    return out


def read_varint(buf, i):
    n, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def hello(rank, secret=b"", epoch=1):
    # No fast_path (SessionHello field 4): these sessions run no fast rounds,
    # so gradsyncd never sends them the fast path's marker.
    inner = f_varint(1, rank) + f_varint(2, epoch)
    if secret:
        inner += f_bytes(3, secret)
    return f_bytes(1, inner)


def kv_set(key, value):
    return f_bytes(1, key) + f_bytes(2, value)


def kv_get(key, wait_ms=0):
    return f_bytes(1, key) + (f_varint(2, wait_ms) if wait_ms else b"")


# ---- processes --------------------------------------------------------------


def spawn(label, argv, env_extra=None):
    return testprocs.spawn(PROCS, TMP, label, argv, env_extra)


def kill_all():
    for p in PROCS:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
    PROCS.clear()


def start_gradsyncd(args, env_extra=None, expect_ok=True):
    p = spawn("gradsyncd", [os.path.join(BIN, "gradsyncd")] + args, env_extra)
    deadline = time.time() + 20
    while time.time() < deadline:
        text = output(p)
        for line in text.splitlines():
            if line.startswith("gradsyncd listening on "):
                return p, line.split()[-1]
        if p.poll() is not None:
            break
        time.sleep(0.05)
    if expect_ok:
        raise AssertionError("gradsyncd did not start:\n" + output(p))
    return p, None


def start_rank(addr, rank, size, mode_args, env_extra=None):
    env = {"GRADSYNC_COORDINATOR": addr, "GRADSYNC_RANK": str(rank), "GRADSYNC_SIZE": str(size),
           "GRADSYNC_LOCAL_RANK": str(rank), "GRADSYNC_LOCAL_SIZE": str(size),
           "GRADSYNC_JOIN_TIMEOUT_MS": "30000"}
    env.update(env_extra or {})
    return spawn("rank %d" % rank, [os.path.join(BIN, "gs-test-worker")] + mode_args, env)


def wait_exit(p, timeout=120):
    try:
        return p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError("%s did not exit within %d s:\n%s" % (p.label, timeout, output(p)))


def expect(cond, what, *procs):
    if not cond:
        raise AssertionError(what + "".join("\n--- %s:\n%s" % (p.label, output(p)) for p in procs))


def expect_ops_passed(ranks):
    for p in ranks:
        code = wait_exit(p)
        text = output(p)
        expect(code == 0 and "checks passed" in text, "%s: exit %s, no 'checks passed'" %
               (p.label, code), *ranks)


# ---- gRPC helpers ------------------------------------------------------------


class SilentCalls:
    """PER Health/Check calls on each of CONNS connections to ADDR that
    never send their request (each holds a read slot of open calls, or
    waits for one, until gradsyncd ends it or close()); futs: their
    futures, in connection order."""

    def __init__(self, addr, conns, per):
        self.hold = threading.Event()

        def never():
            self.hold.wait(120)
            return
            yield

        self.chans = [grpc.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
                      for _ in range(conns)]
        self.futs = [ch.stream_unary("/grpc.health.v1.Health/Check").future(never(), timeout=120)
                     for ch in self.chans for _ in range(per)]

    def close(self):
        for f in self.futs:
            f.cancel()
        self.hold.set()
        for ch in self.chans:
            ch.close()


def channel(addr, creds=None):
    opts = [("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 64 << 20)]
    if creds:
        return grpc.secure_channel(addr, creds, options=opts)
    return grpc.insecure_channel(addr, options=opts)


def md(token=None, rank=None, secret=None):
    m = []
    if token is not None:
        m.append(("authorization", "Bearer " + token))
    if rank is not None:
        m.append(("gradsync-rank", str(rank)))
        m.append(("gradsync-rank-secret", secret.hex()))
    return m


def unary(ch, method, req, metadata=(), timeout=10):
    """(code, details, reply bytes or None)."""
    fn = ch.unary_unary(SVC + method)
    try:
        return grpc.StatusCode.OK, "", fn(req, metadata=metadata, timeout=timeout)
    except grpc.RpcError as e:
        return e.code(), e.details() or "", None


def session(ch, msgs, metadata=(), timeout=10, keep_open=0.0):
    """Sends msgs on a Session stream; (code, details, replies received)."""
    fn = ch.stream_stream(SVC + "Session")

    def gen():
        for m in msgs:
            yield m
        if keep_open:
            time.sleep(keep_open)

    replies = []
    try:
        for r in fn(gen(), metadata=metadata, timeout=timeout):
            replies.append(r)
        return grpc.StatusCode.OK, "", replies
    except grpc.RpcError as e:
        return e.code(), e.details() or "", replies


# ---- tests -------------------------------------------------------------------


def test_token_required_everywhere():
    """Wrong and missing token: UNAUTHENTICATED on every method, and gs_init
    fails with GS_ERR_UNAUTHENTICATED; the right token runs the job."""
    token = secrets.token_hex(32)
    tf = os.path.join(TMP, "token")
    with open(tf, "w") as f:
        f.write(token + "\n")
    os.chmod(tf, 0o600)
    d, addr = start_gradsyncd(["--world-size", "2", "--token-file", tf])
    ch = channel(addr)
    for name, meta in (("missing", ()), ("wrong", md("x" + token[1:])),
                       ("prefix", md(token[:-1])), ("longer", md(token + "0"))):
        for method, req in (("Join", join_request(0, 2)), ("KvSet", kv_set("a", "b")),
                            ("KvGet", kv_get("a")), ("KvDelete", f_bytes(1, "a"))):
            code, det, _ = unary(ch, method, req, meta)
            expect(code == grpc.StatusCode.UNAUTHENTICATED,
                   "%s token on %s: got %s %s" % (name, method, code, det), d)
            expect(token not in det, "the token appears in an error", d)
        code, det, _ = session(ch, [hello(0)], meta)
        expect(code == grpc.StatusCode.UNAUTHENTICATED, "%s token on Session: %s" % (name, code))
    bad = start_rank(addr, 0, 2, ["ops"], {"GRADSYNC_JOB_TOKEN": "not-the-token"})
    none = start_rank(addr, 1, 2, ["ops"])
    for p in (bad, none):
        code = wait_exit(p, 60)
        text = output(p)
        expect(code != 0 and "GS_ERR_UNAUTHENTICATED" in text and "job token" in text,
               "%s: expected GS_ERR_UNAUTHENTICATED" % p.label, p)
    expect(token not in output(d), "gradsyncd logged the token", d)
    ranks = [start_rank(addr, r, 2, ["ops"], {"GRADSYNC_JOB_TOKEN": token}) for r in range(2)]
    expect_ops_passed(ranks)
    expect(token not in output(d), "gradsyncd logged the token", d)


def test_gradsync_run_token():
    """gradsync-run gives every job a fresh token, in the environment only."""
    seen = []
    for _ in range(2):
        p = spawn("gradsync-run", [os.path.join(BIN, "gradsync-run"), "-np", "2", "/bin/sh", "-c",
                                   'echo "token=$GRADSYNC_JOB_TOKEN"'])
        expect(wait_exit(p, 60) == 0, "gradsync-run failed", p)
        toks = set(l.split("token=", 1)[1] for l in output(p).splitlines()
                   if l.startswith(("[0] token=", "[1] token=")))
        expect(len(toks) == 1 and len(next(iter(toks))) == 64,
               "ranks did not get one 64-digit token: %s" % toks, p)
        seen.append(toks.pop())
    expect(seen[0] != seen[1], "two jobs got the same token")
    # the demo job runs authenticated end to end
    p = spawn("gradsync-run demo", [os.path.join(BIN, "gradsync-run"), "-np", "2",
                                    os.path.join(BIN, "gs-test-worker"), "ops"])
    expect(wait_exit(p, 120) == 0 and output(p).count("checks passed") == 2,
           "gradsync-run job failed", p)
    expect("job token required" in output(p), "its gradsyncd did not require a token", p)


def test_listen_refusals():
    """Off loopback without token or TLS: refused, naming --token-file and
    --insecure; --insecure starts; port 70000 is an error; a second
    coordinator on the same port fails instead of sharing it."""
    d, addr = start_gradsyncd(["--listen", "0.0.0.0:0"], expect_ok=False)
    code = wait_exit(d, 20)
    text = output(d)
    expect(code == 2 and "--token-file" in text and "--insecure" in text,
           "gradsyncd served 0.0.0.0 without a token (exit %s)" % code, d)
    d, addr = start_gradsyncd(["--listen", "0.0.0.0:0", "--insecure"])
    d.send_signal(signal.SIGTERM)
    expect(wait_exit(d, 20) == 0, "gradsyncd --insecure did not stop cleanly", d)
    d, _ = start_gradsyncd(["--listen", "127.0.0.1:70000"], expect_ok=False)
    code = wait_exit(d, 20)
    expect(code == 2 and "70000" in output(d), "port 70000 was not refused (exit %s)" % code, d)
    d1, addr = start_gradsyncd([])
    port = addr.rsplit(":", 1)[1]
    d2, _ = start_gradsyncd(["--listen", "127.0.0.1:" + port], expect_ok=False)
    code = wait_exit(d2, 20)
    expect(code != 0 and "cannot listen" in output(d2),
           "a second gradsyncd shared port %s (exit %s)" % (port, code), d2)


def test_malformed_bytes_every_method():
    """Malformed bytes on every method: INVALID_ARGUMENT (or an error), and
    the coordinator keeps serving."""
    token = secrets.token_hex(16)
    d, addr = start_gradsyncd(["--world-size", "2"], {"GRADSYNC_JOB_TOKEN": token})
    ch = channel(addr)
    garbage = [b"\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x05abc", os.urandom(300),
               b"\x08" + b"\xff" * 10]
    for method in ("Join", "KvSet", "KvGet", "KvDelete"):
        for g in garbage:
            code, det, _ = unary(ch, method, g, md(token))
            expect(code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED,
                            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.OK),
                   "%s on %r: %s %s" % (method, g[:8], code, det), d)
    for g in garbage:
        code, det, _ = session(ch, [g], md(token))
        expect(code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                        grpc.StatusCode.PERMISSION_DENIED),
               "Session on %r: %s %s" % (g[:8], code, det), d)
    code, det, _ = unary(ch, "Join", b"\xff", md(token))
    expect(code == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in det.lower(),
           "malformed Join: %s %s" % (code, det))
    # a host name that would forge a log line is refused at join
    code, det, _ = unary(ch, "Join", join_request(0, 2, host="h\n2026 gradsyncd ERROR x"),
                         md(token))
    expect(code == grpc.StatusCode.INVALID_ARGUMENT and "host" in det,
           "host with a newline: %s %s" % (code, det))
    expect(d.poll() is None, "gradsyncd died", d)
    ranks = [start_rank(addr, r, 2, ["ops"], {"GRADSYNC_JOB_TOKEN": token}) for r in range(2)]
    expect_ops_passed(ranks)
    expect("\n2026 gradsyncd ERROR x" not in output(d), "a forged log line got through", d)


def test_identity_and_kv_ownership():
    """Session hello without the rank's secret is refused and the real rank
    is unaffected; kv writes need an identity and a rank's key only its own;
    a joined rank without a session is released."""
    token = secrets.token_hex(16)
    d, addr = start_gradsyncd(["--world-size", "2", "--join-timeout-ms", "2000"],
                              {"GRADSYNC_JOB_TOKEN": token})
    ch = channel(addr)
    secrets_of = {}
    for r in range(2):
        code, det, rep = unary(ch, "Join", join_request(r, 2), md(token))
        expect(code == grpc.StatusCode.OK, "join rank %d: %s %s" % (r, code, det), d)
        f = parse(rep)
        expect(len(f.get(6, [b""])[0]) == 32 and len(f.get(7, [b""])[0]) == 32,
               "JoinResponse lacks rank_secret / ring_key")
        secrets_of[r] = f[6][0]
    key0, key1 = "epoch/1/ring/addr/0", "epoch/1/ring/addr/1"
    code, det, _ = unary(ch, "KvSet", kv_set(key0, "6.6.6.6:666"), md(token))
    expect(code == grpc.StatusCode.PERMISSION_DENIED and "identity" in det,
           "kv write without identity: %s %s" % (code, det))
    code, det, _ = unary(ch, "KvSet", kv_set(key0, "6.6.6.6:666"),
                         md(token, 1, secrets_of[1]))
    expect(code == grpc.StatusCode.PERMISSION_DENIED and "belongs to rank 0" in det,
           "rank 1 wrote rank 0's key: %s %s" % (code, det))
    code, det, _ = unary(ch, "KvSet", kv_set(key0, "6.6.6.6:666"),
                         md(token, 0, secrets_of[1]))
    expect(code == grpc.StatusCode.PERMISSION_DENIED, "rank 0 with rank 1's secret wrote")
    code, det, _ = unary(ch, "KvSet", kv_set(key1, "127.0.0.1:1"), md(token, 1, secrets_of[1]))
    expect(code == grpc.StatusCode.OK, "rank 1 could not write its own key: %s %s" % (code, det))
    code, det, _ = unary(ch, "KvDelete", f_bytes(1, key1), md(token, 0, secrets_of[0]))
    expect(code == grpc.StatusCode.PERMISSION_DENIED, "rank 0 deleted rank 1's key")
    code, _, rep = unary(ch, "KvGet", kv_get(key0), md(token))
    expect(code == grpc.StatusCode.OK and 2 not in parse(rep or b""), "rank 0's key was written")
    # hijack: a hello for rank 0 with rank 1's secret or none
    for sec in (secrets_of[1], b"", os.urandom(32)):
        code, det, _ = session(ch, [hello(0, sec)], md(token))
        expect(code == grpc.StatusCode.PERMISSION_DENIED and "secret" in det,
               "hello for rank 0 without its secret: %s %s" % (code, det))
    # rank 1 opened no session: released after --join-timeout-ms, then a
    # real process can take the slot (and the old secret is void)
    time.sleep(3.5)
    code, det, _ = unary(ch, "KvSet", kv_set(key1, "127.0.0.1:2"), md(token, 1, secrets_of[1]))
    expect(code == grpc.StatusCode.PERMISSION_DENIED, "a released rank's secret still works")
    expect("was released" in output(d), "no release in the log", d)
    code, det, _ = unary(ch, "Join", join_request(1, 2), md(token))
    expect(code == grpc.StatusCode.OK, "rank 1's slot was not released: %s %s" % (code, det), d)


def test_session_hijack_during_job():
    """During a running job, hellos for its ranks from another process are
    refused and the job's results are unchanged."""
    token = secrets.token_hex(16)
    d, addr = start_gradsyncd(["--world-size", "2"], {"GRADSYNC_JOB_TOKEN": token})
    release = os.path.join(TMP, "release-hijack")
    env = {"GRADSYNC_JOB_TOKEN": token, "GS_TEST_WAIT_FILE": release}
    ranks = [start_rank(addr, r, 2, ["ops"], env) for r in range(2)]
    deadline = time.time() + 60
    while time.time() < deadline and not all("waiting for" in output(p) for p in ranks):
        time.sleep(0.1)
    ch = channel(addr)
    for r in range(2):
        code, det, _ = session(ch, [hello(r, os.urandom(32))], md(token))
        expect(code == grpc.StatusCode.PERMISSION_DENIED, "hijack of rank %d: %s %s" %
               (r, code, det), d)
        code, det, _ = unary(ch, "KvSet", kv_set("epoch/1/ring/addr/%d" % r, "6.6.6.6:1"),
                             md(token))
        expect(code == grpc.StatusCode.PERMISSION_DENIED, "kv overwrite of rank %d" % r)
    open(release, "w").close()
    expect_ops_passed(ranks)


def test_kv_limits_and_waiters():
    """--kv-max-bytes / --kv-max-keys: the offender gets RESOURCE_EXHAUSTED
    naming the limit, others are served; abandoned KvGets are freed."""
    token = secrets.token_hex(16)
    d, addr = start_gradsyncd(["--world-size", "2", "--kv-max-bytes", "4096", "--kv-max-keys",
                               "16"], {"GRADSYNC_JOB_TOKEN": token})
    ch = channel(addr)
    code, det, rep = unary(ch, "Join", join_request(0, 2), md(token))
    sec0 = parse(rep)[6][0]
    who = md(token, 0, sec0)
    code, det, _ = unary(ch, "KvSet", kv_set("big", b"x" * 5000), who)
    expect(code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--kv-max-bytes" in det,
           "oversized value: %s %s" % (code, det))
    for i in range(16):
        code, det, _ = unary(ch, "KvSet", kv_set("k%d" % i, "v"), who)
        expect(code == grpc.StatusCode.OK, "key %d: %s %s" % (i, code, det))
    code, det, _ = unary(ch, "KvSet", kv_set("k16", "v"), who)
    expect(code == grpc.StatusCode.RESOURCE_EXHAUSTED and "--kv-max-keys" in det,
           "17th key: %s %s" % (code, det))
    code, det, _ = unary(ch, "KvSet", kv_set("k3", "replaced"), who)
    expect(code == grpc.StatusCode.OK, "replacing a key under the key limit failed")
    # waiters that give up: 200 KvGets abandoned after 0.2 s each
    threads = []
    for i in range(200):
        t = threading.Thread(target=unary, args=(ch, "KvGet", kv_get("never%d" % i, 600000),
                                                   md(token), 0.2))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    code, _, rep = unary(ch, "KvGet", kv_get("k3"), md(token))
    expect(code == grpc.StatusCode.OK and parse(rep)[2][0] == b"replaced", "kv read failed")
    expect(d.poll() is None, "gradsyncd died", d)


def test_kv_waiter_cap():
    """4096 KvGets may wait for keys at once: the 4097th is refused at once
    with RESOURCE_EXHAUSTED naming the limit and what to do; the 4096 keep
    waiting and all get the value once it is set; reads without a wait and
    writes are served meanwhile."""
    token = secrets.token_hex(16)
    d, addr = start_gradsyncd(["--world-size", "2"], {"GRADSYNC_JOB_TOKEN": token})
    ch = channel(addr)
    code, det, rep = unary(ch, "Join", join_request(0, 2), md(token))
    expect(code == grpc.StatusCode.OK, "join: %s %s" % (code, det))
    who = md(token, 0, parse(rep)[6][0])
    # from 16 connections: one may have 256 calls open (--max-streams-per-connection)
    chans = [grpc.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
             for _ in range(16)]
    waiting = [c.unary_unary(SVC + "KvGet").future(kv_get("later", 120000), metadata=md(token),
                                                   timeout=150)
               for c in chans for _ in range(256)]
    # The 4096 reach gradsyncd in their own time: probe (each probe waits
    # 50 ms, so it is a waiter too) until the cap refuses one. The probes
    # go on their own connection, so one may overtake the last of the 4096
    # and hold a slot while they arrive: then those are the calls refused,
    # and as many of the 4096 wait as the slots the probe left them.
    deadline, refused = time.time() + 60, None
    while time.time() < deadline and refused is None:
        overtaken = [f for f in waiting if f.done()]
        if overtaken:
            for f in overtaken:
                expect(f.code() == grpc.StatusCode.RESOURCE_EXHAUSTED,
                       "a waiting KvGet ended early: %s %s" % (f.code(), f.details()), d)
            refused = overtaken[0].details()
            waiting = [f for f in waiting if not f.done()]
            expect(len(waiting) >= 4095, "only %d KvGets wait" % len(waiting), d)
            break
        code, det, _ = unary(ch, "KvGet", kv_get("probe", 50), md(token))
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            refused = det
            break
        expect(code == grpc.StatusCode.OK, "probe: %s %s" % (code, det), d)
        time.sleep(0.1)
    expect(refused is not None, "no KvGet refused with 4096 waiting", d)
    expect("too many KvGet calls are waiting for keys (limit 4096)" in refused
           and "try again" in refused, "the refusal names the limit: %r" % refused)
    expect(not any(f.done() for f in waiting), "a waiting KvGet ended early")
    code, det, _ = unary(ch, "KvSet", kv_set("other", "x"), who)
    expect(code == grpc.StatusCode.OK, "KvSet at the cap: %s %s" % (code, det))
    code, det, rep = unary(ch, "KvGet", kv_get("other"), md(token))
    expect(code == grpc.StatusCode.OK and parse(rep)[2][0] == b"x",
           "KvGet without a wait at the cap: %s %s" % (code, det))
    code, det, _ = unary(ch, "KvSet", kv_set("later", "value"), who)
    expect(code == grpc.StatusCode.OK, "KvSet of the awaited key: %s %s" % (code, det))
    got = [parse(f.result(timeout=60)).get(2, [b""])[0] for f in waiting]
    expect(got == [b"value"] * len(waiting),
           "%d of %d waiters got the value" % (got.count(b"value"), len(waiting)))
    # the slots are free again
    code, det, rep = unary(ch, "KvGet", kv_get("soon", 50), md(token))
    expect(code == grpc.StatusCode.OK, "KvGet after the waiters were answered: %s %s" % (code, det))
    expect(d.poll() is None, "gradsyncd died", d)


def flood(addr, meta, size, streams, rounds):
    ch = channel(addr)
    msg = f_bytes(2, b"\x0a" + varint(size) + b"n" * size)  # one huge TensorRequest
    codes = []

    def one():
        for _ in range(rounds):
            code, det, _ = session(ch, [msg], meta, timeout=60)
            codes.append((code, det))

    ts = [threading.Thread(target=one) for _ in range(streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ch.close()
    return codes


def test_first_message_flood():
    """16 MB first Session messages (with and without the token) are refused
    by their length; the coordinator's peak RSS stays bounded by the
    messages in flight at once, not the flood's length, and the job after it
    runs correctly."""
    token = secrets.token_hex(16)
    d, addr = start_gradsyncd(["--world-size", "2"], {"GRADSYNC_JOB_TOKEN": token})
    time.sleep(0.5)
    base = vm_hwm_kib(d.pid)
    codes = flood(addr, md(token), 16 << 20, 4, 5)
    after_auth = vm_hwm_kib(d.pid)
    expect(all(c == grpc.StatusCode.RESOURCE_EXHAUSTED for c, _ in codes),
           "authenticated 16 MB first messages: %s" % set(str(c) for c, _ in codes), d)
    expect(any("exceeds the limit of 65536 bytes" in det for _, det in codes),
           "no limit named: %s" % codes[:1])
    codes = flood(addr, (), 16 << 20, 4, 5)
    after_unauth = vm_hwm_kib(d.pid)
    expect(all(c == grpc.StatusCode.UNAUTHENTICATED for c, _ in codes),
           "unauthenticated flood: %s" % set(str(c) for c, _ in codes), d)
    print("flood: gradsyncd VmHWM %d KiB before, %d KiB after 20 authenticated 16 MB first "
          "messages (4 streams at once), %d KiB after 20 unauthenticated ones" %
          (base, after_auth, after_unauth))
    if sanitized(d.pid):
        print("flood: AddressSanitizer build, RSS bound not checked")
    else:
        # gRPC receives a whole message before the coordinator can judge its
        # length: the 4 in flight at once, each up to twice while reassembled
        # (measured peaks 63-152 MB over base), is what may be resident; the
        # 20 messages kept would be 320 MB more.
        bound = base + 2 * 4 * 16 * 1024 + 32 * 1024
        expect(after_unauth < bound, "peak RSS %d KiB >= %d KiB (base %d KiB + 2 x 4 in-flight "
               "16 MB messages + 32 MiB)" % (after_unauth, bound, base), d)
    ranks = [start_rank(addr, r, 2, ["ops"], {"GRADSYNC_JOB_TOKEN": token}) for r in range(2)]
    expect_ops_passed(ranks)


def yielded(path, reads=1):
    """A read of an open call cut off because another connection waited."""
    return ("the request of this %s call did not arrive within 250 ms while calls of other "
            "connections waited; gradsyncd reads only %d requests of open calls (health checks, "
            "reflection) at once and cut this one off; send the request with the call and try "
            "again" % (path, reads))


def flood_calls(addr, method, msg, conns, per_conn, meta=(), timeout=60):
    """per_conn calls of method with msg at once on each of conns separate
    connections (a subchannel pool per channel); returns [(code, details)]."""
    chans = [grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", -1),
                                                  ("grpc.use_local_subchannel_pool", 1)])
             for _ in range(conns)]
    futs = [ch.unary_unary(method).future(msg, metadata=meta, timeout=timeout)
            for ch in chans for _ in range(per_conn)]
    codes = []
    for f in futs:
        try:
            f.result()
            codes.append((grpc.StatusCode.OK, ""))
        except grpc.RpcError as e:
            codes.append((e.code(), e.details() or ""))
    for ch in chans:
        ch.close()
    return codes


def test_unauthenticated_flood():
    """What a peer without the token can make gradsyncd hold. 16 MiB
    messages on 8 connections x 8 calls at once to every token method (gRPC
    read them before the token check until the fix: +250 MB) are refused
    unread; oversized requests to the open Health/Check are refused by its
    64 KiB limit; headers over 16 KiB are refused; peak RSS stays bounded and
    a job that runs meanwhile passes its value checks. A second gradsyncd with
    a small --grpc-memory-max-bytes (128 MiB), whose gRPC cancelled a rank's
    Session under a larger flood before open requests were read one at a
    time, runs a job through 2 GiB of Health/Check calls, logs at most 5
    refusal warnings a second and counts the rest, and cuts off calls that
    never send their request; beyond 256 waiting, calls are refused unread."""
    token = secrets.token_hex(16)
    # --serve-forever: one job during the floods, one after them
    d, addr = start_gradsyncd(["--world-size", "2", "--serve-forever"],
                              {"GRADSYNC_JOB_TOKEN": token})
    ranks = [start_rank(addr, r, 2, ["ops"], {"GRADSYNC_JOB_TOKEN": token}) for r in range(2)]
    time.sleep(0.5)
    base = vm_hwm_kib(d.pid)
    big = b"\x0a" + varint(16 << 20) + b"k" * (16 << 20)
    for method in ("Join", "KvSet", "KvGet", "KvDelete"):
        codes = flood_calls(addr, SVC + method, big, 8, 8)
        expect(all(c == grpc.StatusCode.UNAUTHENTICATED and "missing or wrong job token" in det
                   for c, det in codes), "unauthenticated 16 MiB %s: %s" %
               (method, set((str(c), det[:80]) for c, det in codes)), d)
    for method in ("GetStatus", "ListPending", "AbortJob"):
        codes = flood_calls(addr, "/gradsync.v1.Diagnostics/" + method, big, 2, 4)
        expect(all(c == grpc.StatusCode.UNAUTHENTICATED for c, _ in codes),
               "unauthenticated 16 MiB %s: %s" % (method, set(str(c) for c, _ in codes)), d)
    after_token = vm_hwm_kib(d.pid)
    # generous: measured +20 MB (+250 MB before the token was checked first)
    expect(sanitized(d.pid) or after_token < base + 96 * 1024, "peak RSS after the "
           "token-method floods %d KiB >= base %d KiB + 96 MiB" % (after_token, base), d)
    codes = flood_calls(addr, "/grpc.health.v1.Health/Check", big, 8, 8)
    limit = ("the request of a /grpc.health.v1.Health/Check call (%d bytes) exceeds the limit of "
             "65536 bytes; refused without reading it" % len(big))
    # (or, a read slower than 250 ms while other connections wait, as one
    # of 16 MiB can be on a loaded machine, cut off as slow)
    slow = yielded("/grpc.health.v1.Health/Check", 2)
    expect(all((c, det) in ((grpc.StatusCode.RESOURCE_EXHAUSTED, limit),
                            (grpc.StatusCode.DEADLINE_EXCEEDED, slow)) for c, det in codes)
           and any(det == limit for _, det in codes),
           "16 MiB Health/Check: %s" % set((str(c), det[:100]) for c, det in codes), d)
    n_slow = sum(det == slow for _, det in codes)
    after_open = vm_hwm_kib(d.pid)
    # headers past 16 KiB: gRPC refuses the call (and may drop that
    # connection: a channel of its own)
    ch = channel(addr)
    code, det, _ = unary(ch, "KvGet", kv_get("a"), md(token) + [("x-pad", "p" * (64 << 10))])
    expect(code != grpc.StatusCode.OK, "64 KiB of headers accepted", d)
    hdr = "%s %s" % (code, det)
    ch.close()
    ch = channel(addr)
    code, det, _ = unary(ch, "KvGet", kv_get("a"), md(token))
    expect(code == grpc.StatusCode.OK, "KvGet after the floods: %s %s" % (code, det), d)
    ch.close()
    print("unauthenticated flood: gradsyncd VmHWM %d KiB before, %d KiB after 16 MiB messages "
          "to the token methods (%d calls), %d KiB after 64 to Health/Check (%d cut off as slow); 64 "
          "KiB of headers: %s" % (base, after_token, 4 * 64 + 3 * 8, after_open, n_slow, hdr),
          flush=True)
    expect_ops_passed(ranks)
    ranks = [start_rank(addr, r, 2, ["ops"], {"GRADSYNC_JOB_TOKEN": token}) for r in range(2)]
    expect_ops_passed(ranks)
    expect(d.poll() is None, "gradsyncd died", d)
    # A small quota (128 MiB: a Health/Check flood of this size cancelled
    # rank 0's Session before open requests were read a few at a time) with
    # a job running during 64 x 32 MiB at Health/Check: each refused by its
    # length, none by gRPC, and the job passes its value checks. (A read
    # slower than 250 ms while other connections wait, as a 32 MiB one can
    # be on a loaded machine or under ASan, is cut off instead.)
    san = sanitized(d.pid)
    kill_all()  # (its log file is the next one's)
    quota = 128 << 20
    q, qaddr = start_gradsyncd(["--world-size", "2", "--serve-forever",
                                "--grpc-memory-max-bytes", str(quota)],
                               {"GRADSYNC_JOB_TOKEN": token})
    time.sleep(0.5)
    qbase = vm_hwm_kib(q.pid)
    huge = b"\x0a" + varint(32 << 20) + b"k" * (32 << 20)
    got = []
    t0 = time.time()
    fl = threading.Thread(target=lambda: got.extend(
        flood_calls(qaddr, "/grpc.health.v1.Health/Check", huge, 8, 8, timeout=120)))
    fl.start()
    time.sleep(0.5)
    ranks = [start_rank(qaddr, r, 2, ["ops"], {"GRADSYNC_JOB_TOKEN": token}) for r in range(2)]
    expect_ops_passed(ranks)
    fl.join()
    took = time.time() - t0
    limit = ("the request of a /grpc.health.v1.Health/Check call (%d bytes) exceeds the limit of "
             "65536 bytes; refused without reading it" % len(huge))
    slow = yielded("/grpc.health.v1.Health/Check")
    expect(len(got) == 64 and all((c, det) in ((grpc.StatusCode.RESOURCE_EXHAUSTED, limit),
                                               (grpc.StatusCode.DEADLINE_EXCEEDED, slow))
                                  for c, det in got)
           and any(det == limit for _, det in got),
           "32 MiB Health/Check under a quota: %s" % set((str(c), det[:100]) for c, det in got), q)
    qpeak = vm_hwm_kib(q.pid)
    # one warning per refused request, at most 5 a second, the rest counted
    time.sleep(1.5)  # the window that counts the last suppressed ones ends
    log = output(q).splitlines()
    shown = sum(1 for line in log if (limit in line or slow in line) and "(from " in line)
    suppressed = sum(int(line.split("suppressed ")[1].split()[0]) for line in log
                     if "similar warnings about refused requests" in line)
    expect(shown >= 5 and shown + suppressed == 64,
           "warnings: %d shown + %d suppressed (64 refusals)" % (shown, suppressed), q)
    expect(shown <= 5 * (int(took) + 3), "%d refusal warnings in %.1f s (at most 5 a second)" %
           (shown, took), q)
    print("quota: gradsyncd --grpc-memory-max-bytes %d: VmHWM %d KiB before, %d KiB after 64 "
          "32 MiB messages to Health/Check in %.1f s while a job ran (%d cut off as slow); %d "
          "warnings logged, %d suppressed" % (quota, qbase, qpeak, took,
                                              sum(det == slow for _, det in got), shown, suppressed),
          flush=True)
    # Calls that never send their request hold the read slot (one under
    # this quota) for at most 2 s each; 256 more wait, the rest are refused
    # unread; a health probe behind them is answered once they are gone.
    silent = SilentCalls(qaddr, 3, 90)
    futs = silent.futs
    refused = ("gradsyncd reads at most 1 requests of open calls (health checks) at once and "
               "queues 256 more; this /grpc.health.v1.Health/Check call was refused unread; "
               "try again")
    cut = ("the request of this /grpc.health.v1.Health/Check call did not arrive within 2000 ms; "
           "gradsyncd reads only 1 requests of open calls (health checks) at once and cut "
           "this one off")
    deadline = time.time() + 60
    while time.time() < deadline and sum(f.done() for f in futs) < 270 - 256:
        time.sleep(0.1)
    done = [f for f in futs if f.done()]
    outcomes = set((f.exception().code(), f.exception().details()) for f in done)
    ok = {(grpc.StatusCode.RESOURCE_EXHAUSTED, refused), (grpc.StatusCode.DEADLINE_EXCEEDED, cut),
          (grpc.StatusCode.DEADLINE_EXCEEDED, yielded("/grpc.health.v1.Health/Check"))}
    expect(len(done) >= 270 - 256 and outcomes <= ok
           and (grpc.StatusCode.RESOURCE_EXHAUSTED, refused) in outcomes,
           "calls that never send: %d ended: %s" % (len(done), outcomes), q)
    n_refused = sum(1 for f in done if f.exception().code() == grpc.StatusCode.RESOURCE_EXHAUSTED)
    silent.close()
    ch = channel(qaddr)
    r = ch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=30)
    expect(parse(r).get(1) == [1], "Health/Check after the calls that never send: %r" % r, q)
    ch.close()
    expect(q.poll() is None, "gradsyncd died", q)
    print("open read slots: of 270 calls that never send, %d refused unread, %d cut off; a "
          "probe after them: SERVING" % (n_refused, len(done) - n_refused), flush=True)
    if san:
        print("unauthenticated flood: AddressSanitizer build, RSS bounds not checked")
        return
    # generous: measured about +150 MB after Health/Check (1 GiB sent) and
    # +70 MB under the 64 MiB quota (2 GiB sent; 4.8 GB resident for 64 x 60
    # MiB without quota and limits before the fix)
    expect(after_open < base + 512 * 1024, "peak RSS after the Health/Check flood %d KiB >= "
           "base %d KiB + 512 MiB (the default quota)" % (after_open, base), d)
    expect(qpeak < qbase + quota // 1024 + 128 * 1024, "peak RSS under the quota %d KiB >= base "
           "%d KiB + the quota + 128 MiB" % (qpeak, qbase), q)


REFL = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"


def reflection_streams(addr, msgs, conns, per_conn, timeout=120):
    """per_conn reflection streams at once on each of conns connections, each
    sending msgs; returns [(code, details, replies)]."""
    chans = [grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", -1),
                                                  ("grpc.use_local_subchannel_pool", 1)])
             for _ in range(conns)]
    got = []

    def one(ch):
        replies = []
        try:
            for r in ch.stream_stream(REFL)(iter(msgs), timeout=timeout):
                replies.append(r)
            got.append((grpc.StatusCode.OK, "", replies))
        except grpc.RpcError as e:
            got.append((e.code(), e.details() or "", replies))

    ts = [threading.Thread(target=one, args=(ch,)) for ch in chans for _ in range(per_conn)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for ch in chans:
        ch.close()
    return got


def test_open_streams_flood():
    """The open-call read cap covers every message of a reflection stream,
    and waiting calls are served round-robin by connection. Under a 128 MiB
    --grpc-memory-max-bytes (one open message read at a time): 64 reflection
    streams each asking list_services and then sending a 32 MiB message (2
    GiB in all; before, gRPC read them as they came and only the quota
    bounded them) each get their answer and then the limit's refusal, while
    a 2-rank job passes its value checks and gradsyncd's peak RSS stays
    bounded. Then one connection floods Health/Check with 300 calls that
    never send their request: health probes on their own connections are all
    answered SERVING (before, they waited behind the flooder's FIFO, or were
    refused when it was full) and the flooder's excess is refused with the
    queue's text: at most 257 of its calls are held, and the other 43 were
    refused or took the place of a call cut off after 2 s while the 300
    were still arriving (a client starved of CPU sends them over seconds)."""
    token = secrets.token_hex(16)
    quota = 128 << 20
    d, addr = start_gradsyncd(["--world-size", "2", "--serve-forever",
                               "--grpc-memory-max-bytes", str(quota),
                               "--max-streams-per-connection", "512"],
                              {"GRADSYNC_JOB_TOKEN": token})
    time.sleep(0.5)
    base = vm_hwm_kib(d.pid)
    ask = f_bytes(7, b"")  # ServerReflectionRequest.list_services
    size = 32 << 20
    huge = f_bytes(1, b"h" * size)  # .host, 32 MiB
    got = []
    t0 = time.time()
    fl = threading.Thread(target=lambda: got.extend(
        reflection_streams(addr, [ask, huge], 8, 8)))
    fl.start()
    time.sleep(0.5)
    ranks = [start_rank(addr, r, 2, ["ops"], {"GRADSYNC_JOB_TOKEN": token}) for r in range(2)]
    expect_ops_passed(ranks)
    fl.join(timeout=180)
    expect(not fl.is_alive(), "reflection flood still running after 180 s", d)
    took = time.time() - t0
    peak = vm_hwm_kib(d.pid)
    limit = ("a message of a %s call (%d bytes) exceeds the limit of 65536 bytes; refused "
             "without reading it" % (REFL, len(huge)))
    # (or, a 32 MiB read slower than 2 s while other calls wait, as on a
    # loaded machine, cut off as slow)
    slow = ("the next message of this %s stream did not arrive within 2000 ms while other open "
            "calls waited; gradsyncd reads only 1 messages of open calls (health checks, "
            "reflection) at once and cut this one off; open a new stream to ask again" % REFL)
    # (or, on a loaded machine, a stream whose first message, list_services,
    # the client had not sent 2 s after the stream got the read slot: cut
    # before it asked, so with no answer)
    unasked = ("the request of this %s call did not arrive within 2000 ms; gradsyncd reads only "
               "1 requests of open calls (health checks) at once and cut this one off" % REFL)
    n_slow = sum(det == slow for _, det, _ in got)
    n_unasked = sum(det == unasked and not r for _, det, r in got)
    answers = [parse(r[0]).get(6) is not None if len(r) == 1 else False for _, _, r in got]
    expect(len(got) == 64 and all((c, det) in ((grpc.StatusCode.RESOURCE_EXHAUSTED, limit),
                                               (grpc.StatusCode.DEADLINE_EXCEEDED, slow),
                                               (grpc.StatusCode.DEADLINE_EXCEEDED, unasked))
                                  for c, det, _ in got)
           and any(det == limit for _, det, _ in got)
           and all(a or det == unasked for a, (_, det, _) in zip(answers, got))
           and any(answers),
           "64 reflection streams (list_services, then 32 MiB): %s; %d of them answered" %
           (set((str(c), det[:120], len(r)) for c, det, r in got), sum(answers)), d)
    expect(d.poll() is None, "gradsyncd died", d)
    print("reflection flood: gradsyncd --grpc-memory-max-bytes %d: VmHWM %d KiB before, %d KiB "
          "after 64 reflection streams of 32 MiB in %.1f s while a job ran (%d cut off as slow, %d "
          "before they asked)" % (quota, base, peak, took, n_slow, n_unasked), flush=True)
    if not sanitized(d.pid):
        # generous: the read slot's message (twice while reassembled), the
        # waiting streams' windows and the job; 2 GiB were sent
        expect(peak < base + 192 * 1024, "peak RSS %d KiB >= base %d KiB + 192 MiB after the "
               "reflection flood" % (peak, base), d)
    # One connection floods Health/Check with calls that never send; probes
    # come on connections of their own, one after another, like kubelet's.
    silent = SilentCalls(addr, 1, 300)
    futs = silent.futs
    refused = ("gradsyncd reads at most 1 requests of open calls (health checks) at once and "
               "queues 256 more; this /grpc.health.v1.Health/Check call was refused unread; "
               "try again")
    cut = ("the request of this /grpc.health.v1.Health/Check call did not arrive within 2000 ms; "
           "gradsyncd reads only 1 requests of open calls (health checks) at once and cut "
           "this one off")
    deadline = time.time() + 60
    while time.time() < deadline and sum(f.done() for f in futs) < 300 - 257:
        time.sleep(0.1)
    waits = []
    for i in range(5):
        pch = grpc.insecure_channel(addr, options=[("grpc.use_local_subchannel_pool", 1)])
        t1 = time.time()
        try:
            r = pch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=30)
            res = parse(r).get(1)
        except grpc.RpcError as e:
            res = (e.code(), e.details())
        waits.append(time.time() - t1)
        pch.close()
        expect(res == [1], "probe %d during the flood of one connection: %r" % (i, res), d)
    done = [f for f in futs if f.done()]
    outcomes = [(f.exception().code(), f.exception().details()) for f in done]
    n_refused = outcomes.count((grpc.StatusCode.RESOURCE_EXHAUSTED, refused))
    n_cut = outcomes.count((grpc.StatusCode.DEADLINE_EXCEEDED, cut))
    n_yielded = outcomes.count((grpc.StatusCode.DEADLINE_EXCEEDED,
                                yielded("/grpc.health.v1.Health/Check")))
    # gradsyncd holds at most 257 of them (1 read, 256 queued): the other 43
    # were refused, or got in because a read was cut off after 2 s while
    # the 300 were still arriving (the client starved of CPU: each 2 s of
    # arrival lets one more in and refuses one fewer; no other connection
    # waits then, so none was cut with the yield text)
    expect(set(outcomes) <= {(grpc.StatusCode.RESOURCE_EXHAUSTED, refused),
                             (grpc.StatusCode.DEADLINE_EXCEEDED, cut),
                             (grpc.StatusCode.DEADLINE_EXCEEDED,
                              yielded("/grpc.health.v1.Health/Check"))}
           and len(done) >= 300 - 257 and n_refused >= 1 and n_refused + n_cut >= 300 - 257
           and n_yielded >= 1,
           "the flooder's 300 calls: %d ended, %d refused, %d cut off after 2 s, %d to let the "
           "probes in: %s" % (len(done), n_refused, n_cut, n_yielded, set(outcomes)), d)
    silent.close()
    expect(d.poll() is None, "gradsyncd died", d)
    print("fair open reads: 5 probes on their own connections during a 300-call flood from one: "
          "all SERVING, waits %s s; of the flooder's calls %d refused unread, %d cut off (%d to let "
          "the probes in)" % (" ".join("%.2f" % w for w in waits), n_refused,
                              len(done) - n_refused, n_yielded), flush=True)


class SourceProxy:
    """Connections to its 127.0.0.1 port forwarded to ADDR from the source
    address SRC (loopback holds the whole of 127/8), so that gradsyncd sees
    them coming from SRC, another host to it."""

    def __init__(self, addr, src):
        host, port = addr.rsplit(":", 1)
        self.target, self.src, self.socks = (host, int(port)), src, []
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(16)
        self.addr = "127.0.0.1:%d" % self.ls.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
                u = socket.socket()
                u.bind((self.src, 0))
                u.settimeout(10)
                u.connect(self.target)
                u.settimeout(None)
            except OSError:
                return
            self.socks += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a, b):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                b.sendall(data)
            b.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self):
        try:
            self.ls.shutdown(socket.SHUT_RDWR)  # wakes accept()
        except OSError:
            pass
        self.ls.close()
        for s in self.socks:
            s.close()


def test_open_calls_fair_per_host():
    """Open-call fairness is per peer host, not per connection: with one
    open read at a time (--grpc-memory-max-bytes 128 MiB), one address
    (127.0.0.1) floods Health/Check with 288 calls that never send, on 32
    connections of 9 calls (one is read, 256 wait, the rest are refused,
    about 31); probes from another address (127.0.0.2, through a forwarding
    proxy) are answered SERVING after at most one read of the flooding host
    (the call being read, cut off to let the probe in): of the flooder's
    calls, at most 4 are cut off while a probe waits (that one, and reads
    ending on their own meanwhile), not one of each of its 32 connections
    (before: 31 to 33). The flooder's calls end only with the cap's texts."""
    token = secrets.token_hex(16)
    d, addr = start_gradsyncd(["--world-size", "2", "--serve-forever",
                               "--grpc-memory-max-bytes", str(128 << 20)],
                              {"GRADSYNC_JOB_TOKEN": token})
    silent = SilentCalls(addr, 32, 9)
    futs = silent.futs
    # the flood is under way once the queue was full and the first of its
    # reads was cut off
    deadline = time.time() + 60
    while time.time() < deadline and sum(f.done() for f in futs) < 2:
        time.sleep(0.05)
    expect(sum(f.done() for f in futs) >= 2, "none of the flood's calls ended in 60 s", d)
    proxy = SourceProxy(addr, "127.0.0.2")
    ended = []

    def n_cut():  # the flooder's reads cut off (refusals are the queue's, not reads)
        return sum(f.done() and f.exception().code() == grpc.StatusCode.DEADLINE_EXCEEDED
                   for f in futs)

    for i in range(3):
        pch = grpc.insecure_channel(proxy.addr, options=[("grpc.use_local_subchannel_pool", 1)])
        before = n_cut()
        try:
            r = pch.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=60)
            res = parse(r).get(1)
        except grpc.RpcError as e:
            res = (e.code(), e.details())
        ended.append(n_cut() - before)
        pch.close()
        expect(res == [1], "probe %d from 127.0.0.2 during the flood from 127.0.0.1: %r" %
               (i, res), d)
    expect(all(n <= 4 for n in ended), "the flooding host's calls cut off while each probe "
           "from another host waited: %s (at most 4: one read of that host, not one of each of "
           "its 32 connections)" % ended, d)
    cut = ("the request of this /grpc.health.v1.Health/Check call did not arrive within 2000 ms; "
           "gradsyncd reads only 1 requests of open calls (health checks) at once and cut "
           "this one off")
    refused = ("gradsyncd reads at most 1 requests of open calls (health checks) at once and "
               "queues 256 more; this /grpc.health.v1.Health/Check call was refused unread; "
               "try again")
    outcomes = [(f.exception().code(), f.exception().details()) for f in futs if f.done()]
    n_refused = outcomes.count((grpc.StatusCode.RESOURCE_EXHAUSTED, refused))
    expect(set(outcomes) <= {(grpc.StatusCode.RESOURCE_EXHAUSTED, refused),
                             (grpc.StatusCode.DEADLINE_EXCEEDED, cut),
                             (grpc.StatusCode.DEADLINE_EXCEEDED,
                              yielded("/grpc.health.v1.Health/Check"))}
           and n_refused >= 1,
           "the flooder's calls: %d refused unread, ended with %s" % (n_refused, set(outcomes)), d)
    silent.close()
    proxy.close()
    expect(d.poll() is None, "gradsyncd died", d)
    # and it shuts down cleanly after it (under ASan: no leak of the
    # waiting calls' hosts and connections)
    d.send_signal(signal.SIGTERM)
    try:
        d.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    expect(d.returncode == 0 and "Sanitizer" not in output(d),
           "gradsyncd after SIGTERM: exit %s" % d.returncode, d)
    print("fair per host: 3 probes from 127.0.0.2 during a 288-call flood on 32 connections from "
          "127.0.0.1: all SERVING; the flooder's calls cut off while each waited: %s; %d of "
          "them refused unread" % (" ".join(map(str, ended)), n_refused), flush=True)


def make_certs():
    """A CA, a server certificate for 127.0.0.1 and a client certificate."""
    make_ca(TMP, "ca", "/CN=gradsync test CA", 1)
    issue_cert(TMP, "server", "ca",
               "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n", 1)
    issue_cert(TMP, "client", "ca", "extendedKeyUsage=clientAuth\n", 1)
    return {k: os.path.join(TMP, k) for k in ("ca.crt", "server.crt", "server.key", "client.crt",
                                              "client.key")}


def test_tls_and_mtls():
    """TLS and mTLS jobs complete; a plaintext worker against TLS, and a
    worker without a client certificate under mTLS, fail gs_init within
    seconds with a clear error."""
    c = make_certs()
    token = secrets.token_hex(16)
    for mtls in (False, True):
        args = ["--world-size", "2", "--tls-cert", c["server.crt"], "--tls-key", c["server.key"]]
        if mtls:
            args += ["--tls-client-ca", c["ca.crt"]]
        d, addr = start_gradsyncd(args, {"GRADSYNC_JOB_TOKEN": token})
        expect("TLS on" in output(d), "gradsyncd did not say TLS is on", d)
        # misconfigured ranks first: they must fail fast
        bad_envs = [("plaintext", {"GRADSYNC_JOB_TOKEN": token},
                     "the coordinator serves TLS (gradsyncd --tls-cert) and this rank speaks "
                     "plaintext; set GRADSYNC_TLS_CA")]
        if mtls:
            bad_envs.append(("no client certificate",
                             {"GRADSYNC_JOB_TOKEN": token, "GRADSYNC_TLS_CA": c["ca.crt"]},
                             "requires one (mTLS: set GRADSYNC_TLS_CERT and GRADSYNC_TLS_KEY)"))
        for what, env, says in bad_envs:
            t0 = time.time()
            p = start_rank(addr, 0, 2, ["ops"], env)
            code = wait_exit(p, 60)
            took = time.time() - t0
            text = output(p)
            expect(code != 0 and "This is a TLS mismatch: " in text and says in text,
                   "%s worker: exit %s" % (what, code), p)
            expect(took < 20, "%s worker failed only after %.1f s (join timeout 30 s)" %
                   (what, took), p)
            print("tls: %s worker against %s failed after %.1f s" %
                  (what, "mTLS" if mtls else "TLS", took))
        env = {"GRADSYNC_JOB_TOKEN": token, "GRADSYNC_TLS_CA": c["ca.crt"]}
        if mtls:
            env.update({"GRADSYNC_TLS_CERT": c["client.crt"], "GRADSYNC_TLS_KEY": c["client.key"]})
        # a python client with TLS but without the token is refused (before
        # the job: a one-job coordinator exits once it finished)
        creds = grpc.ssl_channel_credentials(
            open(c["ca.crt"], "rb").read(),
            open(c["client.key"], "rb").read() if mtls else None,
            open(c["client.crt"], "rb").read() if mtls else None)
        code, det, _ = unary(channel(addr, creds), "KvGet", kv_get("x"))
        expect(code == grpc.StatusCode.UNAUTHENTICATED, "TLS without token: %s" % code)
        ranks = [start_rank(addr, r, 2, ["ops"], env) for r in range(2)]
        expect_ops_passed(ranks)
        kill_all()
    # a TLS rank against a plaintext coordinator: as fast, saying which side is which
    d, addr = start_gradsyncd(["--world-size", "2"], {"GRADSYNC_JOB_TOKEN": token})
    t0 = time.time()
    p = start_rank(addr, 0, 2, ["ops"], {"GRADSYNC_JOB_TOKEN": token,
                                          "GRADSYNC_TLS_CA": c["ca.crt"]})
    code = wait_exit(p, 60)
    took = time.time() - t0
    expect(code != 0 and "This is a TLS mismatch: the coordinator serves plaintext and this "
           "rank speaks TLS (GRADSYNC_TLS_CA is set)" in output(p),
           "TLS worker against plaintext: exit %s" % code, p)
    expect(took < 20, "TLS worker against plaintext failed only after %.1f s" % took, p)
    print("tls: TLS worker against plaintext failed after %.1f s" % took)
    kill_all()


TESTS = [test_token_required_everywhere, test_gradsync_run_token, test_listen_refusals,
         test_malformed_bytes_every_method, test_identity_and_kv_ownership,
         test_session_hijack_during_job, test_kv_limits_and_waiters, test_kv_waiter_cap,
         test_first_message_flood, test_unauthenticated_flood, test_open_streams_flood,
         test_open_calls_fair_per_host, test_tls_and_mtls]


def main():
    wanted = sys.argv[2:]
    failed = 0
    for t in TESTS:
        if wanted and t.__name__ not in wanted:
            continue
        t0 = time.time()
        try:
            t()
            print("PASS %s (%.1f s)" % (t.__name__, time.time() - t0), flush=True)
        except Exception:
            failed += 1
            print("FAIL %s\n%s" % (t.__name__, traceback.format_exc()), flush=True)
        finally:
            kill_all()
    print("%d failed" % failed if failed else "all passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
