#!/usr/bin/python3
"""Transforms on the workers against a DataLoader (issue 28, item 5; docs/performance.md,
"Transforms on the workers against a DataLoader"): the same JPEG files, the same transform,
two ways of getting [B, 3, 224, 224] float32 tensors into a trainer process.

* batchwire: a coordinator and two workers it starts (`--transform-threads 1` each, so the
  workers use two cores as the DataLoader's two processes do), serving a Python
  `Loader(transform="decode|random_resized_crop(224)|flip(0.5)|normalize(...)|chw")`; the
  trainer takes each batch as a torch tensor (`Batch.torch()`).
* DataLoader: `torch.utils.data.DataLoader(num_workers=2)` over a Dataset whose
  `__getitem__` is `Image.open(f).convert("RGB")` then torchvision's RandomResizedCrop(224),
  RandomHorizontalFlip(), ToTensor(), Normalize(ImageNet mean, std), collated in the worker
  processes (the default collate).

Each trainer is a child process of its own that reads one epoch of every image and reads
one value of each batch (`x[0, 0, 0, 0].item()`; with --consume sum, `x.sum()`, which reads
every byte as a copy to a GPU would): what it costs is the delivery, not a model. Reported
per way, the median over --rounds rounds (the two ways interleaved, their
order alternating, after one unmeasured warm-up run of each): images/s delivered to the
trainer (from the first batch asked for to the last received), the trainer process's CPU
seconds per 1,000 images (getrusage RUSAGE_SELF: every thread of it, also the Loader's
network threads), and the CPU of the processes doing the work: the DataLoader's worker
processes (RUSAGE_CHILDREN once they are joined) or the two batchwire workers (the
/proc/PID/stat difference around the run), with the totals.

Usage (after the README's build):
    /usr/bin/python3 bench/bench_transform_dataloader.py [--build build] [--images 2000]
        [--rounds 5] [--batch 64]
"""

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import bench_client as bc  # noqa: E402  (getrusage and /proc/PID/stat CPU, medians)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SPEC = "decode|random_resized_crop(224)|flip(0.5)|normalize(%s;%s)|chw" % (
    ",".join(map(str, MEAN)), ",".join(map(str, STD)))


def self_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---- the trainers (child processes) ----

def consume(batches, how):
    """Takes every batch and reads one value of it or all; returns (images, seconds, shape)."""
    n, shape = 0, None
    t0 = time.perf_counter()
    for x in batches:
        (x[0, 0, 0, 0] if how == "one" else x.sum()).item()
        n += x.shape[0]
        shape = tuple(x.shape)
    return n, time.perf_counter() - t0, shape


def child_batchwire(a):
    os.environ["BATCHWIRE_LIB"] = os.path.join(a.build, "lib", "libbatchwire.so")
    sys.path.insert(0, os.path.join(SRC, "python"))
    import torch
    torch.set_num_threads(1)
    import batchwire
    cpu0 = self_cpu()
    with batchwire.Loader(coordinator=a.coordinator, job=a.job, dataset="files:imgs/samples",
                          batch_size=a.batch, rank=0, world_size=1, job_epochs=1,
                          transform=SPEC) as loader:
        n, secs, shape = consume((b.torch() for b in loader), a.consume)
    return {"images": n, "seconds": secs, "trainer_cpu": self_cpu() - cpu0, "shape": shape}


def child_dataloader(a):
    import torch
    from PIL import Image
    from torchvision import transforms as T
    torch.set_num_threads(1)
    files = sorted(os.path.join(a.images_dir, f) for f in os.listdir(a.images_dir))
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(MEAN, STD)])

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            with open(files[i], "rb") as f:
                return tf(Image.open(f).convert("RGB"))

    cpu0, kids0 = self_cpu(), bc.children_cpu()
    dl = torch.utils.data.DataLoader(Files(), batch_size=a.batch, num_workers=2)
    it = iter(dl)
    n, secs, shape = consume(it, a.consume)
    cpu = self_cpu() - cpu0
    it._shutdown_workers()  # joins them: their CPU is in RUSAGE_CHILDREN from here
    return {"images": n, "seconds": secs, "trainer_cpu": cpu,
            "workers_cpu": bc.children_cpu() - kids0, "shape": shape}


# ---- the driver ----

