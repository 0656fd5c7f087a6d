#!/usr/bin/python3
"""The client benchmark: one run, on loopback, with a coordinator and two workers it starts.

(a) per-client throughput of `batchwire fetch --quiet` (one rank, world size 1, plan order
    without shuffle) for 256 B, 4 KiB, 64 KiB and 1 MiB samples of a uint8 .npy dataset --
    over the workers' data channels (the default) and with --transport grpc -- against a raw
    TCP loopback transfer of the same bytes in batch-sized writes over one connection
    (build/bench/bench_client_tcp); target >= 0.75 of raw TCP for 64 KiB and larger. Also
    reported: raw TCP over one connection per worker (two), each carrying half of each batch
    (the honest limit: as parallel as two workers); the same fetch shuffled (--shuffle --seed 0)
    against two-connection raw TCP sending the same samples in the same order (the order
    `batchwire plan --shuffle` gives, read from the same random offsets of the mapped file);
    two-connection raw TCP again, receiving batch k into buffer k mod 2 rather than into one
    buffer (bench_client_tcp --buffers 2: the least a loader that overlaps the next batch's
    transfer with the trainer's work can have; one buffer stays in the cache, two may not);
    two-connection raw TCP once more, each connection carrying the samples of each batch that
    the placement gives its worker (bench_client_tcp --placement 256 --copy-below 1024: the
    loader's blocks of neighbouring samples over 256 shards, owners w0 and w1 by rendezvous
    hashing; each worker's runs of samples gathered on one end, pieces under 1 KiB copied
    together as the workers copy them, and scattered into their places on the other -- the same
    split without the protocol);
    and the Python binding (batchwire.Loader, plan order, the same dataset, batch size, epochs
    and prefetch, timed the same way: from opening the loader to the last batch) against
    `batchwire fetch`; and the CPU each costs per GiB moved -- the fetch process and both
    workers (getrusage of the finished fetch, the workers' /proc/PID/stat before and after),
    against the raw TCP program (both of its ends) -- which load on the machine disturbs much
    less than the rates;
(b) the Python binding (batchwire.Loader, shuffled, batch.torch()) against PyTorch's
    DataLoader(num_workers=2, shuffle=True) over the same .npy (np.load with mmap, one row per
    __getitem__, default collate), same batch size; target: faster;
(c) time to the first batch of a Loader resumed from a cursor at step 0, 10^4 and 10^6
    (2^21 samples of 16 B, batch size 1, shuffled); target: flat.
(t) (a)'s fetch for 64 KiB and 1 MiB samples against two workers serving TLS (a second,
    TLS coordinator): the data channel over TLS against gRPC over TLS.

With --auth (part a only), the daemons run with authentication on (--auth-tokens and
--grant-key): each fetch authenticates to the coordinator and every read carries its lease's
read grant, checked by the workers (docs/security.md, "Read grants") -- to compare with a run
without it.

Medians of --repeat runs (interleaved, so that load on the machine hits both sides alike).
Usage (after the README's build):
    /usr/bin/python3 bench/bench_client.py [--build build] [--quick] [--repeat N] [--parts abct]
                                           [--auth]
"""

import argparse
import base64
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
sys.path.insert(0, os.path.join(SRC, "python"))

KiB, MiB = 1 << 10, 1 << 20
# sample bytes, batch size, dataset bytes (full run)
SIZES = [(256, 256, 64 * MiB), (4 * KiB, 256, 256 * MiB), (64 * KiB, 64, 512 * MiB),
         (MiB, 16, 512 * MiB)]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def npy_header_len(path):
    with open(path, "rb") as f:
        head = f.read(12)
    major = head[6]
    if major == 1:
        return 10 + int.from_bytes(head[8:10], "little")
    return 12 + int.from_bytes(head[8:12], "little")


