"""slurm/batchwire.sbatch on a real single-node Slurm: exact resume across requeues.

A Slurm cluster (slurmctld, slurmd, munge) is configured from scratch in a temporary
directory (tests/slurm/slurmcluster.py). A regression dataset is written with
examples/ddp_make_data.py, and examples/ddp_train.py trains on it with PyTorch DDP (gloo, 2
tasks) through the batchwire launcher, which starts a coordinator and a worker on free ports
with authentication on.

* Reference: one job runs the 3 epochs uninterrupted.
* Interrupted: the same job, stopped twice mid-epoch and requeued each time:
  1. `scancel --batch --signal=USR1` in epoch 0 -- exactly what `#SBATCH --signal=B:USR1@120`
     delivers before the time limit: the trainers checkpoint at the step they reached, the
     daemons get SIGTERM, and the script requeues the job itself;
  2. `scontrol requeue` in epoch 1 -- Slurm itself stops every step (SIGTERM, then SIGKILL
     after KillWait) and requeues it; the trainers resume from the checkpoint they wrote on
     SIGTERM or, if they were stopped first, from their last periodic one.
  After each, the job resumes: the coordinator on the same state directory, the trainers
  from their checkpoint.
* The final parameters of both jobs are bit-identical; each stop was mid-epoch on both
  ranks; every daemon of every run logged SIGTERM and stopped (none was killed); the tokens
  were 0600 in a 0700 directory; the restarted coordinators found the journaled job. This
  job runs with BW_BIND=@lo and BW_METRICS_PORT=0: the daemons bind and advertise lo's
  address on free ports and serve metrics.
* A third job is stopped with `scancel --batch --signal=TERM` (a graceful cancel): the
  trainers checkpoint mid-epoch, the daemons stop, the job ends with status 143 and is not
  requeued.
"""

import glob
import os
import re
import stat
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

import bwpy  # noqa: E402
import bwtest as bt  # noqa: E402
import slurmcluster  # noqa: E402

ROWS = 32000     # 2 ranks x 16 = 32 rows a step: 1000 steps an epoch, a few seconds
BATCH = 16
EPOCHS = 2
STEPS_PER_EPOCH = ROWS // (2 * BATCH)


def trainer_argv(tmpdir, name):
    argv = []
    flags = bwpy.sanitize_flags()
    if "address" in flags:  # the trainer loads an ASan libbatchwire into Python
        rt = bt.run(["gcc", "-print-file-name=libasan.so"]).stdout.strip()
        # libstdc++ too: ASan finds the C++ runtime's __cxa_throw when it starts, and torch's
        # threads throw (at exit) although python itself does not link libstdc++.
        cxx = bt.run(["gcc", "-print-file-name=libstdc++.so.6"]).stdout.strip()
        argv = ["env", "LD_PRELOAD=%s %s" % (rt, cxx), "ASAN_OPTIONS=detect_leaks=0"]
    return argv + [
        "/usr/bin/python3", os.path.join(bt.SOURCE_DIR, "examples", "ddp_train.py"),
        "--dataset", "npy:regress/*.npy", "--epochs", EPOCHS, "--batch-size", BATCH,
        "--checkpoint-every", 100, "--log-every", 10, "--hidden", 32,
        "--out", os.path.join(tmpdir, name + ".final.pt")]