def run_child(a, way, job, images_dir, coord, worker_pids):
    argv = [sys.executable, os.path.abspath(__file__), "--child", way, "--build", a.build,
            "--batch", str(a.batch), "--job", job, "--images-dir", images_dir,
            "--coordinator", coord, "--consume", a.consume]
    prof = None
    if a.perf and way == "batchwire":  # the last round's profiles are kept
        prof = subprocess.Popen(["perf", "record", "-q", "-F", "499", "-g", "-o",
                                 os.path.join(a.perf, "worker.data"), "-p",
                                 str(worker_pids[0])], stdout=subprocess.DEVNULL)
        argv = ["perf", "record", "-q", "-F", "499", "-g", "-o",
                os.path.join(a.perf, "trainer.data"), "--"] + argv
    w0 = bc.procs_cpu(worker_pids)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if prof:
        prof.send_signal(signal.SIGINT)
        prof.wait(timeout=60)
    if r.returncode != 0:
        raise RuntimeError("%s trainer failed:\n%s%s" % (way, r.stdout, r.stderr))
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if way == "batchwire":
        out["workers_cpu"] = bc.procs_cpu(worker_pids) - w0
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(SRC, "build"), help="build folder")
    ap.add_argument("--images", type=int, default=2000, help="JPEG files (default 2000)")
    ap.add_argument("--rounds", type=int, default=5, help="measured rounds (default 5)")
    ap.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    ap.add_argument("--image-min", type=int, default=160, help="least side (default 160)")
    ap.add_argument("--image-max", type=int, default=640, help="greatest side (default 640)")
    ap.add_argument("--consume", choices=("one", "sum"), default="one",
                    help="what the trainer does with a batch: read one value (default), or sum "
                    "it (reading every byte, as a copy to a GPU would)")
    ap.add_argument("--perf", metavar="DIR", help="record perf profiles of the batchwire "
                    "trainer and of one worker into DIR (trainer.data, worker.data)")
    ap.add_argument("--child", choices=("batchwire", "dataloader"), help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--images-dir", help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.build = os.path.abspath(a.build)
    if a.child:
        out = (child_batchwire if a.child == "batchwire" else child_dataloader)(a)
        print(json.dumps(out))
        return 0

    os.environ["BW_BUILD_DIR"] = a.build
    sys.path.insert(0, os.path.join(SRC, "tests", "integration"))
    import bwpy
    import bwtest as bt

    tmp = tempfile.mkdtemp(prefix="bench-tfdl-")
    root = os.path.join(tmp, "data")
    images_dir = os.path.join(root, "imgs", "samples")
    os.makedirs(root)
    try:
        r = bt.cli("gen", "--format", "jpeg", "--out", os.path.join(root, "imgs"),
                   "--num-samples", a.images, "--seed", 1, "--image-min", a.image_min,
                   "--image-max", a.image_max, timeout=600)
        if r.returncode != 0:
            raise RuntimeError("batchwire gen failed: %s" % r.stderr)
        nbytes = sum(os.path.getsize(os.path.join(images_dir, f))
                     for f in os.listdir(images_dir))
        coord, workers = bwpy.cluster(tmp, root, 2, worker_args=("--transform-threads", 1))
        pids = [w.pid for w in workers]
        ways = ("batchwire", "dataloader")
        res = {w: [] for w in ways}
        for k in range(a.rounds + 1):  # round 0: warm-up (page cache, first connections)
            for way in (ways if k % 2 == 0 else ways[::-1]):
                o = run_child(a, way, "tfdl-%d" % k, images_dir, coord.addr, pids)
                if o["images"] != a.images or o["shape"][1:] != [3, 224, 224]:
                    raise RuntimeError("%s delivered %s" % (way, o))
                o["round"] = k
                print(json.dumps({"way": way, **o}), file=sys.stderr, flush=True)
                if k:
                    res[way].append(o)
        summary = {"images": a.images, "jpeg_bytes": nbytes, "batch": a.batch,
                   "consume": a.consume,
                   "rounds": a.rounds, "spec": SPEC}
        for way in ways:
            rs = res[way]
            per_k = 1000.0 / a.images
            def med(f):
                return bc.median([f(o) for o in rs])

            row = {"images_per_s": round(med(lambda o: o["images"] / o["seconds"]), 1),
                   "trainer_cpu_s_per_1k": round(med(lambda o: o["trainer_cpu"]) * per_k, 3),
                   "workers_cpu_s_per_1k": round(med(lambda o: o["workers_cpu"]) * per_k, 3),
                   "total_cpu_s_per_1k": round(med(lambda o: o["trainer_cpu"] +
                                                   o["workers_cpu"]) * per_k, 3)}
            summary[way] = row
        bwr, dlr = summary["batchwire"], summary["dataloader"]
        summary["trainer_cpu_ratio"] = round(dlr["trainer_cpu_s_per_1k"] /
                                             bwr["trainer_cpu_s_per_1k"], 2)
        summary["rate_ratio"] = round(bwr["images_per_s"] / dlr["images_per_s"], 3)
        print(json.dumps(summary), flush=True)
    finally:
        bt.kill_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