def human(n):
    return "%d MiB" % (n // MiB) if n >= MiB else "%d KiB" % (n // KiB) if n >= KiB else \
        "%d B" % n


def gen_npy(bt, root, name, n, sample):
    """`batchwire gen` of n uint8 samples of `sample` bytes into root/name/part-00000.npy, its
    pages written back before anything is timed: left dirty, the kernel writes them back about
    30 s later (vm.dirty_expire_centisecs), in the middle of the runs -- the 1 MiB rows' first
    runs (of a 512 MiB file) ran at 0.55-0.85 of the rest so."""
    r = bt.cli("gen", "--format", "npy", "--out", os.path.join(root, name), "--num-samples", n,
               "--shape", sample, "--dtype", "uint8", timeout=600)
    if r.returncode != 0:
        raise RuntimeError(r.stderr)
    os.sync()


def median(xs):
    return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------------------
# (a) batchwire fetch vs raw TCP

def children_cpu():
    """CPU seconds of this process's finished (waited-for) children."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def procs_cpu(pids):
    """CPU seconds the running processes pids have used (all threads: /proc/PID/stat)."""
    t = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        t += int(fields[11]) + int(fields[12])  # utime, stime
    return t / os.sysconf("SC_CLK_TCK")


def ms_per_gib(seconds, nbytes):
    return seconds * 1e3 / (nbytes / (1 << 30)) if nbytes else float("nan")


def fetch_cpu(bt, workers, coord, job, dataset, batch, epochs, extra=()):
    """fetch_rate, and the CPU it cost per GiB: {"client", "workers", "total"} in ms/GiB (the
    fetch process, and the workers while it ran)."""
    pids = [w.pid for w in workers]
    c0, w0 = children_cpu(), procs_cpu(pids)
    mib, sps, s = fetch_rate(bt, coord, job, dataset, batch, epochs, extra=extra)
    c, w = children_cpu() - c0, procs_cpu(pids) - w0
    cpu = {"client": ms_per_gib(c, s["bytes"]), "workers": ms_per_gib(w, s["bytes"])}
    cpu["total"] = cpu["client"] + cpu["workers"]
    return mib, sps, cpu


def tcp_cpu(*args, **kw):
    """tcp_rate, and the CPU (ms/GiB) of the program, both ends of every connection."""
    c0 = children_cpu()
    mib = tcp_rate(*args, **kw)
    nbytes = args[3] * args[5]  # nbytes x repeat
    return mib, ms_per_gib(children_cpu() - c0, nbytes)


def fetch_rate(bt, coord, job, dataset, batch, epochs, transport="auto", extra=()):
    r = bt.cli("fetch", "--quiet", "--coordinator", coord, "--job", job, "--dataset", dataset,
               "--rank", 0, "--world-size", 1, "--batch-size", batch, "--epochs", epochs,
               "--transport", transport, *extra, timeout=600)
    if r.returncode != 0:
        raise RuntimeError("batchwire fetch failed:\n%s%s" % (r.stdout, r.stderr))
    s = json.loads(r.stdout.strip().splitlines()[-1])["summary"]
    return s["bytes"] / MiB / s["seconds"], s["samples"] / s["seconds"], s


def tcp_rate(tcp_bin, path, offset, nbytes, chunk, repeat, conns=1, order=None, sample=0,
             buffers=1, placement=False):
    # placement: each connection carries the samples its worker would (the loader's 256 shards,
    # workers w0, w1 as named here), pieces under 1 KiB copied together as the workers copy them
    split = ["--placement", "256", "--copy-below", "1024"] if placement else []
    r = subprocess.run([tcp_bin, "--buffers", str(buffers)] + split +
                       [path, str(offset), str(nbytes), str(chunk), str(repeat), str(conns)] +
                       ([order or "-", str(sample)] if order or placement else []),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError("bench_client_tcp failed: %s" % r.stderr)
    return json.loads(r.stdout)["mib_per_s"]


def shuffled_order(bt, path, n, batch, epochs):
    """The samples a shuffled fetch (--shuffle --seed 0, one rank) reads, epoch after epoch, in
    a file for bench_client_tcp: `batchwire plan`'s batches, u64 each."""
    import struct
    with open(path, "wb") as f:
        for e in range(epochs):
            r = bt.cli("plan", "--mode", "torch", "--num-samples", n, "--world-size", 1,
                       "--batch-size", batch, "--shuffle", "--seed", 0, "--epoch", e, "--rank", 0,
                       timeout=600)
            if r.returncode != 0:
                raise RuntimeError("batchwire plan failed: %s" % r.stderr)
            idx = [i for line in r.stdout.splitlines() if line.strip()
                   for i in json.loads(line)["indices"]]
            if len(idx) != n:
                raise RuntimeError("batchwire plan gave %d indices for %d samples" % (len(idx), n))
            f.write(struct.pack("<%dQ" % n, *idx))


def loader_rate(batchwire, coord, job, dataset, batch, epochs):
    """(a)'s fetch through the Python binding: the same options, timed as `batchwire fetch`
    times itself (from opening the loader to the last batch of the last epoch)."""
    t0 = time.perf_counter()
    nbytes = 0
    with batchwire.Loader(coordinator=coord, job=job, dataset=dataset, batch_size=batch,
                          rank=0, world_size=1) as lo:
        for _ in lo.epochs(epochs):
            for b in lo:
                nbytes += b.nbytes
        secs = time.perf_counter() - t0
    return nbytes / MiB / secs


# ---------------------------------------------------------------------------
# (b) batchwire.Loader vs torch DataLoader

def torch_dataloader_rate(path, batch, max_batches, workers=2):
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Npy(Dataset):
        def __init__(self, p):
            self.p = p
            self.n = np.load(p, mmap_mode="r").shape[0]
            self.a = None

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.a is None:  # opened in each worker process
                self.a = np.load(self.p, mmap_mode="r")
            return torch.from_numpy(np.array(self.a[i]))

    torch.manual_seed(0)
    t0 = time.perf_counter()
    dl = DataLoader(Npy(path), batch_size=batch, shuffle=True, num_workers=workers)
    nb = nbytes = 0
    for x in dl:
        nbytes += x.numel() * x.element_size()
        x.view(-1)[-1].item()
        nb += 1
        if nb >= max_batches:
            break
    secs = time.perf_counter() - t0
    del dl
    return nbytes / MiB / secs, nb * batch / secs


def binding_rate(batchwire, coord, job, dataset, batch, max_batches):
    t0 = time.perf_counter()
    nb = nbytes = 0
    with batchwire.Loader(coordinator=coord, job=job, dataset=dataset, batch_size=batch,
                          shuffle=True, seed=0, rank=0, world_size=1) as lo:
        for b in lo:
            x = b.torch()
            nbytes += x.numel() * x.element_size()
            x.view(-1)[-1].item()
            nb += 1
            if nb >= max_batches:
                break
    secs = time.perf_counter() - t0
    return nbytes / MiB / secs, nb * batch / secs


# ---------------------------------------------------------------------------
# (c) time to first batch after resume

def _varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def cursor_at(template, step):
    """The cursor bytes with field 7 (step) replaced: proto/jobs.proto's Cursor, in the one form
    batchwire writes and accepts (fields in number order, a zero step left out, as protobuf-c
    packs it; core/cursor/cursor.c)."""
    fields, i = [], 0
    while i < len(template):
        start = i
        key, i = _read_varint(template, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, i = _read_varint(template, i)
        elif wire == 1:
            i += 8
        elif wire == 2:
            ln, i = _read_varint(template, i)
            i += ln
        elif wire == 5:
            i += 4
        if field not in (7, 15):  # the step, and the checksum that must follow the rest
            fields.append((field, template[start:i]))
    if step:
        fields.append((7, _varint(7 << 3) + _varint(step)))
    out = bytearray(b"".join(f for _, f in sorted(fields, key=lambda x: x[0])))
    out += b"\x7d" + _crc32c(bytes(out)).to_bytes(4, "little")
    return "bwc1:" + base64.b64encode(bytes(out)).decode()


def _crc32c(data):
    """CRC-32C (Castagnoli), as the cursor's checksum field carries it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _read_varint(data, i):
    v = shift = 0
    while True:
        b = data[i]
        i += 1
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def ttfb(batchwire, coord, job, dataset, cursor, want_step):
    t0 = time.perf_counter()
    lo = batchwire.Loader(coordinator=coord, job=job, dataset=dataset, batch_size=1,
                          shuffle=True, seed=0, rank=0, world_size=1, resume=cursor)
    t1 = time.perf_counter()
    b = lo.next_batch()
    t2 = time.perf_counter()
    step = b.step
    lo.close()
    if step != want_step:
        raise RuntimeError("resumed at step %d, wanted %d" % (step, want_step))
    return t1 - t0, t2 - t1


# ---------------------------------------------------------------------------

def tls_rates(bt, tmp, root, repeat, quick, report):
    """(t) the same fetch as (a) against workers serving TLS: data channel vs gRPC."""
    pki = bt.make_pki(tmp)
    ca = ["--tls-ca", pki["ca"]]
    coord = bt.coordinator(tmp, name="coordinator-tls",
                           args=["--tls-cert", pki["server_crt"], "--tls-key", pki["server_key"],
                                 "--worker-tls-ca", pki["ca"]])
    wargs = ca + ["--tls-cert", pki["worker_crt"], "--tls-key", pki["worker_key"]]
    workers = [bt.worker(tmp, coord.addr, "t%d" % i, data_root=root, args=wargs)
               for i in range(2)]
    bt.poll(lambda: sum(w["state"] == "alive"
                        for w in bt.status_json(coord.addr, ca)["workers"]) == 2, 20,
            what="two live TLS workers")
    for sample, batch in ((64 * KiB, 64), (MiB, 16)):
        total = (64 if quick else 256) * MiB
        n = total // sample
        name = "t%d" % sample
        gen_npy(bt, root, name, n, sample)
        ds = "npy:%s/part-00000.npy" % name
        epochs = max(1, (128 * MiB if quick else 512 * MiB) // total)
        fetch_rate(bt, coord.addr, "warm-" + name, ds, batch, 1, "auto", ca)
        dc, gr = [], []
        for i in range(repeat):
            dc.append(fetch_rate(bt, coord.addr, "ta-%s-%d" % (name, i), ds, batch, epochs,
                                 "auto", ca)[0])
            gr.append(fetch_rate(bt, coord.addr, "tg-%s-%d" % (name, i), ds, batch, epochs,
                                 "grpc", ca)[0])
        row = {"sample": sample, "batch": batch, "dchan_mib_s": median(dc),
               "grpc_mib_s": median(gr), "dchan_runs": dc, "grpc_runs": gr}
        row["speedup"] = row["dchan_mib_s"] / row["grpc_mib_s"]
        report["t"].append(row)
        log("(t) TLS, %s x %d: data channel %.0f MiB/s, gRPC %.0f MiB/s, x%.2f" %
            (human(sample), batch, row["dchan_mib_s"], row["grpc_mib_s"], row["speedup"]))
        os.remove(os.path.join(root, name, "part-00000.npy"))
    for d in workers + [coord]:
        d.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"), help="build folder")
    ap.add_argument("--quick", action="store_true", help="smaller datasets, fewer repeats")
    ap.add_argument("--repeat", type=int, default=0, help="runs per figure (default 5, quick 3)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--parts", default="abct",
                    help="which measurements to run (default abct; t: with TLS)")
    ap.add_argument("--auth", action="store_true",
                    help="authentication and read grants on (with --parts a only)")
    args = ap.parse_args()
    if args.auth and args.parts != "a":
        ap.error("--auth measures part a only: give --parts a")
    repeat = args.repeat or (3 if args.quick else 5)
    build = os.path.abspath(args.build)
    os.environ.setdefault("BW_BUILD_DIR", build)
    os.environ.setdefault("BW_BIN_DIR", os.path.join(build, "bin"))
    os.environ["BATCHWIRE_LIB"] = os.path.join(build, "lib", "libbatchwire.so")
    import bwtest as bt
    import batchwire
    import torch  # noqa: F401  (imported once here, not inside the first timed run)

    tcp_bin = os.path.join(build, "bench", "bench_client_tcp")
    tmp = tempfile.mkdtemp(prefix="bench-client-")
    root = os.path.join(tmp, "data")
    os.makedirs(root)
    report = {"a": [], "b": [], "c": [], "t": [], "auth": args.auth}
    coord_args, worker_args, status_args, fetch_args = [], [], [], []
    if args.auth:  # bwtest adds the shared --grant-key
        tokens = {"admin": "bench-admin-" + os.urandom(16).hex(),
                  "trainer": "bench-trainer-" + os.urandom(16).hex(),
                  "worker": "bench-worker-" + os.urandom(16).hex()}
        principals = os.path.join(tmp, "principals")
        with open(principals, "w") as f:
            f.write("admin ops %s\ntrainer t %s\nworker storage %s ids=w*\n" %
                    (tokens["admin"], tokens["trainer"], tokens["worker"]))
        tf = {}
        for k, v in tokens.items():
            tf[k] = os.path.join(tmp, k + ".token")
            with open(tf[k], "w") as f:
                f.write(v + "\n")
            os.chmod(tf[k], 0o600)
        os.chmod(principals, 0o600)
        coord_args = ["--auth-tokens", principals]
        worker_args = coord_args + ["--token-file", tf["worker"]]
        status_args = ["--token-file", tf["admin"]]
        fetch_args = ["--token-file", tf["trainer"]]
    try:
        coord = bt.coordinator(tmp, args=coord_args)
        workers = [bt.worker(tmp, coord.addr, "w%d" % i, data_root=root, args=worker_args)
                   for i in range(2)]
        bt.poll(lambda: sum(w["state"] == "alive"
                            for w in bt.status_json(coord.addr, status_args)["workers"]) == 2,
                20, what="two live workers")
        log("cluster: coordinator %s, workers %s" % (coord.addr, [w.addr for w in workers]))
        if "t" in args.parts:
            tls_rates(bt, tmp, root, repeat, args.quick, report)

        sizes = [(s, b, (t // 4 if args.quick else t)) for s, b, t in SIZES]
        for sample, batch, total in sizes:
            n = total // sample
            name = "s%d" % sample
            gen_npy(bt, root, name, n, sample)
            path = os.path.join(root, name, "part-00000.npy")
            off = npy_header_len(path)
            ds = "npy:%s/part-00000.npy" % name
            # Enough epochs that a run moves >= 2 GiB (>= 256 MiB quick): joining the job and
            # the first batch are then a few per cent of the time, and /proc's 10 ms CPU ticks
            # under 1 % of a run's CPU (at 512 MiB, 64 KiB and 1 MiB runs took ~0.15 s: their
            # ratios moved by 0.2 between runs and the workers' CPU came in whole ticks).
            epochs = max(1, (256 * MiB if args.quick else 2048 * MiB) // total)
            fetch_runs, fetch_sps, grpc_runs, tcp_runs, tcp2_runs = [], [], [], [], []
            shuf_runs, tcp2_shuf_runs, loader_runs, tcp2b_runs, tcp2p_runs = [], [], [], [], []
            cpu = {k: [] for k in ("fetch", "tcp2", "shuffled", "tcp2_shuffled", "tcp2b",
                                   "tcp2p")}
            fetch_rate(bt, coord.addr, "warm-" + name, ds, batch, 1, extra=fetch_args)
            order = os.path.join(tmp, "order-%s" % name)
            if "a" in args.parts:
                shuffled_order(bt, order, n, batch, epochs)
            for i in range("a" in args.parts and repeat):
                mib, sps, c = fetch_cpu(bt, workers, coord.addr, "a-%s-%d" % (name, i), ds, batch,
                                        epochs, extra=fetch_args)
                fetch_runs.append(mib)
                fetch_sps.append(sps)
                cpu["fetch"].append(c)
                tcp_runs.append(tcp_rate(tcp_bin, path, off, n * sample, batch * sample, epochs))
                mib, c = tcp_cpu(tcp_bin, path, off, n * sample, batch * sample, epochs,
                                 len(workers))
                tcp2_runs.append(mib)
                cpu["tcp2"].append(c)
                mib, c = tcp_cpu(tcp_bin, path, off, n * sample, batch * sample, epochs,
                                 len(workers), buffers=2)
                tcp2b_runs.append(mib)
                cpu["tcp2b"].append(c)
                mib, c = tcp_cpu(tcp_bin, path, off, n * sample, batch * sample, epochs,
                                 len(workers), sample=sample, placement=True)
                tcp2p_runs.append(mib)
                cpu["tcp2p"].append(c)
                mib, _, _ = fetch_rate(bt, coord.addr, "g-%s-%d" % (name, i), ds, batch, epochs,
                                       "grpc", extra=fetch_args)
                grpc_runs.append(mib)
                mib, _, c = fetch_cpu(bt, workers, coord.addr, "s-%s-%d" % (name, i), ds, batch,
                                      epochs, extra=fetch_args + ["--shuffle", "--seed", 0])
                shuf_runs.append(mib)
                cpu["shuffled"].append(c)
                mib, c = tcp_cpu(tcp_bin, path, off, n * sample, batch * sample, epochs,
                                 len(workers), order, sample)
                tcp2_shuf_runs.append(mib)
                cpu["tcp2_shuffled"].append(c)
                if not args.auth:  # the binding reads no token file here
                    loader_runs.append(loader_rate(batchwire, coord.addr, "l-%s-%d" % (name, i),
                                                   ds, batch, epochs))
            if "a" in args.parts:
                row = {"sample": sample, "batch": batch, "samples": n, "epochs": epochs,
                       "fetch_mib_s": median(fetch_runs), "fetch_samples_s": median(fetch_sps),
                       "grpc_mib_s": median(grpc_runs), "tcp_mib_s": median(tcp_runs),
                       "tcp2_mib_s": median(tcp2_runs), "fetch_runs": fetch_runs,
                       "grpc_runs": grpc_runs, "tcp_runs": tcp_runs, "tcp2_runs": tcp2_runs}
                row["ratio"] = row["fetch_mib_s"] / row["tcp_mib_s"]
                row["grpc_ratio"] = row["grpc_mib_s"] / row["tcp_mib_s"]
                row["ratio2"] = row["fetch_mib_s"] / row["tcp2_mib_s"]
                row.update({"shuffled_mib_s": median(shuf_runs),
                            "tcp2_shuffled_mib_s": median(tcp2_shuf_runs),
                            "loader_mib_s": median(loader_runs), "shuffled_runs": shuf_runs,
                            "tcp2_shuffled_runs": tcp2_shuf_runs, "loader_runs": loader_runs,
                            "tcp2b_mib_s": median(tcp2b_runs), "tcp2b_runs": tcp2b_runs,
                            "tcp2p_mib_s": median(tcp2p_runs), "tcp2p_runs": tcp2p_runs})
                row["ratio2b"] = row["fetch_mib_s"] / row["tcp2b_mib_s"]
                row["ratio2p"] = row["fetch_mib_s"] / row["tcp2p_mib_s"]
                row["ratio2_shuffled"] = row["shuffled_mib_s"] / row["tcp2_shuffled_mib_s"]
                # CPU per GiB, medians: fetch (client, workers, total) and raw TCP, 2 conn.
                for k in ("fetch", "shuffled"):
                    for part in ("client", "workers", "total"):
                        row["%s_cpu_%s_ms_gib" % (k, part)] = median([c[part] for c in cpu[k]])
                for k in ("tcp2", "tcp2_shuffled", "tcp2b", "tcp2p"):
                    row["%s_cpu_ms_gib" % k] = median(cpu[k])
                row["loader_vs_fetch"] = row["loader_mib_s"] / row["fetch_mib_s"]
                report["a"].append(row)
                log("(a) %s x %d: fetch %.0f MiB/s (%.0f samples/s), fetch over gRPC %.0f MiB/s, "
                    "raw TCP %.0f MiB/s (%d connections: %.0f), ratio %.2f (gRPC %.2f; vs %d "
                    "connections %.2f)"
                    % (human(sample), batch, row["fetch_mib_s"], row["fetch_samples_s"],
                       row["grpc_mib_s"], row["tcp_mib_s"], len(workers), row["tcp2_mib_s"],
                       row["ratio"], row["grpc_ratio"], len(workers), row["ratio2"]))
                log("(a) %s x %d: raw TCP (%d connections) into 2 alternating batch buffers "
                    "%.0f MiB/s, fetch / that %.2f"
                    % (human(sample), batch, len(workers), row["tcp2b_mib_s"], row["ratio2b"]))
                log("(a) %s x %d: raw TCP (%d connections) split as placement splits the fetch "
                    "%.0f MiB/s, fetch / that %.2f"
                    % (human(sample), batch, len(workers), row["tcp2p_mib_s"], row["ratio2p"]))
                log("(a) %s x %d shuffled: fetch %.0f MiB/s, raw TCP (%d connections, the same "
                    "order) %.0f MiB/s, ratio %.2f; batchwire.Loader (plan order) %.0f MiB/s, "
                    "%.2f of fetch"
                    % (human(sample), batch, row["shuffled_mib_s"], len(workers),
                       row["tcp2_shuffled_mib_s"], row["ratio2_shuffled"], row["loader_mib_s"],
                       row["loader_vs_fetch"]))
            if os.path.exists(order):
                os.remove(order)

            # (b) the same dataset through Python: batchwire.Loader vs torch DataLoader
            max_batches = max(8, (64 * MiB if args.quick else 256 * MiB) // (batch * sample))
            max_batches = min(max_batches, n // batch)
            bw_runs, bw_sps, tl_runs, tl_sps = [], [], [], []
            for i in range("b" in args.parts and repeat):
                mib, sps = binding_rate(batchwire, coord.addr, "b-%s-%d" % (name, i), ds, batch,
                                        max_batches)
                bw_runs.append(mib)
                bw_sps.append(sps)
                mib, sps = torch_dataloader_rate(path, batch, max_batches)
                tl_runs.append(mib)
                tl_sps.append(sps)
            if "b" not in args.parts:
                os.remove(path)
                continue
            row = {"sample": sample, "batch": batch, "batches": max_batches,
                   "bw_mib_s": median(bw_runs), "bw_samples_s": median(bw_sps),
                   "torch_mib_s": median(tl_runs), "torch_samples_s": median(tl_sps),
                   "bw_runs": bw_runs, "torch_runs": tl_runs}
            row["speedup"] = row["bw_mib_s"] / row["torch_mib_s"]
            report["b"].append(row)
            log("(b) %s x %d, %d batches: batchwire.Loader %.0f MiB/s (%.0f samples/s), torch "
                "DataLoader(num_workers=2) %.0f MiB/s (%.0f samples/s), x%.2f"
                % (human(sample), batch, max_batches, row["bw_mib_s"], row["bw_samples_s"],
                   row["torch_mib_s"], row["torch_samples_s"], row["speedup"]))
            os.remove(path)  # keep the disk footprint to one dataset at a time

        # (c) time to first batch after resume
        n = 1 << 21 if "c" in args.parts else 0
        for w in workers:
            if not w.running():
                raise RuntimeError("worker %s died; log:\n%s" % (w.name, w.log_text()))
        if not n:
            return finish(report, repeat, tmp, args)
        gen_npy(bt, root, "small", n, 16)
        ds = "npy:small/part-00000.npy"
        with batchwire.Loader(coordinator=coord.addr, job="c", dataset=ds, batch_size=1,
                              shuffle=True, seed=0, rank=0, world_size=1) as lo:
            template = lo.cursor_bytes()
        ttfb(batchwire, coord.addr, "c", ds, cursor_at(template, 0), 0)  # warm
        steps = [0, 10 ** 4, 10 ** 6]
        runs = {s: [] for s in steps}
        for _ in range(repeat):
            for s in steps:
                runs[s].append(ttfb(batchwire, coord.addr, "c", ds, cursor_at(template, s), s))
        for s in steps:
            row = {"step": s, "open_ms": median([o for o, _ in runs[s]]) * 1e3,
                   "first_batch_ms": median([f for _, f in runs[s]]) * 1e3,
                   "total_ms": median([o + f for o, f in runs[s]]) * 1e3}
            report["c"].append(row)
            log("(c) resume at step %d: open %.1f ms, first batch %.2f ms, total %.1f ms"
                % (s, row["open_ms"], row["first_batch_ms"], row["total_ms"]))
        for w in workers:
            if not w.running():
                raise RuntimeError("worker %s died; log:\n%s" % (w.name, w.log_text()))
    except BaseException:
        cleanup(tmp, args)
        raise
    finish(report, repeat, tmp, args)


def cleanup(tmp, args):
    import bwtest as bt
    bt.kill_all()
    if args.keep:
        log("kept %s" % tmp)
    else:
        subprocess.run(["rm", "-rf", tmp])


def finish(report, repeat, tmp, args):
    cleanup(tmp, args)
    print(json.dumps(report))
    print_markdown(report, repeat)


def md_table(out, title, head, rows):
    """Appends a markdown table to out: its title paragraph, then a row per tuple of cells
    (strings, formatted by the caller)."""
    out.append(title)
    out.append("| " + " | ".join(head) + " |")
    out.append("|" + "---|" * len(head))
    out.extend("| " + " | ".join(cells) + " |" for cells in rows)


def print_markdown(rep, repeat):
    out = []
    med = "(median of %d)\n" % repeat

    def f(fmt, *xs):
        return tuple(fm % x for fm, x in zip(fmt.split(), xs))

    md_table(out, "(a) `batchwire fetch --quiet` vs raw TCP " + med,
             ["sample", "batch", "fetch MiB/s", "fetch samples/s", "raw TCP MiB/s",
              "fetch / TCP", "fetch --transport grpc MiB/s", "gRPC / TCP",
              "raw TCP, 2 connections MiB/s", "fetch / that"],
             [f("%s %d %.0f %.0f %.0f %.2f %.0f %.2f %.0f %.2f", human(r["sample"]), r["batch"],
                r["fetch_mib_s"], r["fetch_samples_s"], r["tcp_mib_s"], r["ratio"],
                r["grpc_mib_s"], r["grpc_ratio"], r["tcp2_mib_s"], r["ratio2"])
              for r in rep["a"]])
    md_table(out, "\n(a) shuffled (--shuffle --seed 0) against raw TCP over 2 connections "
             "sending the same samples in the same order; and batchwire.Loader against "
             "`batchwire fetch`, plan order " + med,
             ["sample", "batch", "fetch shuffled MiB/s", "raw TCP shuffled, 2 connections MiB/s",
              "fetch / that", "Loader MiB/s", "Loader / fetch"],
             [f("%s %d %.0f %.0f %.2f %.0f %.2f", human(r["sample"]), r["batch"],
                r["shuffled_mib_s"], r["tcp2_shuffled_mib_s"], r["ratio2_shuffled"],
                r["loader_mib_s"], r["loader_vs_fetch"]) for r in rep["a"]])
    md_table(out, "\n(a) plan order against raw TCP over 2 connections that receives batch k "
             "into buffer k mod 2 (as a loader handing the trainer one batch while the next "
             "arrives) instead of one buffer " + med,
             ["sample", "batch", "fetch MiB/s", "raw TCP, 1 buffer MiB/s", "fetch / that",
              "raw TCP, 2 buffers MiB/s", "fetch / that", "CPU ms/GiB: 1 buffer", "2 buffers"],
             [f("%s %d %.0f %.0f %.2f %.0f %.2f %.0f %.0f", human(r["sample"]), r["batch"],
                r["fetch_mib_s"], r["tcp2_mib_s"], r["ratio2"], r["tcp2b_mib_s"], r["ratio2b"],
                r["tcp2_cpu_ms_gib"], r["tcp2b_cpu_ms_gib"]) for r in rep["a"]])
    md_table(out, "\n(a) plan order against raw TCP over 2 connections that each carry the "
             "samples the placement gives their worker (the loader's blocks of neighbouring "
             "samples over 256 shards, rendezvous owners w0, w1): each worker's runs of a "
             "batch's samples gathered on one end and scattered on the other " + med,
             ["sample", "batch", "fetch MiB/s", "raw TCP, 2 connections MiB/s", "fetch / that",
              "raw TCP, the placement's split MiB/s", "fetch / that", "CPU ms/GiB: split"],
             [f("%s %d %.0f %.0f %.2f %.0f %.2f %.0f", human(r["sample"]), r["batch"],
                r["fetch_mib_s"], r["tcp2_mib_s"], r["ratio2"], r["tcp2p_mib_s"], r["ratio2p"],
                r["tcp2p_cpu_ms_gib"]) for r in rep["a"]])
    cpu_rows = []
    for r in rep["a"]:
        for order, k, t in (("plan", "fetch", "tcp2"), ("shuffled", "shuffled", "tcp2_shuffled")):
            tot = r["%s_cpu_total_ms_gib" % k]
            cpu_rows.append(f("%s %s %.0f %.0f %.0f %.0f %.2f", human(r["sample"]), order,
                              r["%s_cpu_client_ms_gib" % k], r["%s_cpu_workers_ms_gib" % k], tot,
                              r["%s_cpu_ms_gib" % t], r["%s_cpu_ms_gib" % t] / tot))
    md_table(out, "\n(a) CPU per GiB moved, ms " + med.rstrip("\n") + ": `batchwire fetch` (the "
             "fetch process + both workers) against raw TCP over 2 connections (both ends)\n",
             ["sample", "order", "fetch: client", "workers", "total", "raw TCP, 2 conn.",
              "raw TCP / fetch"], cpu_rows)
    md_table(out, "\n(b) Python: batchwire.Loader + batch.torch() vs torch "
             "DataLoader(num_workers=2) " + med,
             ["sample", "batch", "batches", "batchwire MiB/s", "samples/s", "DataLoader MiB/s",
              "samples/s", "speed-up"],
             [f("%s %d %d %.0f %.0f %.0f %.0f %.2f", human(r["sample"]), r["batch"],
                r["batches"], r["bw_mib_s"], r["bw_samples_s"], r["torch_mib_s"],
                r["torch_samples_s"], r["speedup"]) for r in rep["b"]])
    md_table(out, "\n(t) the same fetch against workers serving TLS " + med,
             ["sample", "batch", "data channel (TLS) MiB/s", "gRPC (TLS) MiB/s", "speed-up"],
             [f("%s %d %.0f %.0f %.2f", human(r["sample"]), r["batch"], r["dchan_mib_s"],
                r["grpc_mib_s"], r["speedup"]) for r in rep["t"]])
    md_table(out, "\n(c) time to first batch after resume " + med,
             ["step", "Loader(resume=...)", "first batch", "total"],
             [("{:,}".format(r["step"]), "%.1f ms" % r["open_ms"],
               "%.2f ms" % r["first_batch_ms"], "%.1f ms" % r["total_ms"]) for r in rep["c"]])
    print("\n".join(out))


if __name__ == "__main__":
    main()
