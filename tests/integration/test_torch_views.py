"""Safe views (python/README.md, "Views of a batch"): an array or tensor handed out by
batchwire.Batch is never overwritten behind the trainer's back.

A coordinator and two workers on loopback serve a float32 .npy dataset of 63 batches per
epoch (one rank).

* Every batch's numpy() view, torch() tensor and memoryview are kept in lists for a whole
  epoch (the pattern of a metrics list or an async copy); after the epoch -- and again after
  the next epoch ran and after close() -- every kept view still holds its own batch's rows,
  bit for bit (np.load). Nothing was copied to make that true: each view's memory is the
  loader's buffer it was received into (checked by address).
* The usual loop (each batch's tensor alive until the next one replaces it) gives every batch
  right, and a batch never viewed before the loader moved on still gives its own bytes (it
  holds them from the moment it is handed out).
* The explicit opt-in reuse_buffers=True restores buffer reuse: views of old batches then show
  other batches' bytes (what safety prevents), so the check above can fail.
"""

import bwpy
import bwtest as bt

N = 63 * 8
B = 8
SHAPE = (4, 16)


def test(tmpdir):
    batchwire, _root, arr, coord = bwpy.npy_cluster(tmpdir, N, SHAPE)
    opts = dict(coordinator=coord.addr, job="views", dataset=bwpy.NPY,
                batch_size=B, shuffle=True, seed=3, rank=0, world_size=1, prefetch=4)

    def same(x, idx):  # bytes, not values: random float32 bits include NaNs
        return x.tobytes() == arr[idx].tobytes()

    lo = batchwire.Loader(**opts)
    kept = []  # (indices, numpy view, torch tensor, memoryview, address)
    for b in lo:
        x = b.numpy()
        kept.append((b.indices.copy(), x, b.torch(), b.memoryview(),
                     x.__array_interface__["data"][0]))
    bt.check(len(kept) == N // B, "one epoch of %d batches, every batch's views kept" % len(kept))
    addrs = {k[4] for k in kept}
    bt.check(len(addrs) == len(kept), "each kept batch has its own buffer (%d distinct "
             "addresses): the loader moved on to other buffers instead of overwriting" % len(addrs))

    def all_intact(when):
        bad = [i for i, (idx, x, t, mv, _a) in enumerate(kept)
               if not (same(x, idx) and same(t.numpy(), idx) and
                       bytes(mv) == arr[idx].tobytes())]
        bt.check(not bad, "%s: all %d kept numpy/torch/memoryview views hold their own batch's "
                 "rows, bit for bit" % (when, len(kept)), "batches changed: %r" % bad[:10])

    all_intact("after the epoch")
    lo.next_epoch()
    n2 = sum(1 for b in lo if b.numpy() is not None)
    all_intact("after another epoch of %d batches" % n2)
    lo.close()
    all_intact("after close()")
    # Views into the buffers the loader received into: the zero-copy path.
    bt.check(all(k[2].data_ptr() == k[4] for k in kept),
             "each tensor shares its array's memory (torch.from_numpy of the held buffer)")
    kept.clear()

    # The usual loop: the previous batch's tensor is alive while the next one arrives.
    with batchwire.Loader(**dict(opts, job="views-loop")) as lo:
        wrong, prev, seen = [], None, 0
        for b in lo:
            t = b.torch()
            if prev is not None and not same(prev[1].numpy(), prev[0]):
                wrong.append(seen)
            prev = (b.indices.copy(), t)
            seen += 1
        bt.check(seen == N // B and not wrong, "the usual loop: each tensor keeps its bytes "
                 "while the next batch arrives (%d batches)" % seen, wrong)
        lo.next_epoch()
        b1 = lo.next_batch()
        lo.next_batch()
        bt.check(same(b1.numpy(), b1.indices.copy()), "a batch never viewed before the loader "
                 "moved on still gives its own bytes (it holds them from the start)")

    # The opt-in: buffer reuse, views valid only until the next batch.
    with batchwire.Loader(**dict(opts, job="views-reuse", reuse_buffers=True)) as lo:
        kept = [(b.indices.copy(), b.numpy()) for b in lo]
        changed = sum(not same(x, idx) for idx, x in kept)
        addrs = {x.__array_interface__["data"][0] for _i, x in kept}
        bt.check(changed > len(kept) // 2 and len(addrs) <= 8,
                 "reuse_buffers=True: %d of %d kept views show another batch's bytes (%d "
                 "buffers reused): the unsafe behaviour is only there when asked for"
                 % (changed, len(kept), len(addrs)))


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=180)
