"""Helpers for the tests of the Python package (python/batchwire), not a test itself.

* import_batchwire(): the package from the source tree with this build's libbatchwire (and,
  for a sanitizer build, the test re-executed with the ASan runtime preloaded, or skipped);
* cluster(): a coordinator and workers on loopback serving a data root;
* gen_npy(): a float32 .npy dataset written by `batchwire gen`;
* plan(): `batchwire plan` for every rank, {rank: [batch, ...]};
* python_child(): a Python child using the package, its stdout lines read as they come
  (ChildLines: waiting for a line has a deadline).
"""

import json
import os
import re
import subprocess
import sys

import bwtest as bt


def sanitize_flags():
    """BW_SANITIZE of the build under test ("" for a plain build)."""
    cache = os.path.join(bt.BUILD_DIR, "CMakeCache.txt")
    try:
        with open(cache) as f:
            m = re.search(r"^BW_SANITIZE:STRING=(.*)$", f.read(), re.M)
    except OSError:
        return ""
    return m.group(1).strip() if m else ""


def _asan_loaded():
    try:
        with open("/proc/self/maps") as f:
            return "libasan" in f.read()
    except OSError:
        return False


def maybe_reexec_under_asan():
    """In a sanitizer build, run again with the ASan runtime preloaded (or skip): a
    libbatchwire built with AddressSanitizer cannot be loaded into a plain Python.
    ASAN_OPTIONS gets detect_leaks=0 (the interpreter itself "leaks" at exit; the C tests
    cover the library's leaks)."""
    flags = sanitize_flags()
    if "address" not in flags or _asan_loaded():
        return
    if os.environ.get("BW_PY_ASAN_REEXEC"):
        print("FAIL: re-executed with LD_PRELOAD but libasan is still not loaded", flush=True)
        sys.exit(1)
    try:
        rt = subprocess.run(["gcc", "-print-file-name=libasan.so"], stdout=subprocess.PIPE,
                            text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rt = ""
    if not rt or not os.path.isabs(rt) or not os.path.exists(rt):
        print("SKIP: %s is a sanitizer build (BW_SANITIZE=%s): its libbatchwire.so needs the "
              "AddressSanitizer runtime preloaded into python, and libasan.so was not found "
              "(gcc -print-file-name=libasan.so)" % (bt.BUILD_DIR, flags), flush=True)
        sys.exit(0)
    env = dict(os.environ)
    env["LD_PRELOAD"] = (rt + " " + env.get("LD_PRELOAD", "")).strip()
    # Last, so it wins over a detect_leaks=1 the caller set (scripts/test does).
    env["ASAN_OPTIONS"] = ((env["ASAN_OPTIONS"] + ":") if env.get("ASAN_OPTIONS") else "") + \
        "detect_leaks=0"
    env["BW_PY_ASAN_REEXEC"] = "1"
    print("sanitizer build (BW_SANITIZE=%s): re-running with LD_PRELOAD=%s "
          "ASAN_OPTIONS=%s" % (flags, rt, env["ASAN_OPTIONS"]), flush=True)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def lib_path():
    return os.path.join(bt.BUILD_DIR, "lib", "libbatchwire.so")


def import_batchwire():
    """The batchwire package of the source tree, loading this build's library."""
    sys.path.insert(0, os.path.join(bt.SOURCE_DIR, "python"))
    os.environ["BATCHWIRE_LIB"] = lib_path()
    import batchwire
    bt.check(batchwire.library_path() == os.environ["BATCHWIRE_LIB"],
             "batchwire loads %s (version %s)" % (batchwire.library_path(), batchwire.version()))
    return batchwire


def gen_npy(root, name, n, shape=(3, 5), dtype="float32"):
    """`batchwire gen` a .npy dataset of n samples under root/name; returns np.load of it."""
    import numpy as np
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(root, name), "--num-samples", n,
               "--shape", ",".join(map(str, shape)), "--dtype", dtype, timeout=60)
    bt.check(r.returncode == 0, "gen a %s .npy dataset of %d x %r" % (dtype, n, shape), r.stderr)
    return np.load(os.path.join(root, name, "part-00000.npy"))


def cluster(tmpdir, root, nworkers=2, worker_args=()):
    """A coordinator and nworkers workers serving root; returns (coordinator, workers)."""
    coord = bt.coordinator(tmpdir)
    workers = [bt.worker(tmpdir, coord.addr, "w%d" % i, data_root=root, args=worker_args)
               for i in range(nworkers)]
    bt.poll(lambda: sum(w["state"] == "alive"
                        for w in bt.status_json(coord.addr)["workers"]) == nworkers,
            20, what="%d live workers" % nworkers)
    return coord, workers


def plan(*args):
    """`batchwire plan ARGS...` as {rank: [{"step", "indices", "padding", "real"}, ...]}."""
    r = bt.cli("plan", *args)
    bt.check(r.returncode == 0, "batchwire plan %s" % " ".join(map(str, args)), r.stderr)
    out = {}
    for line in r.stdout.splitlines():
        o = json.loads(line)
        if "rank" in o:
            out.setdefault(o["rank"], []).append(o)
    return out


def fetch_mix(coord_addr, job, rank, world, mix, *extra, mode="torch", batch=4, seed=7,
              ok=True):
    """`batchwire fetch` of a mixture (mix: its --mix arguments) at rank/world; with ok, checks
    it exited 0 and returns its batch lines as dicts, else returns the finished process."""
    r = bt.cli("fetch", "--coordinator", coord_addr, "--job", job, *mix, "--mode", mode,
               "--batch-size", batch, "--seed", seed, "--rank", rank, "--world-size", world,
               *extra, timeout=60)
    if not ok:
        return r
    bt.check(r.returncode == 0, "fetch %s rank %d/%d %s" % (job, rank, world,
                                                          " ".join(map(str, extra))), r.stderr)
    return [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{\"epoch\"")]


