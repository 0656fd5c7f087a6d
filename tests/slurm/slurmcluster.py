"""A real single-node Slurm cluster in a temporary directory, for tests (not a test itself).

Debian's slurm-wlm (slurmctld, slurmd, the client commands) and munge, configured from
scratch: munged runs as user munge with its own key and socket, slurmctld and slurmd run as
root with every file (state, spool, logs, pid files) under the directory and free ports,
proctrack/linuxproc and task/none (no cgroups), no accounting. Clients find the cluster
through SLURM_CONF (env()). Only one slurmd can run on a host, so a cluster holds a host-wide
lock (/tmp/batchwire-slurm-test.lock) while it runs.

Usage:
    with SlurmCluster(tmpdir) as sc:
        job = sc.sbatch(["-n2", script, ...], cwd=...)
        sc.wait_state(job, "COMPLETED")
"""

import fcntl
import os
import pwd
import re
import shutil
import socket
import subprocess
import time

import bwtest as bt

LOCK = "/tmp/batchwire-slurm-test.lock"
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel",
            "sinfo")


def missing():
    """Why a Slurm cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (slurmd and munged run as root and as user munge)"
    paths = {p: shutil.which(p, path="/usr/sbin:/usr/bin:" + os.environ.get("PATH", ""))
             for p in PROGRAMS}
    lost = [p for p, w in paths.items() if w is None]
    if lost:
        return "not installed: %s (Debian: slurmctld slurmd slurm-client munge)" % " ".join(lost)
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no user munge (Debian's munge package creates it)"
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, tmpdir, cpus=4, kill_wait=10):
        self.dir = os.path.join(tmpdir, "slurm")
        self.cpus = cpus
        self.kill_wait = kill_wait
        self.node = socket.gethostname().split(".")[0]
        self.conf = os.path.join(self.dir, "slurm.conf")
        self._lock = None
        self._daemons = []

    # ---- lifetime

    def __enter__(self):
        self._lock = open(LOCK, "w")
        t0 = time.monotonic()
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # another test's cluster: wait for it
        if time.monotonic() - t0 > 1:
            bt.log("waited %.1fs for another Slurm test cluster" % (time.monotonic() - t0))
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        try:
            if os.path.exists(self.conf):
                self._cancel_all()
        finally:
            for d in reversed(self._daemons):
                d.stop(timeout=15)
            if self._lock is not None:
                self._lock.close()
        return False

    def _start(self):
        d = self.dir
        munge = pwd.getpwnam("munge")
        # munged wants its socket directory executable by all and owned by itself, and
        # every directory above it traversable.
        os.makedirs(os.path.join(d, "munge"))
        for p in (os.path.dirname(d), d):
            os.chmod(p, 0o755)
        md = os.path.join(d, "munge")
        os.chown(md, munge.pw_uid, munge.pw_gid)
        os.chmod(md, 0o711)
        key = os.path.join(md, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chown(key, munge.pw_uid, munge.pw_gid)
        os.chmod(key, 0o600)
        self.munge_socket = os.path.join(md, "munge.socket")
        self._daemons.append(bt.Daemon("munged", [
            "runuser", "-u", "munge", "--", "munged", "-F", "--socket=" + self.munge_socket,
            "--key-file=" + key, "--pid-file=" + os.path.join(md, "munged.pid"),
            "--log-file=" + os.path.join(md, "munged.log"),
            "--seed-file=" + os.path.join(md, "munged.seed")], d))
        bt.poll(lambda: os.path.exists(self.munge_socket), 10, what="munged's socket")
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(d, sub))
        with open(self.conf, "w") as f:
            f.write(self._config())
        env = self.env()
        self._daemons.append(bt.Daemon("slurmctld", ["slurmctld", "-D", "-f", self.conf], d,
                                       env=env))
        self._daemons.append(bt.Daemon("slurmd", ["slurmd", "-D", "-f", self.conf], d,
                                       env=env))
        bt.poll(lambda: self._sinfo() == "idle", 30, interval=0.2,
                what="the Slurm node to be idle (sinfo)")

    def _config(self):
        d = self.dir
        return "\n".join([
            "ClusterName=bwtest",
            "SlurmctldHost=%s(127.0.0.1)" % self.node,
            "SlurmUser=root",
            "SlurmdUser=root",
            "SlurmctldPort=%d" % _free_port(),
            "SlurmdPort=%d" % _free_port(),
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket=%s" % self.munge_socket,
            "StateSaveLocation=%s/state" % d,
            "SlurmdSpoolDir=%s/spool" % d,
            "SlurmctldPidFile=%s/slurmctld.pid" % d,
            "SlurmdPidFile=%s/slurmd.pid" % d,
            "SlurmctldLogFile=%s/slurmctld.log" % d,
            "SlurmdLogFile=%s/slurmd.log" % d,
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "MailProg=/bin/true",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            "KillWait=%d" % self.kill_wait,
            "MinJobAge=3600",
            "NodeName=%s NodeAddr=127.0.0.1 CPUs=%d State=UNKNOWN" % (self.node, self.cpus),
            "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            ""])

    # ---- clients

    def env(self, extra=None):
        e = {"SLURM_CONF": self.conf, "PATH": "/usr/sbin:/usr/bin:/bin:" +
             os.environ.get("PATH", "")}
        e.update(extra or {})
        return e

    def cmd(self, *argv, timeout=30, env=None):
        r = bt.run([str(a) for a in argv], env=self.env(env), timeout=timeout)
        if r.returncode != 0:
            raise bt.TestFailure("%s failed (%d): %s%s" % (" ".join(map(str, argv)),
                                                            r.returncode, r.stdout, r.stderr))
        return r.stdout

    def _sinfo(self):
        r = bt.run(["sinfo", "-h", "-o", "%T"], env=self.env(), timeout=10)
        return r.stdout.strip() if r.returncode == 0 else None

    def sbatch(self, args, cwd, env=None):
        """Submits; returns the job id."""
        p = subprocess.run(["sbatch", "--parsable"] + [str(a) for a in args], cwd=cwd,
                           env=bt.child_env(self.env(env)), capture_output=True, text=True,
                           timeout=30)
        if p.returncode != 0:
            raise bt.TestFailure("sbatch %s failed: %s%s" % (args, p.stdout, p.stderr))
        return p.stdout.strip().split(";")[0]

    def job(self, job_id):
        """scontrol show job as a dict (JobState, Restarts, ExitCode, ...)."""
        out = self.cmd("scontrol", "show", "job", "-o", job_id)
        return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", out))

    def wait_state(self, job_id, states, timeout, restarts=None):
        states = (states,) if isinstance(states, str) else tuple(states)

        def reached():
            j = self.job(job_id)
            if restarts is not None and int(j.get("Restarts", 0)) < restarts:
                return None
            if j["JobState"] in states:
                return j
            if j["JobState"] in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                                 "BOOT_FAIL", "DEADLINE") and j["JobState"] not in states:
                raise bt.TestFailure("job %s ended %s (ExitCode %s)" %
                                     (job_id, j["JobState"], j.get("ExitCode")))
            return None
        return bt.poll(reached, timeout, interval=0.2,
                       what="job %s to be %s" % (job_id, "/".join(states)))

    def release_now(self, job_id, timeout=60):
        """A requeued job waits about two minutes (its begin time) before it may start again;
        release it, as an operator can, until it runs. Not at once: a run launched within the
        second its predecessor's credential was revoked is refused by slurmd ("Job credential
        revoked"), so 2 s after the requeue; and with StartTime=now, whose update also makes
        the scheduler run (a begin time merely passing waits for its next periodic pass).
        Slurm sets the begin time when the requeued run has ended, which may come after an
        update: then it is updated again."""
        held_since = {}

        def running():
            j = self.job(job_id)
            if j["JobState"] == "RUNNING":
                return j
            if j["JobState"] == "PENDING" and j.get("Reason") == "BeginTime":
                eligible = time.mktime(time.strptime(j["EligibleTime"], "%Y-%m-%dT%H:%M:%S"))
                t0 = held_since.setdefault("t", time.monotonic())
                if eligible > time.time() + 10 and time.monotonic() - t0 >= 2:
                    self.cmd("scontrol", "update", "JobId=%s" % job_id, "StartTime=now")
            return None
        return bt.poll(running, timeout, interval=0.3, what="requeued job %s to run" % job_id)

    def _cancel_all(self):
        r = bt.run(["squeue", "-h", "-o", "%i"], env=self.env(), timeout=10)
        jobs = r.stdout.split() if r.returncode == 0 else []
        if not jobs:
            return
        bt.run(["scancel"] + jobs, env=self.env(), timeout=10)

        def gone():
            q = bt.run(["squeue", "-h", "-o", "%i"], env=self.env(), timeout=10)
            return q.returncode != 0 or not q.stdout.strip()
        try:
            bt.poll(gone, self.kill_wait + 15, interval=0.3, what="the test's jobs to end")
        except bt.TestFailure as e:
            bt.log("warning: %s" % e)

