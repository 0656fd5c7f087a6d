"""The fault harness: a batchwire cluster spread over network namespaces, and faults on it.
(Not a test itself; test_faults.py runs the scenarios.)

Topology (one `Net`): a "switch" namespace holding a bridge `br0`, and one namespace per host
-- `coord`, `w1`..`w3`, `t0`..`t3` -- each with one interface `eth0`, a veth created directly
inside the two namespaces (`ip -n HOST link add eth0 type veth peer name pHOST netns SWITCH`),
so nothing appears in the root namespace. Hosts have addresses in 10.231.0.0/24 on that
bridge only. Every daemon and every client runs inside its host's namespace: in the root
namespace of these machines a TCP connect to any address "succeeds" (a sandbox proxy
answers), so a dead or cut-off host can only be observed from inside a test namespace.

Faults (all applied in the switch namespace or to processes this harness started):
  net.partition(host) / net.heal(host)   nft bridge-family drop of every frame to or from the
                                         host's switch port (a silent partition: no RST, no
                                         ICMP; the peers see timeouts)
  net.partition_for(host, seconds)       the same, healed after `seconds` (blocks); returns
                                         (t_start, t_end) in time.monotonic()
  net.loss(percent) / net.loss_off()     random loss of `percent` % of the frames crossing the
                                         bridge (`numgen random mod 100 < P drop`), every host
  net.link(host, up)                     the host's own eth0 down/up (ENETUNREACH at once)
  FaultCluster.kill9(name), .pause(name), .resume(name), .restart_coordinator()
  FaultCluster.start_worker(wid, delay_ms=D)  clients reach the worker only through a proxy
                                         delaying each direction by D ms (delay_proxy.py)
  FaultCluster(state_tmpfs_mib=N)        the coordinator's state directory is a tmpfs of N MiB
                                         (.fill_state_dir() / .free_state_dir(): a disk full)

Namespace names are `bwf<pid>-<host>`, so concurrent runs do not collide; a run killed before
it could clean up leaves namespaces whose <pid> is dead, and the next run deletes those (and
only those). Needs root (ip netns, nft).
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "integration"))
import bwtest as bt  # noqa: E402
import test_client_e2e as e2e  # noqa: E402

SUBNET = "10.231.0"
HOSTS = {"coord": 2, "w1": 11, "w2": 12, "w3": 13, "t0": 20, "t1": 21, "t2": 22, "t3": 23}
COORD_PORT = 7700
WORKER_PORT = 7701
WORKER_DATA_PORT = 7702
PROXY_OFFSET = 10  # a delayed worker is advertised at its ports + 10 (delay_proxy.py)
NFT_TABLE = "bwfault"


def sh(argv, timeout=20, check=True, input_data=None):
    r = subprocess.run([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout, input=input_data)
    if check and r.returncode != 0:
        raise bt.TestFailure("%s exited %d: %s" % (" ".join(map(str, argv)), r.returncode,
                                                   r.stdout.strip()))
    return r


def have_privileges():
    """(True, "") where namespaces and nft work here, else (False, why)."""
    if os.geteuid() != 0:
        return False, "not root"
    import shutil
    path = os.environ.get("PATH", "/usr/bin") + ":/usr/sbin:/sbin"
    for tool in ("ip", "nft", "stdbuf", "mount", "umount"):
        if not shutil.which(tool, path=path):
            return False, "%s is not installed (scripts/lib.sh BW_TEST_PACKAGES)" % tool
    return True, ""


def reap_stale():
    """Deletes namespaces left by runs of this harness whose process is gone."""
    r = sh(["ip", "netns", "list"], check=False)
    for line in r.stdout.splitlines():
        m = re.match(r"(bwf(\d+)-\S+)", line.strip())
        if m and not os.path.exists("/proc/%s" % m.group(2)):
            sh(["ip", "netns", "del", m.group(1)], check=False)


class Net:
    """One switch namespace with a bridge and one namespace per host in `hosts`."""

    def __init__(self, hosts=HOSTS):
        reap_stale()
        self.prefix = "bwf%d-" % os.getpid()
        self.switch = self.prefix + "sw"
        self.hosts = dict(hosts)
        self.created = []
        self.cut = set()
        t = time.monotonic()
        try:
            self._add_ns(self.switch)
            sh(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
            sh(["ip", "-n", self.switch, "link", "set", "br0", "up"])
            for h, last in self.hosts.items():
                ns = self.ns(h)
                self._add_ns(ns)
                sh(["ip", "-n", ns, "link", "set", "lo", "up"])
                sh(["ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name",
                    self.port(h), "netns", self.switch])
                sh(["ip", "-n", self.switch, "link", "set", self.port(h), "master", "br0", "up"])
                sh(["ip", "-n", ns, "addr", "add", "%s.%d/24" % (SUBNET, last), "dev", "eth0"])
                sh(["ip", "-n", ns, "link", "set", "eth0", "up"])
            sh(["ip", "netns", "exec", self.switch, "nft", "-f", "-"], input_data=(
                "table bridge %s {\n"
                "  set cut { type ifname; }\n"
                "  chain filt { type filter hook forward priority 0; policy accept;\n"
                "    iifname @cut drop; oifname @cut drop; }\n"
                "  chain lossy { type filter hook forward priority 1; policy accept; }\n"
                "}\n" % NFT_TABLE))
        except BaseException:
            self.close()
            raise
        bt.log("network: %d host namespaces on bridge br0 in %s (%s.0/24), set up in %.2fs" %
               (len(self.hosts), self.switch, SUBNET, time.monotonic() - t))

    def _add_ns(self, ns):
        sh(["ip", "netns", "add", ns])
        self.created.append(ns)

    def ns(self, host):
        return self.prefix + host

    def port(self, host):
        return "p" + host  # the host's port on the bridge, in the switch namespace

    def ip(self, host):
        return "%s.%d" % (SUBNET, self.hosts[host])

    def argv(self, host, argv):
        """argv run inside `host`'s namespace (ip netns exec execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns(host)] + [str(a) for a in argv]

    def _nft(self, *args):
        sh(["ip", "netns", "exec", self.switch, "nft"] + list(args))

    # -- faults -------------------------------------------------------------------------
    def partition(self, host):
        self._nft("add", "element", "bridge", NFT_TABLE, "cut", "{ %s }" % self.port(host))
        self.cut.add(host)

    def heal(self, host):
        if host in self.cut:
            self._nft("delete", "element", "bridge", NFT_TABLE, "cut", "{ %s }" % self.port(host))
            self.cut.discard(host)

    def partition_for(self, host, seconds, started=None):
        """Partitions `host` for `seconds`; calls started() once the rule is in. Returns
        (t_start, t_end) in monotonic time."""
        self.partition(host)
        t0 = time.monotonic()
        if started:
            started()
        time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
        self.heal(host)
        return t0, time.monotonic()

    def loss(self, percent):
        """Drops `percent` % of the frames crossing the bridge, at random (every host)."""
        self._nft("flush", "chain", "bridge", NFT_TABLE, "lossy")
        self._nft("add", "rule", "bridge", NFT_TABLE, "lossy", "numgen", "random", "mod", "100",
                  "<", str(int(percent)), "drop")

    def loss_off(self):
        self._nft("flush", "chain", "bridge", NFT_TABLE, "lossy")

    def link(self, host, up):
        sh(["ip", "-n", self.ns(host), "link", "set", "eth0", "up" if up else "down"])

    def close(self):
        for ns in reversed(self.created):
            sh(["ip", "netns", "del", ns], check=False)
        self.created = []


