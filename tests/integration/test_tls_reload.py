#!/usr/bin/python3
"""SIGHUP reloads gradsyncd's TLS files (issue 11), with the real server,
real worker processes holding a job open over mTLS, Python's ssl module as
a TLS client that reads the certificate the server presents, and Debian's
python3-grpcio as a gRPC client nobody here wrote.

1. gradsyncd starts with --tls-cert/--tls-key (certificate A) and
   --tls-client-ca (CA 1 only); two ranks join with client certificates of
   CA 1; rank 0 submits hold/tensor, rank 1 waits for a file, so the job
   stays mid-step while the files change.
2. A bad rotation: certificate B with A's key, SIGHUP: gradsyncd logs an
   error naming the --tls-key file and what to do; new connections still
   get A. Then a key file that is not PEM: the same, naming the file.
3. The real rotation (B with its key, client CA bundle CA 1 + CA 2, each
   file replaced by rename), SIGHUP: logged as reloaded; a new connection
   gets B; a client certificate of CA 2, refused before, is now accepted;
   a grpcio client that trusts the CA calls Health/Check over the new
   certificate; gradsyncctl (a new connection) still lists hold/tensor as
   pending, missing rank 1: the job was mid-step through the reload.
4. Rank 1 submits: both ranks' sessions, set up with certificate A, finish
   the op and leave; gradsyncd exits 0 ("job (epoch 1) finished").

usage: test_tls_reload.py BIN_DIR   (exit 0 pass, 1 fail, 77 skip)
"""
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time

import testprocs
from testprocs import issue_cert, make_ca, output

try:
    import grpc
except ImportError:
    print("SKIP: python3-grpcio is not installed (apt-get install python3-grpcio)")
    sys.exit(77)
if not shutil.which("openssl"):
    print("SKIP: the openssl command is not installed")
    sys.exit(77)

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/bin")
TMP = tempfile.mkdtemp(prefix="gs-tls-reload-")
TOKEN = "tls-reload-test-token"
PROCS = []


def fail(msg):
    print("FAIL: " + msg)
    for p in PROCS:
        print("--- %s:\n%s" % (p.label, output(p)))
    sys.exit(1)


def ok(msg):
    print("ok   " + msg)


def path(name):
    return os.path.join(TMP, name)


def make_certs():
    """CA 1 signs server certificates A and B and client certificate 1;
    CA 2 signs client certificate 2."""
    for ca in ("ca1", "ca2"):
        make_ca(TMP, ca, "/CN=gradsync reload test " + ca, 2)
    server = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    client = "extendedKeyUsage=clientAuth\n"
    for name, ca, ext in (("srvA", "ca1", server), ("srvB", "ca1", server),
                          ("client1", "ca1", client), ("client2", "ca2", client)):
        issue_cert(TMP, name, ca, ext, 2)


def install(src, dst):
    """Replaces dst by src's bytes the way an operator (or a Kubernetes
    secret update) should: write beside it, then rename."""
    with open(path(src), "rb") as f:
        data = f.read()
    with open(path(dst + ".new"), "wb") as f:
        f.write(data)
    os.rename(path(dst + ".new"), path(dst))


def spawn(label, argv, env_extra=None):
    return testprocs.spawn(PROCS, TMP, label, argv, env_extra)


def wait_for(what, cond, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.1)
    fail("%s: not within %d s" % (what, timeout))


