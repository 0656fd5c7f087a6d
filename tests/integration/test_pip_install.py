"""`pip install ./python` (python/README.md, "Installing"): offline, into a fresh venv.

* A venv made with Debian's python3-venv (--system-site-packages, for Debian's numpy,
  setuptools and wheel); `pip install --no-index --no-build-isolation` of a copy of python/
  with BATCHWIRE_LIB naming this build's library, which the wheel bundles.
* From a directory outside the source tree and with no BATCHWIRE_* or PYTHONPATH in the
  environment: `python -m batchwire --version` prints the package's version and the
  library's, both the project's (CMakeLists.txt), and the bundled library inside the venv's
  site-packages; the package ships py.typed.
* A fetch with the installed package: one rank of a job over a coordinator and two workers
  on loopback gives `batchwire plan`'s batches with np.load's bytes.
* Without a library to bundle, the install fails saying what to do.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import bwpy
import bwtest as bt

N = 40
B = 6


def test(tmpdir):
    src = os.path.join(tmpdir, "python")
    shutil.copytree(os.path.join(bt.SOURCE_DIR, "python"), src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    venv = os.path.join(tmpdir, "venv")
    r = bt.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], timeout=120)
    bt.check(r.returncode == 0, "python3 -m venv --system-site-packages", r.stderr)
    py = os.path.join(venv, "bin", "python")
    env = bt.child_env({"BATCHWIRE_LIB": bwpy.lib_path()})
    env.pop("PYTHONPATH", None)
    pip = [py, "-m", "pip", "install", "--no-index", "--no-build-isolation",
           "--disable-pip-version-check"]
    r = bt.run(pip + [src], env=env, timeout=300)
    bt.check(r.returncode == 0, "pip install --no-index --no-build-isolation ./python (offline)",
             r.stdout[-2000:] + r.stderr[-2000:])

    with open(os.path.join(bt.SOURCE_DIR, "CMakeLists.txt")) as f:
        version = re.search(r"project\(batchwire VERSION (\S+) ", f.read()).group(1)
    clean = bt.child_env()  # no BATCHWIRE_*, and outside the source tree
    clean.pop("PYTHONPATH", None)
    r = subprocess.run([py, "-m", "batchwire", "--version"], cwd=tmpdir, env=clean,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    lines = r.stdout.splitlines()
    site = subprocess.run([py, "-c", "import batchwire, os; print(os.path.dirname("
                           "batchwire.__file__))"], cwd=tmpdir, env=clean,
                          stdout=subprocess.PIPE, text=True, timeout=60).stdout.strip()
    bt.check(r.returncode == 0 and len(lines) == 2 and site.startswith(venv) and
             lines[0] == "batchwire %s (Python package)" % version and
             lines[1].startswith("libbatchwire %s " % version) and
             lines[1].endswith("(%s)" % os.path.join(site, "libbatchwire.so")),
             "python -m batchwire --version from the venv: the package's and the library's "
             "version are the project's (%s): %r" % (version, lines), r.stdout + r.stderr)
    bt.check(os.path.exists(os.path.join(site, "py.typed")), "the package ships py.typed")

    # A fetch through the installed package.
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    arr = bwpy.gen_npy(root, "ds", N, (5,))
    coord, _ = bwpy.cluster(tmpdir, root)
    script = ("import json, hashlib, batchwire\n"
              "with batchwire.Loader(coordinator=%r, job='pip', dataset=%r, batch_size=%d,"
              " shuffle=True, seed=4, rank=0, world_size=1) as lo:\n"
              "    for b in lo:\n"
              "        print(json.dumps([b.indices.tolist(),"
              " hashlib.sha256(b.numpy().tobytes()).hexdigest()]))\n"
              "    print(batchwire.library_path())\n" % (coord.addr, bwpy.NPY, B))
    r = subprocess.run([py, "-c", script], cwd=tmpdir, env=clean, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, timeout=120)
    out = r.stdout.splitlines()
    bt.check(r.returncode == 0 and out and out[-1].startswith(venv),
             "the installed package fetches with its bundled library", r.stderr[-2000:])
    got = [json.loads(x) for x in out[:-1]]
    plan = bwpy.plan("--mode", "torch", "--num-samples", N, "--world-size", 1,
                     "--batch-size", B, "--shuffle", "--seed", 4)[0]
    bt.check([g[0] for g in got] == [p["indices"] for p in plan] and
             all(h == hashlib.sha256(arr[i].tobytes()).hexdigest() for i, h in got),
             "%d batches = batchwire plan, bytes = np.load's rows" % len(got))

    # Nothing to bundle: a clear refusal.
    shutil.rmtree(os.path.join(src, "build"), ignore_errors=True)
    r = bt.run(pip + ["--force-reinstall", "--no-deps", src],
               env=dict(env, BATCHWIRE_LIB=os.path.join(tmpdir, "missing.so")), timeout=300)
    bt.check(r.returncode != 0 and "libbatchwire.so not found" in r.stdout + r.stderr and
             "BATCHWIRE_LIB" in r.stdout + r.stderr,
             "without a library the install fails saying how to get one")


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    if not os.path.exists("/usr/lib/python3/dist-packages/wheel"):
        print("SKIP: Debian's python3-wheel is not installed (scripts/lib.sh installs it)")
        sys.exit(0)
    bt.main(test, timeout=400)