def submit(sc, tmpdir, name, **settings):
    data_root = os.path.join(tmpdir, "data")
    env = {"BW_BIN": bt.BIN_DIR, "BW_PYTHON": "/usr/bin/python3",
           "PYTHONPATH": os.path.join(bt.SOURCE_DIR, "python"),
           "BATCHWIRE_LIB": bwpy.lib_path(), "OMP_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.update(settings)
    return sc.sbatch(["-N1", "-n2", "-J", name, "-o", os.path.join(tmpdir, name + ".out"),
                      os.path.join(bt.SOURCE_DIR, "slurm", "batchwire.sbatch"), data_root] +
                     trainer_argv(tmpdir, name), cwd=tmpdir, env=env)


def output(tmpdir, name):
    try:
        with open(os.path.join(tmpdir, name + ".out"), errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def global_step(tmpdir, name):
    steps = re.findall(r"global_step (\d+)", output(tmpdir, name))
    return int(steps[-1]) if steps else 0


def wait_step(sc, tmpdir, name, job, step, what):
    """Waits until the job's trainer logged global step `step`; on a timeout, says where the
    job is and what it printed last."""
    try:
        bt.poll(lambda: global_step(tmpdir, name) >= step, 90, what=what)
    except bt.TestFailure as e:
        j = sc.job(job)
        raise bt.TestFailure("%s; job %s is %s (%s), restarts %s; its output ends:\n%s" %
                             (e, job, j.get("JobState"), j.get("Reason"), j.get("Restarts"),
                              output(tmpdir, name)[-3000:]))


def checkpoint(run_dir):
    import torch
    return torch.load(os.path.join(run_dir, "ddp_checkpoint.pt"), weights_only=False)


def check_mid_epoch(ckpt, epoch, what):
    pos = [(d["epoch"], d["step"]) for d in ckpt["data"]]
    bt.check(all(e == epoch and 0 < s < STEPS_PER_EPOCH for e, s in pos) and
             len(set(pos)) == 1,
             "%s: both ranks checkpointed mid-epoch %d at the same step: %s (global step %d)" %
             (what, epoch, pos, ckpt["global_step"]))


def check_daemons_stopped(run_dir, restart):
    for log in sorted(glob.glob(os.path.join(run_dir, "logs", "*.%d.log" % restart))):
        with open(log, errors="replace") as f:
            text = f.read()
        lines = text.strip().splitlines()
        bt.check("received SIGTERM; shutting down" in text and lines and
                 lines[-1].endswith("stopped"),
                 "run %d: %s got SIGTERM and stopped" % (restart, os.path.basename(log)),
                 "\n".join(lines[-15:]))


def test(tmpdir):
    why = slurmcluster.missing()
    if why:
        print("SKIP: a real Slurm cluster %s" % why, flush=True)
        sys.exit(77)
    import torch

    r = bt.run([str(a) for a in ["/usr/bin/python3", os.path.join(bt.SOURCE_DIR, "examples", "ddp_make_data.py"),
                "--out", os.path.join(tmpdir, "data", "regress"), "--rows", ROWS,
                "--features", 8, "--files", 2]], timeout=60)
    bt.check(r.returncode == 0, "examples/ddp_make_data.py wrote the dataset", r.stderr)

    with slurmcluster.SlurmCluster(tmpdir) as sc:
        bt.ok("a Slurm cluster is up (slurmctld, slurmd, munged in %s)" % sc.dir)

        ref = submit(sc, tmpdir, "ref")
        j = sc.wait_state(ref, "COMPLETED", 120)
        bt.check(j["Restarts"] == "0", "the reference job completed without a restart")
        ref_out = output(tmpdir, "ref")
        bt.check_in("done: %d epochs, global step %d" % (EPOCHS, EPOCHS * STEPS_PER_EPOCH), ref_out,
                    "the reference trained every step")

        # The interrupted job also binds an interface's address and serves metrics.
        job = submit(sc, tmpdir, "int", BW_BIND="@lo", BW_METRICS_PORT="0")
        run_dir = os.path.join(tmpdir, "batchwire-%s" % job)
        # 1. The time-limit warning (--signal=B:USR1@...), delivered now, in epoch 0.
        wait_step(sc, tmpdir, "int", job, STEPS_PER_EPOCH // 3,
                  "the job to train a third of epoch 0")
        sc.cmd("scancel", "--batch", "--signal=USR1", job)
        sc.wait_state(job, "PENDING", 60, restarts=1)
        out = output(tmpdir, "int")
        bt.check(re.search(r"coordinator listening on 127\.0\.0\.1:\d+ .*reached as "
                           r"127\.0\.0\.1:\d+", out) and
                 re.search(r"worker-\S+\s+127\.0\.0\.1:\d+\s+127\.0\.0\.1:\d+\s+alive", out) and
                 len(re.findall(r"metrics on http://127\.0\.0\.1:\d+/metrics", out)) == 2,
                 "BW_BIND=@lo: both daemons bound and advertised lo's address on free "
                 "ports, with metrics", out[:3000])
        bt.check_in("stopped (SIGUSR1)", out, "the trainers stopped on the launcher's SIGUSR1")
        bt.check_in("requeueing job %s" % job, out, "the launcher requeued the job itself")
        check_mid_epoch(checkpoint(run_dir), 0, "after SIGUSR1")
        check_daemons_stopped(run_dir, 0)
        with open(os.path.join(run_dir, "logs", "coordinator.0.log")) as f:
            coord_log = f.read()
        bt.check(re.search(r"commit channel on 127\.0\.0\.1:\d+", coord_log),
                 "the coordinator served the trainers' commit channel (BW_COMMIT_PORT's default)",
                 coord_log[:2000])
        auth = os.path.join(run_dir, "auth")
        bt.check(stat.S_IMODE(os.stat(auth).st_mode) == 0o700 and
                 all(stat.S_IMODE(os.stat(p).st_mode) == 0o600
                     for p in glob.glob(os.path.join(auth, "*"))) and
                 sorted(os.listdir(auth)) == ["admin.token", "grant.key", "tokens",
                                              "trainer.token", "worker.token"],
                 "the job's tokens and grant key are 0600 files in a 0700 directory",
                 sorted(os.listdir(auth)))
        sc.release_now(job)

        # 2. Requeued by Slurm itself in epoch 1 (SIGTERM to every step, like scancel).
        first = STEPS_PER_EPOCH + STEPS_PER_EPOCH // 3
        wait_step(sc, tmpdir, "int", job, first, "the resumed job to train a third of epoch 1")
        sc.cmd("scontrol", "requeue", job)
        sc.wait_state(job, "PENDING", 60, restarts=2)
        # Slurm sends SIGTERM to every step at once, the daemons' too: the trainers stop with
        # a checkpoint when they can finish the step in progress before the workers are gone,
        # else the next run resumes from their last periodic checkpoint. Both are exact.
        stops = re.findall(r"rank (\d): stopped \((SIG\w+)\)", output(tmpdir, "int"))[2:]
        bt.log("on scontrol requeue the trainers %s" %
               ("stopped with a checkpoint: %s" % stops if stops else
                "were stopped before they could checkpoint"))
        check_mid_epoch(checkpoint(run_dir), 1, "after scontrol requeue")
        check_daemons_stopped(run_dir, 1)
        sc.release_now(job)

        j = sc.wait_state(job, "COMPLETED", 120, restarts=2)
        out = output(tmpdir, "int")
        check_daemons_stopped(run_dir, 2)
        for restart in (1, 2):
            with open(os.path.join(run_dir, "logs", "coordinator.%d.log" % restart)) as f:
                text = f.read()
            m = re.search(r"state: .*; last record (\d+)", text)
            bt.check(m and int(m.group(1)) > 0,
                     "run %d: the coordinator found the job's state in the state directory "
                     "(%s)" % (restart, m and m.group(0)), text[:2000])
            bt.check_in("auth: on", text, "run %d: the coordinator ran with tokens" % restart)
        bt.check_in("done: %d epochs, global step %d" % (EPOCHS, EPOCHS * STEPS_PER_EPOCH), out,
                    "the requeued job finished every step")

        # A graceful cancel without requeue: what the time limit does with BW_REQUEUE=0.
        job = submit(sc, tmpdir, "cancel")
        run_dir = os.path.join(tmpdir, "batchwire-%s" % job)
        wait_step(sc, tmpdir, "cancel", job, STEPS_PER_EPOCH // 3,
                  "the third job to train a third of epoch 0")
        sc.cmd("scancel", "--batch", "--signal=TERM", job)
        j = sc.wait_state(job, ("FAILED", "COMPLETED"), 60)
        out = output(tmpdir, "cancel")
        bt.check(j["JobState"] == "FAILED" and j["ExitCode"] == "143:0" and
                 j["Restarts"] == "0" and out.count("stopped (SIGUSR1)") == 2 and
                 "requeueing" not in out,
                 "scancel --batch --signal=TERM: both trainers checkpointed, the job ended "
                 "with status 143 and was not requeued (%s %s)" % (j["JobState"], j["ExitCode"]),
                 out[-3000:])
        check_mid_epoch(checkpoint(run_dir), 0, "after scancel --batch --signal=TERM")
        check_daemons_stopped(run_dir, 0)

    a = torch.load(os.path.join(tmpdir, "ref.final.pt"), weights_only=True)
    b = torch.load(os.path.join(tmpdir, "int.final.pt"), weights_only=True)
    bt.check(list(a) == list(b) and
             all(a[k].numpy().tobytes() == b[k].numpy().tobytes() for k in a),
             "final parameters after two requeues are bit-identical to the uninterrupted "
             "run's (%d tensors, %d values)" % (len(a), sum(t.numel() for t in a.values())),
             {k: (a[k] - b[k]).abs().max().item() for k in a})


if __name__ == "__main__":
    bt.main(test, timeout=300)
