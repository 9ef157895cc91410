"""Helpers shared by the Python integration tests that run gradsyncd and
ranks as processes (test_security, test_tls_reload): a process whose output
goes to a file, and certificates made with the openssl CLI (the commands of
docs/security.md)."""
import os
import subprocess


def spawn(procs, out_dir, label, argv, env_extra=None):
    """Starts argv in a session of its own with this environment less every
    GRADSYNC_* variable, plus env_extra; stdout and stderr go to
    out_dir/<label>.out. The process gets .label and .out and is appended to
    procs (for output on failure and clean-up)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRADSYNC_")}
    env.update(env_extra or {})
    out = open(os.path.join(out_dir, "%s.out" % label.replace(" ", "_")), "w+")
    p = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    p.label, p.out = label, out
    procs.append(p)
    return p


def output(p):
    """What a spawned process has written so far."""
    p.out.flush()
    with open(p.out.name) as f:
        return f.read()


def openssl(cwd, *args):
    """Runs the openssl command in cwd; AssertionError with its stderr if it fails."""
    r = subprocess.run(["openssl"] + list(args), cwd=cwd, capture_output=True, text=True,
                       timeout=60)
    if r.returncode != 0:
        raise AssertionError("openssl %s failed: %s" % (" ".join(args), r.stderr))


def make_ca(cwd, name, subject, days):
    """A self-signed CA: cwd/<name>.key and cwd/<name>.crt."""
    openssl(cwd, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(days), "-subj",
            subject, "-keyout", name + ".key", "-out", name + ".crt")


def issue_cert(cwd, name, ca, extensions, days):
    """cwd/<name>.key and cwd/<name>.crt (subject /CN=gradsync <name>), signed
    by the CA cwd/<ca>.crt with the extension lines extensions."""
    openssl(cwd, "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=gradsync " + name,
            "-keyout", name + ".key", "-out", name + ".csr")
    with open(os.path.join(cwd, name + ".ext"), "w") as f:
        f.write(extensions)
    openssl(cwd, "x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
            "-CAcreateserial", "-days", str(days), "-extfile", name + ".ext", "-out",
            name + ".crt")