# ---------------------------------------------------------------------------------------
# the cluster


class _Hold:
    """A rank's stdout gate that counts (in place of e2e.Fetch's Event, with the same
    wait()/set()): the reader takes lines until it holds `rank.gate_after` of them, then waits
    until limit() moves that number on or set() opens the gate for good."""

    def __init__(self, rank, opened):
        self.rank = rank
        self.opened = opened  # e2e.Fetch's Event: set() before this gate was put in its place
        self.cv = threading.Condition()

    def wait(self):
        with self.cv:
            self.cv.wait_for(lambda: self.opened.is_set() or
                             len(self.rank.lines) < self.rank.gate_after)

    def set(self):
        with self.cv:
            self.opened.set()
            self.cv.notify_all()

    def limit(self, n):
        with self.cv:
            self.rank.gate_after = n
            self.cv.notify_all()


class Rank(e2e.Fetch):
    """`batchwire fetch` for one rank inside its trainer namespace (`t<rank>`), stdout line
    buffered (stdbuf), so that each batch line's time (`times`) is when it was written.

    Held (gate_after=N), the reader stops after N lines and the process blocks writing a
    bounded number of lines later (a one-page pipe, ~230-byte lines, plus the reader's 8 KiB
    buffer: about 50); `hold_after(M)` lets it print up to M lines and holds it there again,
    `open_gate()` lets it run to its end. So a fault applied between the two finds the rank
    still running, however the machine schedules the processes."""

    def __init__(self, net, coord, job, dataset, c, rank, world=e2e.WORLD, extra=(),
                 gate_after=None):
        # stdbuf preloads libstdbuf.so, ahead of a sanitizer build's libasan: let ASan accept it.
        asan = os.environ.get("ASAN_OPTIONS", "")
        env = {"ASAN_OPTIONS": (asan + ":" if asan else "") + "verify_asan_link_order=0"}
        super().__init__(coord, job, dataset, c, rank, world, extra, env=env,
                         gate_after=gate_after,
                         wrap=lambda argv: net.argv("t%d" % rank, ["stdbuf", "-oL"] + argv))

    def _read_stdout(self):
        # In the reader thread, before its first line: nobody can have waited on the Event.
        if self.gate is not None:
            self.gate = _Hold(self, self.gate)
        super()._read_stdout()

    def hold_after(self, n):
        """The reader takes up to `n` lines in all (more than it holds now), then holds."""
        if not isinstance(self.gate, _Hold) or n < self.gate_after:
            raise bt.TestFailure("rank %d: hold_after(%d) on a rank held at %r" %
                                 (self.rank, n, self.gate_after))
        self.gate.limit(n)


