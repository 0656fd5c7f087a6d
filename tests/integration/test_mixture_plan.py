"""`batchwire plan --mix-size` against an independent reading of docs/semantics.md, "Mixtures".

The reference below is written from the document's text (not from core/jobs/mixture.c): the
largest-remainder counts, the hash H, the keyed Feistel permutation with cycle-walking, the
stream of passes, and the tree of merges by key, built here by sorting (small E) and, for one
check at E = 10^10, by the random-access rule the document gives. Then:

* the plan equals the reference, position for position, for mixtures of 2 to 5 sources of
  different sizes and weights, at world sizes 1, 3 and 4, in torch and accelerate mode, with
  several seeds, epochs and batch options (sharding: what `batchwire plan --num-samples E`
  prints for positions, as the document says; torch mode also against DistributedSampler's
  rule written out here);
* properties of the plan's own output: per-source counts c_j, every window of 1,000 positions
  within 2 % (and within the document's 2 x depth bound), no sample twice within a pass over
  consecutive epochs, the union over ranks the same at 4 and 3 ranks and after an elastic
  resume from 4 to 3 ranks;
* resume at step 10^9 of an epoch of 10^10 answers what the random-access reference says;
* stream sources ("Streams in a mixture"): the plan with `stream:` sources and `--mix-policy
  cycle|stop` equals the reference (records, passes, the epoch's end P) in torch, accelerate
  and iterable mode; under cycle consecutive epochs read each stream on where the last one
  left it, under stop every epoch from its first record;
* every refused input exits 2 with a message naming it.
"""

import itertools
import json
import os
import random
import subprocess
import sys
from collections import Counter
from decimal import Decimal

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# ---------------------------------------------------------------------------
# the reference, from docs/semantics.md "Mixtures"

def units(weight):
    """A weight's units: its decimal value times 10^9 (at most 9 digits after the point)."""
    v = Decimal(weight) * 10**9
    assert v == v.to_integral_value()
    return int(v)


def counts(E, weights):
    W = [units(w) for w in weights]
    T = sum(W)
    q = [E * w // T for w in W]
    r = [E * w % T for w in W]
    extra = E - sum(q)
    # largest remainders first, equal remainders: the lower index first
    for j in sorted(range(len(W)), key=lambda j: (-r[j], j))[:extra]:
        q[j] += 1
    return q


def mix64(z):
    z = (z + GOLDEN) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def H(*xs):
    h = 0
    for x in xs:
        h = mix64(h ^ (x & M64))
    return h


def murmur_fin(x):
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)


class Perm:
    """P(j, pass, .) of [0, n)."""

    def __init__(self, seed, j, pas, n):
        K = H(1, seed, j, pas)
        self.keys = [mix64((K + r * GOLDEN) & M64) for r in range(6)]
        b = max(1, (n - 1).bit_length())
        if b < 8:
            b += b % 2
        self.h = (b + 1) // 2
        self.l = b - self.h
        self.n = n

    def F(self, x):
        L, R = x >> self.h, x & ((1 << self.h) - 1)
        wl, wr = self.l, self.h  # the widths of L and R
        for k in self.keys:
            L, R = R, L ^ (murmur_fin(R ^ k) & ((1 << wl) - 1))
            wl, wr = wr, wl
        return (L << self.h) | R

    def __call__(self, i):
        x = self.F(i)
        while x >= self.n:
            x = self.F(x)
        return x


_perm_cache = {}