NPY = "npy:ds/part-00000.npy"


def job_reads_plan(coord_addr, arr, batch, what, **loader_args):
    """Rank 0 of 1 of a job "legit" over NPY (arr: np.load of it) reads one epoch: checks that
    every batch is the one `batchwire plan` gives, with the file's samples."""
    batchwire = import_batchwire()
    want = plan("--mode", "torch", "--num-samples", len(arr), "--world-size", 1,
                "--batch-size", batch, "--epoch", 0)[0]
    got = []
    with batchwire.Loader(coordinator=coord_addr, job="legit", dataset=NPY, batch_size=batch,
                          rank=0, world_size=1, job_epochs=1, **loader_args) as loader:
        for b in loader:
            got.append((b.indices.tolist(), b.numpy().copy()))
    bt.check(len(got) == len(want) and all(
        g == w["indices"] and x.tobytes() == arr[g].tobytes()
        for (g, x), w in zip(got, want)),
        "%s read all %d batches exactly as batchwire plan says, samples equal to the file's" %
        (what, len(want)), "%d batches, %d planned" % (len(got), len(want)))


def npy_cluster(tmpdir, n, shape=(3, 5), nworkers=2):
    """The usual start of a test: the package, a data root holding a float32 .npy dataset
    "ds" of n samples (the dataset spec is NPY) and a cluster serving the root.
    Returns (batchwire, root, np.load of the dataset, the coordinator)."""
    batchwire = import_batchwire()
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    arr = gen_npy(root, "ds", n, shape)
    coord, _ = cluster(tmpdir, root, nworkers)
    return batchwire, root, arr, coord


def gen(root, fmt, name, n, lo, hi, files=1):
    """`batchwire gen` a dataset of n samples of lo..hi bytes in `files` files under
    root/name."""
    r = bt.cli("gen", "--format", fmt, "--out", os.path.join(root, name), "--num-samples", n,
               "--files", files, "--sample-bytes", lo, "--sample-bytes-max", hi, timeout=60)
    bt.check(r.returncode == 0, "gen a %s dataset of %d samples in %d file(s)" % (fmt, n, files),
             r.stderr)


def in_threads(fn, items, timeout=120):
    """fn(item) for every item, each in its own thread (ranks of one job); returns
    {item: result}, or raises the first failure."""
    import threading
    results, failures = {}, []

    def one(item):
        try:
            results[item] = fn(item)
        except BaseException as e:  # raised in the caller's thread
            failures.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in items]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if failures:
        raise failures[0]
    bt.check(len(results) == len(items), "%d threads finished" % len(items))
    return results


class ChildLines:
    """A child's stdout, read line by line by a thread as it arrives (so that waiting for a
    line has a deadline even when the child prints nothing). `lines` ends with None at EOF."""

    def __init__(self, p, errfile=None):
        import threading
        self.p, self.errfile = p, errfile
        self.lines = []
        self.cursor = 0  # next() looks at lines from here on
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self.cv:
                self.lines.append(line.rstrip("\n"))
                self.cv.notify_all()
        with self.cv:
            self.lines.append(None)
            self.cv.notify_all()

    def _fail(self, what):
        err = ""
        if self.errfile:
            try:
                with open(self.errfile, errors="replace") as f:
                    err = f.read()[-3000:]
            except OSError:
                pass
        raise bt.TestFailure("the child (pid %d) printed no %s; status %s\nstdout (last lines): "
                             "%s\nstderr: %s" % (self.p.pid, what, self.p.poll(),
                                                 [x for x in self.lines[-8:]], err))

    def wait(self, pred, timeout, what):
        """All lines so far, once pred(lines) holds; TestFailure after `timeout` s or EOF."""
        import time
        deadline = time.monotonic() + timeout
        with self.cv:
            while not pred(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or (self.lines and self.lines[-1] is None):
                    self._fail(what)
                self.cv.wait(left)
            return list(self.lines)

    def next(self, prefix, timeout=60):
        """The words of the next line (after the last one next() returned) that starts with
        `prefix`."""
        def found(lines):
            for i in range(self.cursor, len(lines)):
                if lines[i] is not None and lines[i].startswith(prefix):
                    return True
            return False

        lines = self.wait(found, timeout, "line starting with %r" % prefix)
        for i in range(self.cursor, len(lines)):
            if lines[i] is not None and lines[i].startswith(prefix):
                self.cursor = i + 1
                return lines[i].split()


def python_child(tmpdir, name, argv):
    """A Python child using the package of the source tree with this build's library, in its
    own session (killed with the test); its stdout read by a ChildLines (p.out), its stderr in
    tmpdir/NAME.log (printed by bwtest when the test fails)."""
    errfile = os.path.join(tmpdir, name + ".log")
    env = bt.child_env({"BATCHWIRE_LIB": lib_path(),
                        "PYTHONPATH": os.path.join(bt.SOURCE_DIR, "python")})
    with open(errfile, "a") as err:
        p = subprocess.Popen([sys.executable] + list(argv), stdout=subprocess.PIPE, stderr=err,
                             env=env, start_new_session=True, text=True)
    bt._register(p)
    p.out = ChildLines(p, errfile)
    return p
