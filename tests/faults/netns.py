"""The fault harness: a batchwire cluster spread over network namespaces, and faults on it.
(Not a test itself; test_faults.py runs the scenarios.)

Topology (one `Net`): a "switch" namespace holding a bridge `br0`, and one namespace per host
-- `coord`, `w1`..`w3`, `t0`..`t3` -- each with one interface `eth0`, a veth created directly
inside the two namespaces (`ip -n HOST link add eth0 type veth peer name pHOST netns SWITCH`),
so nothing appears in the root namespace. Hosts have addresses in 10.231.0.0/24 on that
bridge only, and names: each host namespace has its own hosts file, /etc/netns/<ns>/hosts
(which `ip netns exec` bind-mounts over /etc/hosts), mapping `coord`, `w1`..`w3`, `t0`..`t3`
to their addresses, so the daemons advertise and the clients dial names (glibc's
getaddrinfo and gRPC's resolver both read it). The files are written before any process
starts in a namespace and rewritten in place (same inode, one write of the same length:
the bind mounts keep pointing at it) when a host moves. Every daemon and every client runs
inside its host's namespace: in the root namespace of these machines a TCP connect to any
address "succeeds" (a sandbox proxy answers), so a dead or cut-off host can only be observed
from inside a test namespace.

Faults (all applied in the switch namespace or to processes this harness started):
  net.partition(host) / net.heal(host)   nft bridge-family drop of every frame to or from the
                                         host's switch port (a silent partition: no RST, no
                                         ICMP; the peers see timeouts)
  net.partition(host, "in" / "out")      one way only: the frames to the host (its port as
                                         oifname) or only those from it (iifname)
  net.partition_for(host, seconds)       the same, healed after `seconds` (blocks); returns
                                         (t_start, t_end) in time.monotonic()
  net.loss(percent) / net.loss_off()     random loss of `percent` % of the frames crossing the
                                         bridge (`numgen random mod 100 < P drop`), every host
  net.link(host, up)                     the host's own eth0 down/up (ENETUNREACH at once)
  net.readdress(host, last_octet)        the host's eth0 gets a new address (the old one
                                         removed), every hosts file names the new one
  FaultCluster.move_worker(wid, octet), .move_coordinator(octet)  a daemon SIGKILLed and
                                         started again on a new address under the same name
  FaultCluster.kill9(name), .pause(name), .resume(name), .restart_coordinator()
  FaultCluster.start_worker(wid, delay_ms=D)  clients reach the worker only through a proxy
                                         delaying each direction by D ms (delay_proxy.py)
  FaultCluster(state_tmpfs_mib=N)        the coordinator's state directory is a tmpfs of N MiB
                                         (.fill_state_dir() / .free_state_dir(): a disk full)

Namespace names are `bwf<pid>-<host>`, so concurrent runs do not collide; a run killed before
it could clean up leaves namespaces (and their /etc/netns/<ns> directories) whose <pid> is
dead, and the next run deletes those (and only those). Needs root (ip netns, nft).
"""

import glob
import json
import os
import re
import shutil
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
NETNS_ETC = "/etc/netns"  # ip netns exec bind-mounts /etc/netns/<ns>/<file> over /etc/<file>
# The nft sets a partition puts a host's switch port in: both ways, only the frames to it
# (leaving the bridge through its port: oifname), only the frames from it (iifname).
CUT_SETS = {"both": "cut", "in": "cut_in", "out": "cut_out"}


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
    """Deletes namespaces left by runs of this harness whose process is gone, and their hosts
    files' directories."""
    r = sh(["ip", "netns", "list"], check=False)
    for line in r.stdout.splitlines():
        m = re.match(r"(bwf(\d+)-\S+)", line.strip())
        if m and not os.path.exists("/proc/%s" % m.group(2)):
            sh(["ip", "netns", "del", m.group(1)], check=False)
    for d in glob.glob(os.path.join(NETNS_ETC, "bwf*-*")):
        m = re.match(r"bwf(\d+)-", os.path.basename(d))
        if m and not os.path.exists("/proc/%s" % m.group(1)):
            shutil.rmtree(d, ignore_errors=True)