def sample_index(seed, epoch, j, k, c, n):
    t = epoch * c[j] + k
    key = (seed, j, t // n[j], n[j])
    if key not in _perm_cache:
        _perm_cache[key] = Perm(seed, j, t // n[j], n[j])
    return _perm_cache[key](t % n[j])


def jitter(seed, epoch, lo, hi, side, k):
    return H(2, seed, epoch, lo, hi, side, k) >> 32


def order_by_sorting(seed, epoch, c):
    """The root's sequence: [(source, k)] built by merging each node's children by key."""
    def node(lo, hi):
        if hi - lo == 1:
            return [(lo, k) for k in range(c[lo])]
        mid = lo + (hi - lo) // 2
        left, right = node(lo, mid), node(mid, hi)
        A, B = len(left), len(right)
        keyed = [(((1 << 32) * k + jitter(seed, epoch, lo, hi, 0, k)) * B, 0, k)
                 for k in range(A)]
        keyed += [(((1 << 32) * k + jitter(seed, epoch, lo, hi, 1, k)) * A, 1, k)
                  for k in range(B)]
        keyed.sort()  # by key, then the left side (0) first; keys grow with k within a side
        return [left[k] if side == 0 else right[k] for _key, side, k in keyed]
    return node(0, len(c))


def locate_random_access(seed, epoch, c, p):
    """Position p -> (source, k) by the document's "Random access" rule."""
    lo, hi = 0, len(c)
    while hi - lo > 1:
        mid = lo + (hi - lo) // 2
        A, B = sum(c[lo:mid]), sum(c[mid:hi])

        def before(k):
            X = ((1 << 32) * k + jitter(seed, epoch, lo, hi, 0, k)) * B
            m0 = X // ((1 << 32) * A)
            r = X - (1 << 32) * A * m0
            if m0 >= B:
                return B
            return m0 + 1 if jitter(seed, epoch, lo, hi, 1, m0) * A < r else m0

        if A == 0:
            n = 0
        else:
            n = p * A // (A + B)
            while n < A and n + before(n) < p:
                n += 1
            while n > 0 and n - 1 + before(n - 1) >= p:
                n -= 1
        if n < A and n + before(n) == p:
            hi, p = mid, n
        else:
            lo, p = mid, p - n
    return lo, p


def stream_reference(seed, epoch, E, sizes, weights, streams, policy):
    """With stream sources: [(source, index, pass)] for positions 0..P-1, c, and P.

    A stream's k-th sample is stream position t = epoch * c_j + k (cycle) or k (stop): record
    t mod n_j of pass t // n_j. Under stop the epoch ends at the first position whose source is
    a stream with k = n_j. A map-style source keeps its permutations."""
    c = counts(E, weights)
    out = []
    for j, k in order_by_sorting(seed, epoch, c):
        if streams[j]:
            if policy == "stop" and k >= sizes[j]:
                break
            t = k if policy == "stop" else epoch * c[j] + k
            out.append((j, t % sizes[j], t // sizes[j]))
        else:
            t = epoch * c[j] + k
            out.append((j, sample_index(seed, epoch, j, k, c, sizes), t // sizes[j]))
    return out, c, len(out)


def reference(seed, epoch, E, sizes, weights):
    """The epoch's global order: [(source, index)] for positions 0..E-1, and c."""
    c = counts(E, weights)
    return [(j, sample_index(seed, epoch, j, k, c, sizes))
            for j, k in order_by_sorting(seed, epoch, c)], c


# ---------------------------------------------------------------------------
# running the plan

def mix_args(sizes, weights, E):
    a = []
    for n, w in zip(sizes, weights):
        a += ["--mix-size", "%d=%s" % (n, w)]
    if E is not None:
        a += ["--mix-samples", str(E)]
    return a


def stream_args(sizes, weights, streams, E, policy):
    a = []
    for n, w, st in zip(sizes, weights, streams):
        a += ["--mix-size", "%s%d=%s" % ("stream:" if st else "", n, w)]
    if E is not None:
        a += ["--mix-samples", str(E)]
    if policy is not None:
        a += ["--mix-policy", policy]
    return a


def plan(*args):
    r = bt.cli("plan", *args, timeout=120)
    what = " ".join(map(str, args))
    bt.check(r.returncode == 0, "batchwire plan %s exits 0" % (
        what if len(what) < 300 else what[:300] + "..."), r.stderr)
    return [json.loads(line) for line in r.stdout.splitlines()]


def torch_positions(E, R, B, rank):
    """DistributedSampler(shuffle=False, drop_last=False) + DataLoader(batch_size=B), positions."""
    per_rank = -(-E // R)
    padded = [p % E for p in range(per_rank * R)]  # padding repeats from the start (E >= R here)
    mine = padded[rank::R]
    return [mine[i:i + B] for i in range(0, len(mine), B)]


def check_against_reference(sizes, weights, E, seed, epoch, mode, R, B, extra=()):
    order, c = reference(seed, epoch, E if E is not None else sum(sizes), sizes, weights)
    common = ["--mode", mode, "--world-size", R, "--batch-size", B, "--seed", seed,
              "--epoch", epoch] + list(extra)
    mixed = plan(*(common + mix_args(sizes, weights, E)))
    positions = plan(*(common + ["--num-samples", len(order)]))
    bt.check(len(mixed) == len(positions) and len(mixed) > 0,
             "as many batches as the position plan (%d)" % len(positions))
    for m, p in zip(mixed, positions):
        want = [order[i] for i in p["indices"]]
        got = list(zip(m["sources"], m["indices"]))
        if (m["rank"], m["step"], m["real"], m["padding"]) != \
                (p["rank"], p["step"], p["real"], p["padding"]) or got != want:
            raise bt.TestFailure("sizes %s weights %s E %s seed %s epoch %s %s R=%s B=%s %s: "
                                 "rank %s step %s: got %s, want %s"
                                 % (sizes, weights, E, seed, epoch, mode, R, B, extra,
                                    m["rank"], m["step"], got, want))
    if mode == "torch" and not extra:
        for rank in range(R):
            mine = [m for m in mixed if m["rank"] == rank]
            want = [[order[i] for i in b] for b in torch_positions(len(order), R, B, rank)]
            got = [list(zip(m["sources"], m["indices"])) for m in mine]
            bt.check(got == want, "torch: rank %d is DistributedSampler's shard of the order"
                     % rank)
    return mixed, order, c


MIXTURES = [
    # (sizes, weights, E): up- and down-sampled sources, ties in the remainders, a default E
    ([6, 100, 4], ["0.5", "0.3", "0.2"], 10),
    ([6, 100, 4], ["0.5", "0.3", "0.2"], 157),
    ([50, 30], ["1", "1"], None),
    ([7, 7, 7, 7], ["1", "1", "1", "1"], 10),
    ([1000, 300, 17, 5, 60], ["0.7", "0.2", "0.1", "0.05", "3.5"], 401),
    ([3, 900, 41, 12], [".25", "25", "2.5", "0.000000001"], 333),
]


def test_equals_reference():
    n = 0
    rng = random.Random(27)
    for (sizes, weights, E), mode, R in itertools.product(MIXTURES, ("torch", "accelerate"),
                                                          (1, 3, 4)):
        seed = rng.choice([0, 12345, -1, 2**40 + 7])
        epoch = rng.choice([0, 1, 5])
        B = rng.choice([1, 4, 5])
        check_against_reference(sizes, weights, E, seed, epoch, mode, R, B)
        n += 1
    # batch options pass through to the position plan unchanged
    sizes, weights, E = MIXTURES[4]
    for mode, extra in [("torch", ["--drop-last"]), ("torch", ["--sampler-drop-last"]),
                        ("accelerate", ["--no-even-batches"]), ("accelerate", ["--drop-last"]),
                        ("accelerate", ["--split-batches"]),
                        ("accelerate", ["--dispatch-batches"]),
                        ("torch", ["--skip", "7"]), ("accelerate", ["--rank", "2"])]:
        check_against_reference(sizes, weights, E, 9, 2, mode, 4, 8, extra)
        n += 1
    bt.ok("plan = the reference read from the doc for %d mixtures x modes x world sizes" % n)


def test_counts():
    bt.check(counts(10, ["1", "1", "1"]) == [4, 3, 3], "the doc's example 1 1 1, E=10")
    bt.check(counts(7, ["0.7", "0.2", "0.1"]) == [5, 1, 1], "the doc's example 0.7 0.2 0.1")
    for sizes, weights, E in MIXTURES:
        E = E if E is not None else sum(sizes)
        meta = plan("--mode", "accelerate", "--world-size", 1, "--batch-size", 7,
                    "--metadata", *mix_args(sizes, weights, E))
        c = counts(E, weights)
        bt.check(meta[0]["metadata"]["mix_counts"] == c and sum(c) == E,
                 "metadata's mix_counts %s = largest remainder %s" %
                 (meta[0]["metadata"]["mix_counts"], c))
        got = Counter(s for b in meta[1:] for s, pad in zip(b["sources"], b["padding"])
                      if not pad)
        bt.check([got[j] for j in range(len(sizes))] == c,
                 "each source delivers exactly c_j real samples")
    bt.ok("per-source counts are the largest-remainder counts")


def global_order(sizes, weights, E, seed=0, epoch=0):
    """The plan's own global order: one rank, accelerate, no padding when B divides E."""
    out = plan("--mode", "accelerate", "--world-size", 1, "--batch-size", 1, "--seed", seed,
               "--epoch", epoch, *mix_args(sizes, weights, E))
    return [(s, i) for b in out for s, i in zip(b["sources"], b["indices"])]


def test_window_bound():
    rng = random.Random(1)
    worst = 0.0
    for trial in range(6):
        m = rng.randint(2, 6) if trial < 5 else 13
        sizes = [rng.randint(1, 3000) for _ in range(m)]
        weights = [str(rng.choice([1, 2, 5, 10, 50, 333])) + "." + str(rng.randint(0, 99))
                   for _ in range(m)]
        E = rng.randint(3000, 6000)
        seed = rng.randint(0, 2**64 - 1)
        order = global_order(sizes, weights, E, seed, trial)
        c = counts(E, weights)
        depth = (m - 1).bit_length()  # ceil(log2 m)
        for L in (1000, 37):
            run = [0] * m
            for s, _ in order[:L]:
                run[s] += 1
            for start in range(E - L + 1):
                if start:
                    run[order[start - 1][0]] -= 1
                    run[order[start + L - 1][0]] += 1
                for j in range(m):
                    dev = abs(run[j] - L * c[j] / E)
                    if L == 1000:
                        worst = max(worst, dev)
                    if dev >= 2 * depth or (L == 1000 and dev > 20):
                        raise bt.TestFailure("sizes %s weights %s E %d: window of %d at %d holds "
                                             "source %d %d times, %.2f from its share (depth %d)"
                                             % (sizes, weights, E, L, start, j, run[j], dev,
                                                depth))
    bt.ok("every window of 1000 within 2%% (largest deviation %.2f) and of 37 within 2 x depth"
          % worst)


def test_no_repeat_before_exhaustion():
    sizes, weights = [23, 400, 9], ["0.3", "0.5", "0.2"]
    E, seed = 150, 77
    streams = {j: [] for j in range(3)}
    for epoch in range(8):
        for s, i in global_order(sizes, weights, E, seed, epoch):
            streams[s].append(i)
    for j, n in enumerate(sizes):
        st = streams[j]
        bt.check(len(st) == 8 * counts(E, weights)[j], "source %d: c_j a epoch" % j)
        for start in range(0, len(st), n):
            block = st[start:start + n]
            if len(set(block)) != len(block) or not all(0 <= i < n for i in block):
                raise bt.TestFailure("source %d: the pass at stream position %d repeats a sample"
                                     % (j, start))
        if len(st) >= 2 * n:
            bt.check(st[:n] != st[n:2 * n], "source %d: the second pass is a new permutation" % j)
    bt.ok("no sample twice within a pass across 8 epochs; up-sampled passes re-permuted")


def test_torch_ranks_do_not_lock():
    """Two equal sources at two ranks: without the jitter rank 0 would get only source 0."""
    out = plan("--mode", "torch", "--world-size", 2, "--batch-size", 10, "--seed", 3,
               *mix_args([1000, 1000], ["1", "1"], 2000))
    for rank in (0, 1):
        src = [s for b in out if b["rank"] == rank for s in b["sources"]]
        share = src.count(0) / len(src)
        bt.check(0.4 < share < 0.6, "torch, rank %d: source 0 is %.1f%% of its samples"
                 % (rank, 100 * share))


def real_samples(batches):
    return Counter((s, i, ) for b in batches
                   for s, i, pad in zip(b["sources"], b["indices"], b["padding"]) if not pad)


def test_elastic():
    sizes, weights, E = [1000, 300, 17], ["0.6", "0.3", "0.1"], 503
    order, c = reference(5, 3, E, sizes, weights)
    want = Counter(order)
    for mode in ("torch", "accelerate"):
        common = ["--mode", mode, "--batch-size", 6, "--seed", 5, "--epoch", 3]
        at4 = plan(*(common + ["--world-size", 4] + mix_args(sizes, weights, E)))
        at3 = plan(*(common + ["--world-size", 3] + mix_args(sizes, weights, E)))
        bt.check(real_samples(at4) == want == real_samples(at3),
                 "%s: the union over ranks at 4 and at 3 is the epoch's E samples" % mode)
        for K in (0, 5, 13):
            before = [b for b in at4 if b["step"] < K]
            after = plan(*(common + ["--world-size", 3, "--resume-from-world", 4,
                                     "--resume-from-step", K] + mix_args(sizes, weights, E)))
            got = real_samples(before + after)
            bt.check(got == want, "%s: 4 ranks for %d steps then 3 deliver every sample once"
                     % (mode, K))
    bt.ok("elastic: 4 and 3 ranks cover the same positions; 4 -> 3 delivers each once")


def test_resume_far():
    """Step 10^9 of an epoch of 10^10, printed first, equals the random-access reference."""
    sizes = [3 * 10**9, 7 * 10**9, 10**6, 123457]
    weights = ["0.55", "0.3", "0.1", "0.05"]
    E, seed, epoch, B, R = 10**10, 2024, 3, 4, 2  # 1.25 x 10^9 steps a rank
    c = counts(E, weights)
    # the random-access rule agrees with sorting on small orders first
    for small_E, small_w in ((97, weights), (64, ["1", "1", "1", "1"])):
        cs = counts(small_E, small_w)
        by_sort = order_by_sorting(seed, epoch, cs)
        bt.check([locate_random_access(seed, epoch, cs, p) for p in range(small_E)] == by_sort,
                 "random access = sorting (E=%d)" % small_E)
    for mode in ("torch", "accelerate"):
        argv = [bt.CLI, "plan", "--mode", mode, "--world-size", R, "--batch-size", B, "--seed",
                seed, "--epoch", epoch, "--rank", 1, "--skip", 10**9] + \
            mix_args(sizes, weights, E)
        p = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        p.kill()
        p.wait()
        b = json.loads(line)
        bt.check(b["step"] == 10**9 and b["rank"] == 1, "the first line is step 10^9")
        if mode == "torch":
            pos = [(10**9 * B + i) * R + 1 for i in range(B)]
        else:
            pos = [10**9 * R * B + B + i for i in range(B)]
        want = []
        for q in pos:
            j, k = locate_random_access(seed, epoch, c, q)
            want.append((j, sample_index(seed, epoch, j, k, c, sizes)))
        bt.check(list(zip(b["sources"], b["indices"])) == want,
                 "%s: step 10^9 of E=10^10 = reference %s" % (mode, want))
    bt.ok("resume at step 10^9 of an epoch of 10^10 answers the reference")


STREAM_MIXTURES = [
    # (sizes, streams, weights, E): a stream that runs dry early, late, never; mixed kinds
    ([6, 100, 4], [True, False, True], ["0.5", "0.3", "0.2"], 14),
    ([6, 100, 4], [True, True, True], ["0.5", "0.3", "0.2"], 157),
    ([50, 30], [True, True], ["1", "1"], None),
    ([40, 9, 300, 17, 5], [False, True, True, False, True], ["0.3", "0.2", "0.1", "0.3", "0.1"],
     401),
    ([1000], [True], ["1"], None),
]


def test_streams_equal_reference():
    n = 0
    stopped = 0
    rng = random.Random(272)
    for (sizes, streams, weights, E), policy, mode in itertools.product(
            STREAM_MIXTURES, (None, "cycle", "stop"), ("torch", "accelerate", "iterable")):
        R = rng.choice([1, 3, 4])
        B = rng.choice([1, 4, 5])
        seed = rng.choice([0, 12345, -1])
        epoch = rng.choice([0, 1, 3])
        E_ = E if E is not None else sum(sizes)
        order, c, P = stream_reference(seed, epoch, E_, sizes, weights, streams,
                                       policy or "cycle")
        stopped += P < E_
        common = ["--mode", mode, "--world-size", R, "--batch-size", B, "--seed", seed,
                  "--epoch", epoch]
        mixed = plan(*(common + ["--metadata"] + stream_args(sizes, weights, streams, E,
                                                             policy)))
        meta = mixed.pop(0)["metadata"]
        bt.check(meta["mix_end"] == P and meta["mix_samples"] == E_ and meta["mix_counts"] == c,
                 "%s %s: metadata mix_end %s = P %d" % (sizes, policy, meta["mix_end"], P))
        positions = plan(*(common + ["--num-samples", P]))
        bt.check(len(mixed) == len(positions) > 0, "as many batches as the plan of P positions")
        for m, p in zip(mixed, positions):
            want = [order[i] for i in p["indices"]]
            got = list(zip(m["sources"], m["indices"], m["passes"]))
            if (m["rank"], m["step"], m["real"], m["padding"]) != \
                    (p["rank"], p["step"], p["real"], p["padding"]) or got != want:
                raise bt.TestFailure("sizes %s streams %s E %s %s %s seed %s epoch %s R=%s "
                                     "B=%s: rank %s step %s: got %s, want %s"
                                     % (sizes, streams, E, policy, mode, seed, epoch, R, B,
                                        m["rank"], m["step"], got, want))
        n += 1
    bt.check(stopped >= 6, "some stop epochs end before E (%d)" % stopped)
    bt.ok("stream mixtures: plan = the reference for %d cases (%d stopped early)"
          % (n, stopped))


def test_streams_across_epochs():
    """cycle: each epoch goes on where the last left each stream; stop: each from its start."""
    sizes, streams, weights, E = [23, 400, 9], [True, False, True], ["0.3", "0.5", "0.2"], 150
    c = counts(E, weights)
    for policy in ("cycle", "stop"):
        read = {0: [], 2: []}
        for epoch in range(6):
            out = plan("--mode", "iterable", "--world-size", 1, "--batch-size", 1, "--seed", 4,
                       "--epoch", epoch, *stream_args(sizes, weights, streams, E, policy))
            got = {0: [], 2: []}
            for b in out:
                for s_, i, ps in zip(b["sources"], b["indices"], b["passes"]):
                    if s_ in got:
                        got[s_].append((i, ps))
            for j in got:
                if policy == "stop":
                    bt.check(got[j] == [(i, 0) for i in range(len(got[j]))],
                             "stop, epoch %d: stream %d read from its first record" % (epoch, j))
                read[j] += got[j]
        if policy == "cycle":
            for j in read:
                bt.check(read[j] == [(t % sizes[j], t // sizes[j]) for t in range(6 * c[j])],
                         "cycle: stream %d read on across 6 epochs, each pass in file order" % j)
    bt.ok("streams across epochs: cycle continues each stream, stop restarts it")


def expect_refused(args, needle):
    r = bt.cli("plan", "--mode", "torch", "--world-size", 2, "--batch-size", 2, *args)
    bt.check(r.returncode == 2 and r.stdout == "" and needle in r.stderr,
             "refused with %r: %s" % (needle, " ".join(map(str, args))), r.stderr)


def test_refusals():
    expect_refused(["--mix-size", "10=0"], "is not positive")
    expect_refused(["--mix-size", "10=0.0000000000"], "more than 9 digits")
    expect_refused(["--mix-size", "10=-1"], "is not a decimal number")
    expect_refused(["--mix-size", "10=abc"], "weight 'abc' is not a decimal number")
    expect_refused(["--mix-size", "10=1e-3"], "is not a decimal number")
    expect_refused(["--mix-size", "10=1.2.3"], "is not a decimal number")
    expect_refused(["--mix-size", "10=1000000001"], "above the largest weight")
    expect_refused(["--mix-size", "10="], "is not a decimal number")
    expect_refused(["--mix-size", "0=1"], "at least one sample (N = 0)")
    expect_refused(["--mix-size", "x=1"], "the size 'x' is not a whole number")
    expect_refused(["--mix-size", "10"], "expected N=WEIGHT")
    expect_refused(["--mix-size", "=1"], "expected N=WEIGHT")
    expect_refused(["--mix-size", "4611686018427387905=1"], "above 2^62")
    expect_refused(["--mix-size", "4611686018427387904=1", "--mix-size", "1=1"],
                   "sum to 4611686018427387905, above 2^62")
    expect_refused(["--mix-size", "10=1", "--mix-samples", 0], "--mix-samples")
    expect_refused(["--mix-size", "10=1", "--mix-samples", 2**62 + 1], "--mix-samples")
    expect_refused(["--mix-size", "10=1", "--mix-samples", 10**10, "--epoch", 2**61],
                   "is too large for a mixture")
    many = []
    for _ in range(257):
        many += ["--mix-size", "1=1"]
    expect_refused(many, "at most 256 sources")
    expect_refused(["--mix-size", "10=1", "--num-samples", 10], "exclude each other")
    expect_refused(["--mix-size", "10=1", "--shuffle"], "--shuffle does not apply")
    expect_refused(["--mix-size", "10=1", "--shuffle-algo", "torch"], "--shuffle-algo does not")
    expect_refused(["--mix-samples", 10, "--num-samples", 10], "--mix-samples needs")
    expect_refused(["--mix-size", "10=1", "--mix-policy", "stop"],
                   "--mix-policy applies to stream sources")
    expect_refused(["--num-samples", 10, "--mix-policy", "cycle"],
                   "--mix-policy needs a mixture with a stream source")
    expect_refused(["--mix-size", "stream:10=1", "--mix-policy", "drop"], "mix-policy")
    expect_refused(["--mix-size", "stream:=1"], "expected N=WEIGHT or stream:N=WEIGHT")
    expect_refused(["--mix-size", "stream:x=1"], "the size 'x' is not a whole number")
    expect_refused(["--mix-size", "streams:10=1"], "is not a whole number")
    # 256 sources are fine, and single-dataset plans are unchanged by the new flags' defaults
    ok = plan("--mode", "torch", "--world-size", 1, "--batch-size", 256, *(many[:512]))
    bt.check(sorted(ok[0]["sources"]) == list(range(256)), "256 sources of one sample each")
    bt.ok("invalid mixtures are refused with exit status 2 and a message naming the input")


def main(_tmpdir):
    test_counts()
    test_equals_reference()
    test_window_bound()
    test_no_repeat_before_exhaustion()
    test_torch_ranks_do_not_lock()
    test_elastic()
    test_resume_far()
    test_streams_equal_reference()
    test_streams_across_epochs()
    test_refusals()


if __name__ == "__main__":
    bt.main(main, timeout=500)