def handshake(port, client):
    """(subject CN of the server's certificate, whether the server accepted
    the client certificate): the server speaks HTTP/2 (its SETTINGS frame
    arrives) only after it verified the client; under TLS 1.3 a refusal
    arrives after the client's side of the handshake, on the first read."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(path("ca1.crt"))
    ctx.load_cert_chain(path(client + ".crt"), path(client + ".key"))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
            cert = s.getpeercert()
            cn = dict(x[0] for x in cert["subject"])["commonName"]
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            try:
                accepted = len(s.recv(9)) > 0
            except (ssl.SSLError, OSError):
                accepted = False
    return cn, accepted


def health_check(addr):
    creds = grpc.ssl_channel_credentials(open(path("ca1.crt"), "rb").read(),
                                         open(path("client1.key"), "rb").read(),
                                         open(path("client1.crt"), "rb").read())
    with grpc.secure_channel(addr, creds) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check")
        return check(b"", timeout=10)  # HealthCheckResponse{status: SERVING} = 08 01


def sighup(d, log_text, count):
    """Sends SIGHUP and waits for the count-th "received SIGHUP" line."""
    d.send_signal(signal.SIGHUP)
    wait_for("gradsyncd logged the SIGHUP",
             lambda: output(d).count("received SIGHUP") >= count, 30)
    last = [l for l in output(d).splitlines() if "received SIGHUP" in l][-1]
    if log_text not in last:
        fail("SIGHUP log line lacks %r: %s" % (log_text, last))
    return last


def main():
    make_certs()
    install("srvA.crt", "server.crt")
    install("srvA.key", "server.key")
    install("ca1.crt", "clients.pem")
    d = spawn("gradsyncd", [os.path.join(BIN, "gradsyncd"), "--listen", "127.0.0.1:0",
                            "--world-size", "2", "--token", TOKEN,
                            "--tls-cert", path("server.crt"), "--tls-key", path("server.key"),
                            "--tls-client-ca", path("clients.pem")])
    wait_for("gradsyncd listening", lambda: "gradsyncd listening on" in output(d), 30)
    addr = [l for l in output(d).splitlines() if l.startswith("gradsyncd listening on")][0].split()[-1]
    port = int(addr.rsplit(":", 1)[1])

    cn, accepted = handshake(port, "client1")
    if (cn, accepted) != ("gradsync srvA", True):
        fail("before the reload: server certificate %r, client 1 accepted %s" % (cn, accepted))
    cn, accepted = handshake(port, "client2")
    if accepted:
        fail("before the reload a client certificate of CA 2 was accepted")
    ok("before the reload: certificate A; a client certificate of CA 2 is refused")

    tls_env = {"GRADSYNC_JOB_TOKEN": TOKEN, "GRADSYNC_TLS_CA": path("ca1.crt"),
               "GRADSYNC_TLS_CERT": path("client1.crt"), "GRADSYNC_TLS_KEY": path("client1.key")}
    go = path("go")
    ranks = []
    for r, mode in ((0, ["hold", "0"]), (1, ["hold-file", go])):
        env = dict(tls_env, GRADSYNC_COORDINATOR=addr, GRADSYNC_RANK=str(r), GRADSYNC_SIZE="2",
                   GRADSYNC_JOIN_TIMEOUT_MS="30000")
        ranks.append(spawn("rank %d" % r, [os.path.join(BIN, "gs-test-worker")] + mode, env))
    ctl_env = dict(tls_env)

    def pending():
        r = subprocess.run([os.path.join(BIN, "gradsyncctl"), "--addr", addr, "--json", "pending"],
                           env=dict(os.environ, **ctl_env), capture_output=True, text=True,
                           timeout=30)
        return r.stdout if r.returncode == 0 else ""

    wait_for("hold/tensor pending (rank 0 submitted, rank 1 holds)",
             lambda: '"hold/tensor"' in pending(), 60)
    ok("job mid-step: hold/tensor pending over mTLS")

    # A bad rotation: certificate B with the old key.
    install("srvB.crt", "server.crt")
    line = sighup(d, "NOT reloaded", 1)
    for want in ("--tls-key " + path("server.key"), "does not belong to the certificate",
                 "send SIGHUP again"):
        if want not in line:
            fail("the mismatch error lacks %r: %s" % (want, line))
    cn, accepted = handshake(port, "client1")
    if (cn, accepted) != ("gradsync srvA", True):
        fail("after a refused reload: certificate %r, accepted %s" % (cn, accepted))
    ok("B's certificate with A's key refused, naming the key file; still certificate A: " +
       line.split('msg="', 1)[1][:160])

    with open(path("server.key.new"), "w") as f:
        f.write("not a key\n")
    os.rename(path("server.key.new"), path("server.key"))
    line = sighup(d, "NOT reloaded", 2)
    if path("server.key") not in line or "not a PEM file" not in line:
        fail("the non-PEM key error does not name the file: %s" % line)
    if handshake(port, "client1")[0] != "gradsync srvA":
        fail("after a refused reload the certificate changed")
    ok("a key file that is not PEM refused, naming it; still certificate A")

    # The real rotation.
    install("srvB.key", "server.key")
    with open(path("ca1.crt")) as a, open(path("ca2.crt")) as b, \
            open(path("bundle.pem"), "w") as out:
        out.write(a.read() + b.read())
    install("bundle.pem", "clients.pem")
    line = sighup(d, "reloaded the TLS files", 3)
    if "/CN=gradsync srvB" not in line:
        fail("the reload line does not describe certificate B: %s" % line)
    cn, accepted = handshake(port, "client1")
    if (cn, accepted) != ("gradsync srvB", True):
        fail("after the reload: certificate %r, client 1 accepted %s" % (cn, accepted))
    if not handshake(port, "client2")[1]:
        fail("after the reload (client CA bundle with CA 2) client 2 is refused")
    reply = health_check(addr)
    if reply != b"\x08\x01":
        fail("grpcio Health/Check over the new certificate: %r" % reply)
    if '"hold/tensor"' not in pending() or '"missing_ranks":[1]' not in pending().replace(" ", ""):
        fail("after the reload hold/tensor is no longer pending (missing rank 1): %s" % pending())
    ok("reloaded: new connections get certificate B, CA 2's client certificate is accepted, "
       "grpcio Health/Check SERVING, the job still mid-step")

    # The sessions set up under certificate A finish the job.
    open(go, "w").close()
    for p in ranks:
        try:
            code = p.wait(timeout=120)
        except subprocess.TimeoutExpired:
            fail("%s did not finish within 120 s after the reload" % p.label)
        if code != 0 or "hold: passed" not in output(p):
            fail("%s exited %s after the reload" % (p.label, code))
    try:
        code = d.wait(timeout=60)
    except subprocess.TimeoutExpired:
        fail("gradsyncd did not exit after the job")
    if code != 0 or "job (epoch 1) finished: all 2 ranks left cleanly" not in output(d):
        fail("gradsyncd exited %s after the job" % code)
    ok("both ranks' sessions (set up under certificate A) finished the op; gradsyncd exit 0")
    print("test_tls_reload: passed")


try:
    main()
finally:
    for p in PROCS:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=10)
    shutil.rmtree(TMP, ignore_errors=True)