class Net:
    """One switch namespace with a bridge and one namespace per host in `hosts`."""

    def __init__(self, hosts=HOSTS):
        reap_stale()
        self.prefix = "bwf%d-" % os.getpid()
        self.switch = self.prefix + "sw"
        self.hosts = dict(hosts)
        self.created = []
        self.etc = []  # the /etc/netns/<ns> directories this Net made
        self.made_etc = not os.path.isdir(NETNS_ETC)
        self.cut = {}  # host -> "both", "in" or "out"
        t = time.monotonic()
        try:
            self._write_hosts()  # before any process starts in a namespace
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
                "  set cut_in { type ifname; }\n"
                "  set cut_out { type ifname; }\n"
                "  chain filt { type filter hook forward priority 0; policy accept;\n"
                "    iifname @cut drop; oifname @cut drop;\n"
                "    oifname @cut_in drop; iifname @cut_out drop; }\n"
                "  chain lossy { type filter hook forward priority 1; policy accept; }\n"
                "}\n" % NFT_TABLE))
        except BaseException:
            self.close()
            raise
        bt.log("network: %d host namespaces on bridge br0 in %s (%s.0/24, names in %s), set up "
               "in %.2fs" % (len(self.hosts), self.switch, SUBNET,
                             os.path.join(NETNS_ETC, self.prefix + "*", "hosts"),
                             time.monotonic() - t))

    def hosts_text(self):
        """The hosts file every host namespace has: localhost, then each host's address and
        name. Each line has the same width whatever the address (padded), so that a host that
        moves changes no line's length."""
        lines = ["127.0.0.1       localhost", "::1             localhost ip6-localhost"]
        lines += ["%-15s %s" % (self.ip(h), h) for h in sorted(self.hosts)]
        return "".join("%-40s\n" % x for x in lines)

    def hosts_path(self, host):
        return os.path.join(NETNS_ETC, self.ns(host), "hosts")

    def _write_hosts(self):
        """Writes every host namespace's hosts file: created the first time, then rewritten
        in place -- one pwrite at offset 0 of a text as long as the old one, on the same inode:
        `ip netns exec` bind-mounted that inode over /etc/hosts in each process already
        running there, so a rename would go unseen, and a truncate-then-write would let a
        lookup in between find no name."""
        text = self.hosts_text().encode()
        for h in self.hosts:
            path = self.hosts_path(h)
            d = os.path.dirname(path)
            if not os.path.isdir(d):
                os.makedirs(d)
                self.etc.append(d)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                if os.pwrite(fd, text, 0) != len(text):
                    raise bt.TestFailure("short write to %s" % path)
                os.ftruncate(fd, len(text))
            finally:
                os.close(fd)

    def _add_ns(self, ns):
        sh(["ip", "netns", "add", ns])
        self.created.append(ns)

    def ns(self, host):
        return self.prefix + host

    def port(self, host):
        return "p" + host  # the host's port on the bridge, in the switch namespace

    def ip(self, host):
        return "%s.%d" % (SUBNET, self.hosts[host])

    def readdress(self, host, last):
        """`host`'s eth0 gets the address SUBNET.<last> in place of its own (removed first:
        removing a primary address would take a secondary one with it), and every
        namespace's hosts file names the new one. Processes there keep running; sockets
        bound to the old address are dead from then on."""
        last = int(last)
        if not 1 <= last <= 254 or last in (v for h, v in self.hosts.items() if h != host):
            raise bt.TestFailure("readdress(%s, %d): not a free host address in %s.0/24 (in "
                                 "use: %s)" % (host, last, SUBNET, sorted(self.hosts.values())))
        ns, old = self.ns(host), self.ip(host)
        if last == self.hosts[host]:
            return
        sh(["ip", "-n", ns, "addr", "del", "%s/24" % old, "dev", "eth0"])
        self.hosts[host] = last
        sh(["ip", "-n", ns, "addr", "add", "%s/24" % self.ip(host), "dev", "eth0"])
        self._write_hosts()
        bt.log("network: %s moved from %s to %s (hosts files rewritten)" %
               (host, old, self.ip(host)))

    def argv(self, host, argv):
        """argv run inside `host`'s namespace (ip netns exec execs it: same pid)."""
        return ["ip", "netns", "exec", self.ns(host)] + [str(a) for a in argv]

    def _nft(self, *args):
        sh(["ip", "netns", "exec", self.switch, "nft"] + list(args))

    # -- faults -------------------------------------------------------------------------
    def partition(self, host, direction="both"):
        """Drops the frames to and from `host` at the bridge, or (direction "in") only those
        to it, or ("out") only those from it."""
        if direction not in CUT_SETS:
            raise bt.TestFailure("partition(%s, %r): the direction is one of %s" %
                                 (host, direction, ", ".join(sorted(CUT_SETS))))
        self.heal(host)
        self._nft("add", "element", "bridge", NFT_TABLE, CUT_SETS[direction],
                  "{ %s }" % self.port(host))
        self.cut[host] = direction

    def heal(self, host):
        if host in self.cut:
            self._nft("delete", "element", "bridge", NFT_TABLE, CUT_SETS[self.cut[host]],
                      "{ %s }" % self.port(host))
            del self.cut[host]

    def partition_for(self, host, seconds, started=None, direction="both"):
        """Partitions `host` (`direction`: partition()) for `seconds`; calls started() once
        the rule is in. Returns (t_start, t_end) in monotonic time."""
        self.partition(host, direction)
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
        for d in self.etc:
            shutil.rmtree(d, ignore_errors=True)
        self.etc = []
        if self.made_etc:
            try:
                os.rmdir(NETNS_ETC)  # kept while another run's files are in it
            except OSError:
                pass


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
    """A coordinator in `coord`, workers w1..w3 in their namespaces over one data root. Every
    daemon and client names the others by host name (`coord:7700`; a worker advertises
    `wN:7701` and `wN:7702`), and listens on its host's address: a daemon restarted in place
    comes back where it was, one moved (move_worker, move_coordinator) under the same name."""

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
        self.addr = "coord:%d" % COORD_PORT  # what workers, ranks and `batchwire status` dial
        self.worker_args = list(worker_args)
        self.coord = None
        self.workers = {}
        self.proxies = []
        self.start_coordinator()
        for wid in ("w1", "w2", "w3"):
            self.start_worker(wid)
        self.wait_alive(3)

    def start_coordinator(self, timeout=15):
        listen = "%s:%d" % (self.net.ip("coord"), COORD_PORT)
        argv = self.net.argv("coord", [bt.COORDINATOR, "--listen", listen, "--state-dir",
                                       self.state_dir] + self.coord_args)
        self.coord = bt.Daemon("coordinator", argv, self.tmpdir)
        self.coord.wait_listening(timeout)
        return self.coord

    def start_worker(self, wid, timeout=15, delay_ms=None, data_via=None):
        """Starts worker `wid`; with delay_ms, clients reach it (gRPC and data channel) only
        through delay_proxy.py in its namespace, which delays each direction by delay_ms.
        With data_via (a directory: a stall_fs.StallMount of the data root), the worker sees
        that directory at the data root's own path -- a bind mount in the mount namespace
        `ip netns exec` gives it alone -- so its dataset paths and fingerprints are the
        others'. It listens on its host's address and advertises its host's name."""
        ip = self.net.ip(wid)
        extra = ["--advertise", "%s:%d" % (wid, WORKER_PORT),
                 "--data-advertise", "%s:%d" % (wid, WORKER_DATA_PORT)]
        if delay_ms:
            for port in (WORKER_PORT, WORKER_DATA_PORT):
                p = bt.Daemon("delay-%s-%d" % (wid, port), self.net.argv(wid, [
                    sys.executable, os.path.join(HERE, "delay_proxy.py"),
                    "%s:%d" % (ip, port + PROXY_OFFSET), "%s:%d" % (ip, port), delay_ms]),
                    self.tmpdir)
                p.wait_listening(timeout)
                self.proxies.append(p)
            extra = ["--advertise", "%s:%d" % (wid, WORKER_PORT + PROXY_OFFSET),
                     "--data-advertise", "%s:%d" % (wid, WORKER_DATA_PORT + PROXY_OFFSET)]
        argv = [
            bt.WORKER, "--coordinator", self.addr, "--listen", "%s:%d" % (ip, WORKER_PORT),
            "--data-listen", "%s:%d" % (ip, WORKER_DATA_PORT), "--data-root", self.root,
            "--id", wid] + extra + self.worker_args
        if data_via:  # exec: the worker keeps the pid
            argv = ["sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh",
                    data_via, self.root] + argv
        argv = self.net.argv(wid, argv)
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

    def move_worker(self, wid, last):
        """Worker `wid` SIGKILLed, its host moved to SUBNET.<last> (net.readdress: every hosts
        file names the new address), and started again there with the same name and id;
        returns (t_kill, t_listening)."""
        t_kill = self.kill9(wid)
        self.net.readdress(wid, last)
        self.start_worker(wid)
        return t_kill, time.monotonic()

    def move_coordinator(self, last):
        """The coordinator SIGKILLed, its host moved to SUBNET.<last>, and started again there
        under the same name on the same state directory; returns (t_kill, t_listening)."""
        t_kill = self.kill9("coord")
        self.net.readdress("coord", last)
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
