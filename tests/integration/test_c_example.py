#!/usr/bin/python3
"""examples/c/minimal.c, the public C API as an installed program uses it (built by CMake
against include/ and libbatchwire.so only, as C with -pedantic and as C++), run against a real
coordinator and worker:

* two epochs of a 1000-sample .npy dataset at batch 16: each epoch line says 63 batches and
  1000 samples (the last batch short), 1000 x 60 bytes;
* the committed cursor, decoded by bw_cursor_describe, names the job, rank 0 of 1, and the end
  of epoch 1 (step 63); the loader's counters count the 126 batches;
* the job is removed once its last epoch was delivered (bw_loader_options.epochs), so a second
  run of the same job starts it anew: the same epochs, and the same cursor text;
* a wrong dataset is refused with the library's sentence on stderr and exit status 1.
"""

import os
import re

import bwpy
import bwtest as bt

N, B = 1000, 16


def test(tmpdir):
    exe = os.path.join(bt.BUILD_DIR, "examples", "minimal")
    bt.check(os.access(exe, os.X_OK), "the example is built (CMake target example_minimal)", exe)
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    bwpy.gen_npy(root, "ds", N)
    coord, _ = bwpy.cluster(tmpdir, root, 1)
    env = {"RANK": "0", "WORLD_SIZE": "1"}

    r = bt.run([exe, coord.addr, "cex", bwpy.NPY, "2"], env=env, timeout=120)
    bt.check(r.returncode == 0, "minimal runs two epochs", r.stdout + r.stderr)
    steps = -(-N // B)
    for e in (0, 1):
        bt.check_in("epoch %d: %d batches, %d samples, %d bytes" % (e, steps, N, N * 60),
                    r.stdout, "epoch %d: every batch, every sample" % e)
    m = re.search(r"cursor (bwc1:\S+): job cex rank 0/1 epoch (\d+) step (\d+)", r.stdout)
    bt.check(m is not None, "the committed cursor, described by bw_cursor_describe", r.stdout)
    bt.check((int(m.group(2)), int(m.group(3))) == (1, steps),
             "the cursor is at the end of epoch 1", r.stdout)
    bt.check_in("stats: %d batches" % (2 * steps), r.stdout, "the counters count the batches")
    bt.ok("minimal: two epochs, the cursor committed and described, the counters")

    r2 = bt.run([exe, coord.addr, "cex", bwpy.NPY, "2"], env=env, timeout=120)
    bt.check(r2.returncode == 0, "a second run of the finished job", r2.stdout + r2.stderr)
    bt.check(r2.stdout.splitlines()[:3] == r.stdout.splitlines()[:3],
             "it starts the removed job anew: the same epochs", r2.stdout)
    bt.check_in(m.group(0), r2.stdout, "the same cursor text is committed")
    bt.ok("minimal: the finished job was removed; a new run starts it anew, same cursors")

    r3 = bt.run([exe, coord.addr, "cex-bad", "npy:nope/none.npy"], env=env, timeout=120)
    bt.check(r3.returncode == 1 and "open: BW_" in r3.stderr and "none.npy" in r3.stderr,
             "a missing dataset: exit 1 with the library's sentence", r3.stderr)
    bt.ok("minimal: a refused open prints the library's sentence")


if __name__ == "__main__":
    bt.main(test, timeout=300)
