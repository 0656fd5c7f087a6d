"""Shared helpers for batchwire's process-level tests (not a test itself).

Starts real daemons on random loopback ports, runs the CLI, generates throwaway
certificates, and makes sure every process a test started is gone when it ends,
also when it fails or hangs.

Environment:
  BW_BIN_DIR     directory with batchwire-coordinator, batchwire-worker, batchwire
                 (ctest sets it; default: $BW_BUILD_DIR/bin or <source>/build/bin)
  BW_CLI         path of the `batchwire` CLI, overriding $BW_BIN_DIR/batchwire
  BW_TEST_KEEP   if set, keep the temporary directory (logs, certificates) after a run

Only the Python standard library is used here.
"""

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

SOURCE_DIR = os.environ.get(
    "BW_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
BUILD_DIR = os.environ.get("BW_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
BIN_DIR = os.environ.get("BW_BIN_DIR", os.path.join(BUILD_DIR, "bin"))

COORDINATOR = os.path.join(BIN_DIR, "batchwire-coordinator")
WORKER = os.path.join(BIN_DIR, "batchwire-worker")
CLI = os.environ.get("BW_CLI") or os.path.join(BIN_DIR, "batchwire")

LISTEN_RE = re.compile(r"listening on (\S+)")


class TestFailure(AssertionError):
    pass


class TestTimeout(BaseException):
    """Raised in the main thread when the global timeout expires."""


# ---------------------------------------------------------------------------
# reporting

_T0 = time.monotonic()


def log(msg):
    print("[%6.2fs] %s" % (time.monotonic() - _T0, msg), flush=True)


def ok(msg):
    log("ok: " + msg)


def check(cond, msg, detail=None):
    """Asserts `cond`; prints `ok: msg` or raises TestFailure with the detail."""
    if not cond:
        raise TestFailure(msg + ("" if detail is None else "\n--- detail ---\n%s" % (detail,)))
    ok(msg)


def check_in(needle, haystack, msg):
    check(needle in haystack, "%s (found %r)" % (msg, needle),
          "expected %r in:\n%s" % (needle, haystack))


def poll(fn, timeout, interval=0.05, what="condition"):
    """Calls fn() until it returns something truthy; returns that or raises TestFailure."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise TestFailure("timed out after %.1fs waiting for %s (last: %r)" %
                              (timeout, what, last))
        time.sleep(interval)


# ---------------------------------------------------------------------------
# processes

_procs = []          # every Popen started through this module
_procs_lock = threading.Lock()


def child_env(extra=None):
    """The environment for a child: ours without any BATCHWIRE_* setting, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHWIRE_")}
    if extra:
        env.update(extra)
    return env


try:
    import ctypes
    _libc = ctypes.CDLL(None, use_errno=True)
except Exception:  # pragma: no cover
    _libc = None


def _child_setup():
    """In the child before exec: die with the test (PR_SET_PDEATHSIG), even if it is SIGKILLed
    (e.g. by ctest's timeout) and cannot clean up. Note: the signal comes when the *thread*
    that started the child exits, not the process -- start daemons that must outlive a helper
    thread from the main thread."""
    if _libc is not None:
        _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# Running Python in a forked child before exec is unsafe when the parent has threads that
# hold locks of a preloaded sanitizer runtime (test_python_binding under ASan re-executes
# itself with libasan preloaded and runs libbatchwire's threads in-process): the child can
# spin forever on the sanitizer allocator's lock. There, children rely on kill_all only.
_PREEXEC = None if os.environ.get("BW_PY_ASAN_REEXEC") else _child_setup


def _register(p):
    with _procs_lock:
        _procs.append(p)


def kill_all():
    """SIGKILLs the process group of every child still running and reaps it."""
    with _procs_lock:
        procs = list(_procs)
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=5)
        except Exception:
            pass


atexit.register(kill_all)


def run(argv, env=None, timeout=30, input_data=None):
    """Runs a short-lived program in its own process group; returns CompletedProcess (text)."""
    p = subprocess.Popen(argv, stdin=subprocess.PIPE if input_data is not None else subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(env),
                         start_new_session=True, preexec_fn=_PREEXEC, text=True)
    _register(p)
    try:
        out, err = p.communicate(input=input_data, timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise TestFailure("%s did not finish within %ss\nstdout:\n%s\nstderr:\n%s" %
                          (" ".join(argv), timeout, out, err))
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def cli(*args, env=None, timeout=30):
    return run([CLI] + [str(a) for a in args], env=env, timeout=timeout)


class Daemon:
    """A coordinator or worker process; stdout and stderr go to a log file."""

    def __init__(self, name, argv, tmpdir, env=None):
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = os.path.join(tmpdir, "%s.%d.log" % (name, int(time.monotonic() * 1e6)))
        self._logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._logf,
                                     stderr=subprocess.STDOUT, env=child_env(env),
                                     start_new_session=True, preexec_fn=_PREEXEC)
        _register(self.proc)
        self._logf.close()
        self.addr = None
        self.first_line = None

    @property
    def pid(self):
        return self.proc.pid

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait_listening(self, timeout=15):
        """Waits for the first log line `... listening on HOST:PORT ...`; returns the address."""
        def first():
            text = self.log_text()
            if "\n" in text:
                return text.split("\n", 1)[0]
            if self.proc.poll() is not None:
                raise TestFailure("%s exited with %s before listening; log:\n%s" %
                                  (self.name, self.proc.returncode, text))
            return None
        line = poll(first, timeout, what="%s to log its first line" % self.name)
        m = LISTEN_RE.search(line)
        if not m:
            raise TestFailure("%s: first log line is not 'listening on': %r\nlog:\n%s" %
                              (self.name, line, self.log_text()))
        self.first_line = line
        self.addr = m.group(1)
        return self.addr

    def wait_log(self, pattern, timeout=10, count=1):
        """Waits until `pattern` (a regex) matches `count` times in the log; returns the matches."""
        rx = re.compile(pattern)

        def found():
            ms = list(rx.finditer(self.log_text()))
            if len(ms) >= count:
                return ms
            if self.proc.poll() is not None:
                # Read once more: the line may have been written just before exiting.
                ms = list(rx.finditer(self.log_text()))
                if len(ms) >= count:
                    return ms
                raise TestFailure("%s exited with %s without logging %r; log:\n%s" %
                                  (self.name, self.proc.returncode, pattern, self.log_text()))
            return None
        return poll(found, timeout, what="%s to log %r" % (self.name, pattern))

    def running(self):
        return self.proc.poll() is None

    def send(self, sig):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def kill9(self):
        self.send(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            raise TestFailure("%s (pid %d) did not exit within %ss; log:\n%s" %
                              (self.name, self.proc.pid, timeout, self.log_text()))

    def stop(self, timeout=15, sig=signal.SIGTERM):
        """Sends SIGTERM (to the process only) and waits; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait(timeout)


def write_principals(path, rows, mode=0o600):
    """A principals file for --auth-tokens (docs/security.md, "Principals and roles"): one line
    per row of (role, name, token) or (role, name, token, binding), a binding such as
    "ids=w-*" or None; mode: the file's permissions (a test of the file-mode warning gives
    another)."""
    with open(path, "w") as f:
        f.write("# role name token [ids=PATTERN,...]\n")
        for row in rows:
            f.write(" ".join(str(x) for x in row if x) + "\n")
    os.chmod(path, mode)
    return path


def secret_file(tmpdir, name, text, mode=0o600):
    """TMPDIR/NAME holding `text` and a newline (a --token-file or --metrics-auth file)."""
    path = os.path.join(tmpdir, name)
    with open(path, "w") as f:
        f.write(text + "\n")
    os.chmod(path, mode)
    return path


def grant_key(tmpdir):
    """The test's --grant-key file (docs/security.md, "Read grants"): TMPDIR/grant.key, one
    random key made on first use, shared by every daemon the test starts in tmpdir."""
    path = os.path.join(tmpdir, "grant.key")
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("k1 %s\n" % os.urandom(32).hex())
    return path


def _with_grant_key(tmpdir, args):
    """args, and --grant-key TMPDIR/grant.key when they give --auth-tokens but no key (a
    daemon with authentication on needs one; the coordinator and its workers share it)."""
    args = list(args)
    if "--auth-tokens" in args and "--grant-key" not in args:
        args += ["--grant-key", grant_key(tmpdir)]
    return args


def coordinator(tmpdir, name="coordinator", state_dir=None, args=(), env=None, wait=True):
    state_dir = state_dir or tempfile.mkdtemp(prefix="state-", dir=tmpdir)
    argv = [COORDINATOR, "--listen", "127.0.0.1:0", "--state-dir", state_dir] + _with_grant_key(
        tmpdir, args)
    d = Daemon(name, argv, tmpdir, env=env)
    d.state_dir = state_dir
    if wait:
        d.wait_listening()
    return d


def worker(tmpdir, coord_addr, wid, args=(), env=None, wait=True, data_root=None):
    data_root = data_root or os.path.join(tmpdir, "data")
    os.makedirs(data_root, exist_ok=True)
    argv = [WORKER, "--coordinator", coord_addr, "--listen", "127.0.0.1:0", "--data-root",
            data_root, "--id", wid] + _with_grant_key(tmpdir, args)
    d = Daemon("worker-" + wid, argv, tmpdir, env=env)
    if wait:
        d.wait_listening()
    return d


def status_json(coord_addr, tls_args=(), timeout=20):
    """`batchwire status --json`; returns the parsed object (raises on failure)."""
    r = cli("status", "--coordinator", coord_addr, "--json", "--timeout-ms", "5000", *tls_args,
            timeout=timeout)
    if r.returncode != 0:
        raise TestFailure("batchwire status --json exited %d\nstdout:\n%s\nstderr:\n%s" %
                          (r.returncode, r.stdout, r.stderr))
    try:
        return json.loads(r.stdout)
    except ValueError as e:
        raise TestFailure("batchwire status --json printed invalid JSON (%s):\n%s" % (e, r.stdout))


def workers_by_id(st):
    return {w["id"]: w for w in st["workers"]}


# ---------------------------------------------------------------------------
# certificates

def _openssl(args, cwd):
    r = subprocess.run(["openssl"] + args, cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=30)
    if r.returncode != 0:
        raise TestFailure("openssl %s failed:\n%s" % (" ".join(args), r.stdout))


_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _ca(d, name, cn):
    _openssl(["req", "-x509"] + _EC + ["-keyout", name + ".key", "-out", name + ".crt",
              "-subj", "/CN=" + cn, "-days", "2",
              "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign"], d)


def _leaf(d, name, cn, ca, san=None, eku="serverAuth,clientAuth"):
    _openssl(["req", "-new"] + _EC + ["-keyout", name + ".key", "-out", name + ".csr",
              "-subj", "/CN=" + cn], d)
    ext = ["basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature",
           "extendedKeyUsage=" + eku]
    if san:
        ext.append("subjectAltName=" + san)
    with open(os.path.join(d, name + ".ext"), "w") as f:
        f.write("\n".join(ext) + "\n")
    _openssl(["x509", "-req", "-in", name + ".csr", "-CA", ca + ".crt", "-CAkey", ca + ".key",
              "-CAcreateserial", "-out", name + ".crt", "-days", "2", "-extfile", name + ".ext"], d)


def make_pki(tmpdir):
    """Throwaway certificates (EC P-256). Returns {name: path}:
      ca, rogue_ca                     CA certificates (rogue: unrelated to ca)
      server_crt/key                   coordinator: SAN DNS:localhost, IP:127.0.0.1
      worker_crt/key                   worker: server and client use, same SANs
      client_crt/key                   CLI client certificate (clientAuth only)
      rogue_crt/key                    server+client certificate signed by rogue_ca
    """
    d = os.path.join(tmpdir, "pki")
    os.makedirs(d, exist_ok=True)
    t = time.monotonic()
    _ca(d, "ca", "batchwire test CA")
    _ca(d, "rogue-ca", "unrelated test CA")
    san = "DNS:localhost,IP:127.0.0.1"
    _leaf(d, "server", "localhost", "ca", san)
    _leaf(d, "worker", "worker.localhost", "ca", san)
    _leaf(d, "client", "batchwire-cli", "ca", eku="clientAuth")
    _leaf(d, "rogue", "localhost", "rogue-ca", san)
    p = lambda n: os.path.join(d, n)
    log("generated throwaway CA, rogue CA, server/worker/client/rogue certificates in %.2fs" %
        (time.monotonic() - t))
    return {
        "dir": d, "ca": p("ca.crt"), "rogue_ca": p("rogue-ca.crt"),
        "server_crt": p("server.crt"), "server_key": p("server.key"),
        "worker_crt": p("worker.crt"), "worker_key": p("worker.key"),
        "client_crt": p("client.crt"), "client_key": p("client.key"),
        "rogue_crt": p("rogue.crt"), "rogue_key": p("rogue.key"),
    }


def make_expired(pki):
    """A certificate (and key) signed by pki's CA that expired in 2020: (crt, key)."""
    d = pki["dir"]
    _openssl(["req", "-new"] + _EC + ["-keyout", "expired.key", "-out", "expired.csr",
              "-subj", "/CN=localhost"], d)
    with open(os.path.join(d, "expired-ca.cnf"), "w") as f:
        f.write("[ca]\ndefault_ca = d\n[d]\ndatabase = expired-index.txt\nnew_certs_dir = .\n"
                "serial = expired-serial\ndefault_md = sha256\npolicy = p\n"
                "unique_subject = no\n[p]\ncommonName = supplied\n")
    open(os.path.join(d, "expired-index.txt"), "w").close()
    with open(os.path.join(d, "expired-serial"), "w") as f:
        f.write("1000\n")
    _openssl(["ca", "-config", "expired-ca.cnf", "-batch", "-notext", "-cert", "ca.crt",
              "-keyfile", "ca.key", "-in", "expired.csr", "-out", "expired.crt",
              "-startdate", "20200101000000Z", "-enddate", "20200102000000Z"], d)
    return os.path.join(d, "expired.crt"), os.path.join(d, "expired.key")


# ---------------------------------------------------------------------------
# running a test file

def _watchdog(seconds):
    """Last resort if the main thread is stuck where SIGALRM cannot reach it."""
    time.sleep(seconds)
    sys.stderr.write("FAIL: hard timeout after %ss; killing every child\n" % seconds)
    sys.stderr.flush()
    kill_all()
    os._exit(3)


def main(test_fn, timeout=60, name=None):
    """Runs test_fn(tmpdir) with a global timeout; cleans up every child; exits 0 on success."""
    name = name or os.path.basename(sys.argv[0])
    for path in (COORDINATOR, WORKER, CLI):
        if not os.access(path, os.X_OK):
            print("FAIL: %s is not an executable (set BW_BIN_DIR / BW_CLI)" % path, flush=True)
            sys.exit(1)
    tmpdir = tempfile.mkdtemp(prefix="bwtest-")

    def on_alarm(signum, frame):
        raise TestTimeout("global timeout of %ss expired" % timeout)

    def on_term(signum, frame):
        raise TestTimeout("interrupted by signal %d" % signum)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.alarm(timeout)
    threading.Thread(target=_watchdog, args=(timeout + 30,), daemon=True).start()
    status = 1
    try:
        test_fn(tmpdir)
        status = 0
    except (Exception, TestTimeout) as e:
        signal.alarm(0)
        print("FAIL: %s: %s" % (type(e).__name__, e), flush=True)
        traceback.print_exc()
        _dump_logs(tmpdir)
    finally:
        signal.alarm(0)
        kill_all()
        if os.environ.get("BW_TEST_KEEP"):
            print("kept %s" % tmpdir)
        else:
            shutil.rmtree(tmpdir, ignore_errors=True)
    print("%s: %s in %.1fs" % (name, "PASS" if status == 0 else "FAIL", time.monotonic() - _T0),
          flush=True)
    sys.exit(status)


def _dump_logs(tmpdir):
    for root, _dirs, files in os.walk(tmpdir):
        for fn in sorted(files):
            if fn.endswith(".log"):
                path = os.path.join(root, fn)
                with open(path, "rb") as f:
                    text = f.read().decode("utf-8", "replace")
                lines = text.splitlines()
                print("----- %s (last %d of %d lines) -----" % (fn, min(40, len(lines)), len(lines)))
                print("\n".join(lines[-40:]))
