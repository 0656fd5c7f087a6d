"""Loader.stats() of the Python binding (python/batchwire, via bw_loader_get_stats) against
what the loader handed out: a coordinator and two workers on loopback, a float32 .npy dataset
with padding (N odd, two ranks), shuffled, two epochs.

* before the first batch every counter is 0;
* after the run: batches = `batchwire plan`'s length over both epochs, samples = the indices
  handed out (padding included), bytes = the batches' nbytes summed; samples_received = the
  distinct indices of each batch (padding is fetched once), bytes_received = that many rows;
  at least one request and at most one per batch and worker (small batches are read in groups,
  several batches a request: docs/client.md, "Fetches ahead"), no retries, failovers or busy
  answers; wait_seconds > 0;
* stats() of a closed loader raises FailedPreconditionError.

Sanitizer builds re-execute under the ASan runtime (bwpy.maybe_reexec_under_asan).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwpy  # noqa: E402
import bwtest as bt  # noqa: E402

N = 101
SHAPE = (4, 6)
B = 8
R = 2
EPOCHS = 2
ROW = 4 * 4 * 6  # float32 rows of 4 x 6


def test(tmpdir):
    batchwire = bwpy.import_batchwire()
    root = os.path.join(tmpdir, "data")
    os.makedirs(root)
    bwpy.gen_npy(root, "ds", N, shape=SHAPE)
    coord, _workers = bwpy.cluster(tmpdir, root)
    plans = [bwpy.plan("--mode", "torch", "--num-samples", N, "--world-size", R, "--batch-size",
                       B, "--shuffle", "--seed", 3, "--epoch", e) for e in range(EPOCHS)]
    keys = ("batches", "samples", "bytes", "wait_seconds", "samples_received", "bytes_received",
            "requests", "retries", "failovers", "busy")
    for rank in range(R):
        loader = batchwire.Loader(coordinator=coord.addr, job="stats", dataset="npy:ds/*.npy",
                                  batch_size=B, shuffle=True, seed=3, rank=rank, world_size=R)
        st = loader.stats()
        handed = ("batches", "samples", "bytes", "wait_seconds")
        bt.check(set(st) == set(keys) and all(st[k] == 0 for k in handed),
                 "rank %d: stats() before the first batch: nothing handed out, no wait "
                 "(prefetching has begun: %d samples received)" % (rank, st["samples_received"]),
                 st)
        batches = samples = nbytes = distinct = 0
        for _ in loader.epochs(EPOCHS):
            for b in loader:
                batches += 1
                samples += b.count
                nbytes += b.nbytes
                distinct += len(set(b.indices.tolist()))
        st = loader.stats()
        want = sum(len(p[rank]) for p in plans)
        bt.check(st["batches"] == batches == want and st["samples"] == samples and
                 st["bytes"] == nbytes == samples * ROW,
                 "rank %d: stats() batches %d = plan %d, samples %d, bytes %d = the batches'" %
                 (rank, st["batches"], want, st["samples"], st["bytes"]), st)
        bt.check(st["samples_received"] == distinct < samples + 1 and
                 st["bytes_received"] == distinct * ROW and 1 <= st["requests"] <= 2 * batches and
                 st["retries"] == st["failovers"] == st["busy"] == 0 and
                 st["wait_seconds"] > 0,
                 "rank %d: %d distinct samples received (padding once), %d requests, no retries, "
                 "waited %.4f s" % (rank, distinct, st["requests"], st["wait_seconds"]), st)
        loader.close()
        try:
            loader.stats()
        except batchwire.FailedPreconditionError:
            bt.ok("rank %d: stats() of a closed loader raises FailedPreconditionError" % rank)
        else:
            raise bt.TestFailure("stats() of a closed loader did not raise")


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=120)