class FaultCluster:
    """A coordinator in `coord`, workers w1..w3 in their namespaces over one data root, fixed
    addresses (so a restarted daemon comes back where it was)."""

    def __init__(self, tmpdir, net, lease_ms=10000, heartbeat_ms=None, dead_after=None,
                 worker_args=(), state_tmpfs_mib=None):
        self.tmpdir = tmpdir
        self.net = net
        self.lease_ms = lease_ms
        self.root = os.path.join(tmpdir, "data")
        os.makedirs(self.root, exist_ok=True)
        self.state_dir = os.path.join(tmpdir, "coord-state")
        os.makedirs(self.state_dir, exist_ok=True)
        self.mounted = False
        if state_tmpfs_mib:
            # Mounted before any daemon starts: `ip netns exec` gives each a copy of the mount
            # table, which then holds this tmpfs.
            sh(["mount", "-t", "tmpfs", "-o", "size=%dm" % state_tmpfs_mib, "bwfault-state",
                self.state_dir])
            self.mounted = True
        self.filler = os.path.join(self.state_dir, "filler")
        # None: the coordinator's default (heartbeats every 1000 ms, dead after 3 missed).
        self.coord_args = ["--lease-ms", lease_ms]
        if heartbeat_ms is not None:
            self.coord_args += ["--heartbeat-ms", heartbeat_ms]
        if dead_after is not None:
            self.coord_args += ["--dead-after", dead_after]
        self.addr = "%s:%d" % (net.ip("coord"), COORD_PORT)
        self.worker_args = list(worker_args)
        self.coord = None
        self.workers = {}
        self.proxies = []
        self.start_coordinator()
        for wid in ("w1", "w2", "w3"):
            self.start_worker(wid)
        self.wait_alive(3)

    def start_coordinator(self, timeout=15):
        argv = self.net.argv("coord", [bt.COORDINATOR, "--listen", self.addr, "--state-dir",
                                       self.state_dir] + self.coord_args)
        self.coord = bt.Daemon("coordinator", argv, self.tmpdir)
        self.coord.wait_listening(timeout)
        return self.coord

    def start_worker(self, wid, timeout=15, delay_ms=None):
        """Starts worker `wid`; with delay_ms, clients reach it (gRPC and data channel) only
        through delay_proxy.py in its namespace, which delays each direction by delay_ms."""
        ip = self.net.ip(wid)
        extra = []
        if delay_ms:
            for port in (WORKER_PORT, WORKER_DATA_PORT):
                p = bt.Daemon("delay-%s-%d" % (wid, port), self.net.argv(wid, [
                    sys.executable, os.path.join(HERE, "delay_proxy.py"),
                    "%s:%d" % (ip, port + PROXY_OFFSET), "%s:%d" % (ip, port), delay_ms]),
                    self.tmpdir)
                p.wait_listening(timeout)
                self.proxies.append(p)
            extra = ["--advertise", "%s:%d" % (ip, WORKER_PORT + PROXY_OFFSET),
                     "--data-advertise", "%s:%d" % (ip, WORKER_DATA_PORT + PROXY_OFFSET)]
        argv = self.net.argv(wid, [
            bt.WORKER, "--coordinator", self.addr, "--listen", "%s:%d" % (ip, WORKER_PORT),
            "--data-listen", "%s:%d" % (ip, WORKER_DATA_PORT), "--data-root", self.root,
            "--id", wid] + extra + self.worker_args)
        d = bt.Daemon("worker-" + wid, argv, self.tmpdir)
        d.wait_listening(timeout)
        self.workers[wid] = d
        return d

    def daemon(self, name):
        return self.coord if name == "coord" else self.workers[name]

    # -- process faults -------------------------------------------------------------------
    def kill9(self, name):
        d = self.daemon(name)
        d.send(signal.SIGKILL)
        t = time.monotonic()
        d.proc.wait(10)
        return t

    def pause(self, name):
        self.daemon(name).send(signal.SIGSTOP)
        return time.monotonic()

    def resume(self, name):
        self.daemon(name).send(signal.SIGCONT)
        return time.monotonic()

    def restart_coordinator(self):
        """SIGKILLs the coordinator and starts it again on the same address and state
        directory; returns (t_kill, t_listening)."""
        t_kill = self.kill9("coord")
        self.start_coordinator()
        return t_kill, time.monotonic()

    # -- queries, from inside a namespace ---------------------------------------------------
    def status(self, via="t0", timeout=20):
        r = bt.run(self.net.argv(via, [bt.CLI, "status", "--coordinator", self.addr, "--json",
                                       "--timeout-ms", 5000]), timeout=timeout)
        if r.returncode != 0:
            raise bt.TestFailure("batchwire status exited %d: %s" % (r.returncode, r.stderr))
        return json.loads(r.stdout)

    def alive(self):
        try:
            return sorted(w["id"] for w in self.status()["workers"] if w["state"] == "alive")
        except bt.TestFailure:
            return []

    def wait_alive(self, n, timeout=30):
        bt.poll(lambda: len(self.alive()) == n, timeout, interval=0.2,
                what="%d live workers" % n)

    def ranks(self, job, dataset, c, extra=(), gate_after=None, world=e2e.WORLD):
        return [Rank(self.net, self.addr, job, dataset, c, r, world, extra, gate_after)
                for r in range(world)]

    def rank(self, job, dataset, c, r, extra=(), gate_after=None, world=e2e.WORLD):
        """One more process for rank `r` (in namespace t<r>), e.g. a restarted trainer."""
        return Rank(self.net, self.addr, job, dataset, c, r, world, extra, gate_after)

    # -- the state directory's disk ---------------------------------------------------------
    def fill_state_dir(self):
        """Fills the state directory's tmpfs with a file until no page is left; returns the
        bytes written."""
        n = 0
        with open(self.filler, "ab", buffering=0) as f:
            for chunk in (1 << 20, 4096):
                try:
                    while True:
                        n += f.write(b"\0" * chunk)
                except OSError as e:
                    if e.errno != 28:  # ENOSPC
                        raise
        return n

    def free_state_dir(self):
        os.unlink(self.filler)

    def unmount(self):
        if self.mounted:
            sh(["umount", "-l", self.state_dir], check=False)
            self.mounted = False

    def stop(self):
        for d in [self.coord] + list(self.workers.values()):
            if d is not None and d.running():
                d.send(signal.SIGCONT)
                d.proc.send_signal(signal.SIGTERM)
        for d in [self.coord] + list(self.workers.values()):
            if d is not None:
                d.wait(20)


# ---------------------------------------------------------------------------------------
# measurements


def recovery_s(ranks, t_end):
    """Time from the fault's end until every rank that still had batches to deliver
    delivered one (0 where a rank never stopped); None if every rank had finished by then."""
    vals = []
    for p in ranks:
        after = [t for t in p.times if t >= t_end]
        if after:
            vals.append(after[0] - t_end)
    return max(vals) if vals else None


def stall_s(ranks, t_from):
    """The longest time any rank went without delivering a batch after `t_from`."""
    worst = 0.0
    for p in ranks:
        prev = t_from
        for t in p.times:
            if t < t_from:
                continue
            worst = max(worst, t - prev)
            prev = t
    return worst
