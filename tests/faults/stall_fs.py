"""A read-only FUSE passthrough file system whose reads can be made to stall: a disk that stops
answering for a while. Started by StallMount (below) for test_faults.py's
worker_disk_stall_10s, whose worker reads through it (netns.FaultCluster.start_worker(wid,
data_via=MOUNTPOINT)):

    stall_fs.py SOURCE MOUNTPOINT CONTROL

mirrors the directory SOURCE at MOUNTPOINT, read-only (paths, sizes, modes and nanosecond
times as SOURCE's, so a dataset read through it has the same fingerprint as read directly:
core/formats/dataset.c hashes each file's path below the data root, size, mtime and first
page). While the file CONTROL exists (it lies outside the mount), every read() the kernel
sends stalls until CONTROL is deleted; each stalled read is logged when it starts and when it
goes on. Its first line on stdout, `stall_fs: mounted ...`, says the mount is up (FUSE's init
has run). SIGTERM unmounts it and exits. Needs /dev/fuse and the right to mount (root) and
fusepy (Debian's python3-fusepy, module `fusepy`; pip's is `fuse`); `available()` says
whether this machine has them.

What the stall reaches, and why the harness invalidates the page cache first
(`invalidate(MOUNTPOINT)`): a worker opens each .npy file once (open + fstat) and maps it
(core/formats/source.c, bw__mapping_map: mmap MAP_SHARED; the opened dataset stays cached,
worker/datasets.c), and reads samples from the mapping -- page faults, not read() calls. A
fault on a page already in the FUSE file's page cache (and mapped) never reaches this
process, so stalling reads alone would stall nothing once the worker has read a file: in the
fault suite the ranks are held mid-epoch, by when the worker has faulted in (with readahead)
most of the 3 files. Turning the cache off is no way out: FUSE's direct_io refuses a shared
mmap (ENODEV, unless the kernel and libfuse 3 agree on FUSE_DIRECT_IO_ALLOW_MMAP, which
fusepy's libfuse 2 cannot) and `echo 1 > /proc/sys/vm/drop_caches` skips mapped pages. What
works: an open() of a FUSE file that the file system answers without FOPEN_KEEP_CACHE (never
set here) makes the kernel invalidate that inode's page cache, unmapping its pages from every
process that maps them (invalidate_inode_pages2). So `invalidate()` opens and closes every
file under the mount (from outside the worker, through the same FUSE superblock), and the
worker's next access to any page faults into this process. The harness does that while the
worker is idle (its ranks held), then creates CONTROL, then releases the ranks: every read of
the worker's stalls from then on. open() is deliberately never stalled, so that invalidate()
cannot hang; a dataset opened during the stall stalls anyway, at the first read of its header.
"""

import errno
import os
import stat
import subprocess
import sys
import threading
import time


def _fuse_module():
    try:
        import fusepy as fuse  # Debian's python3-fusepy
    except ImportError:
        import fuse  # pip's fusepy
    return fuse


def available():
    """(True, "") where this machine can mount a stall_fs, else (False, why)."""
    if not os.path.exists("/dev/fuse"):
        return False, "/dev/fuse does not exist (no FUSE in this kernel or container)"
    try:
        fd = os.open("/dev/fuse", os.O_RDWR)
        os.close(fd)
    except OSError as e:
        return False, "/dev/fuse cannot be opened: %s" % e.strerror
    try:
        _fuse_module()
    except (ImportError, OSError, EnvironmentError) as e:
        return False, "fusepy or libfuse 2 is missing (python3-fusepy, scripts/lib.sh): %s" % e
    return True, ""


def invalidate(mountpoint):
    """Opens and closes every regular file under the mount: the kernel drops (and unmaps) the
    pages it caches for each (see above). Returns how many files."""
    n = 0
    for d, _, files in os.walk(mountpoint):
        for f in files:
            p = os.path.join(d, f)
            if stat.S_ISREG(os.lstat(p).st_mode):
                os.close(os.open(p, os.O_RDONLY))
                n += 1
    return n


class StallMount:
    """For the harness: a stall_fs.py process mirroring `source` at TMPDIR/stallfs-NAME, its
    log a bwtest.Daemon's. A worker reads through it when started with
    FaultCluster.start_worker(wid, data_via=m.mountpoint) (a bind mount over its data root,
    in its own mount namespace)."""

    def __init__(self, tmpdir, source, name, timeout=15):
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(os.path.dirname(here), "integration"))
        import bwtest as bt
        self.bt = bt
        self.mountpoint = os.path.join(tmpdir, "stallfs-" + name)
        self.control = os.path.join(tmpdir, "stallfs-%s.stall" % name)
        os.makedirs(self.mountpoint, exist_ok=True)
        self.daemon = bt.Daemon("stallfs-" + name, [
            sys.executable, os.path.abspath(__file__), source, self.mountpoint, self.control],
            tmpdir)
        try:
            self.daemon.wait_log(r"stall_fs: mounted", timeout)
        except BaseException:
            self.close()
            raise

    def stall(self):
        """Drops the mount's cached pages (invalidate), then stalls every read; returns the
        monotonic time the stall began and how many files were invalidated."""
        n = invalidate(self.mountpoint)
        open(self.control, "w").close()
        return time.monotonic(), n

    def unstall(self):
        """Every stalled read goes on; returns the monotonic time."""
        if os.path.exists(self.control):
            os.unlink(self.control)
        return time.monotonic()

    def stalled_reads(self):
        """How many reads stalled so far (the daemon's log)."""
        return self.daemon.log_text().count(" stalled: ")

    def close(self):
        """Ends any stall, unmounts (SIGTERM), and detaches a mount left by a daemon that did
        not exit cleanly. Stop the workers reading through it first."""
        self.unstall()
        if self.daemon.running():
            try:
                self.daemon.stop(10)
            except self.bt.TestFailure:
                pass  # killed by Daemon.wait: the mount is detached below
        if os.path.ismount(self.mountpoint):
            subprocess.run(["umount", "-l", self.mountpoint], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=False)


def main(argv):
    if len(argv) != 4:
        sys.exit("usage: stall_fs.py SOURCE MOUNTPOINT CONTROL")
    fuse = _fuse_module()
    source, mountpoint, control = (os.path.abspath(a) for a in argv[1:])
    lock = threading.Lock()
    count = {"stalled": 0}

    def log(msg):
        sys.stdout.write("stall_fs: %s\n" % msg)
        sys.stdout.flush()

    class StallFS(fuse.Operations):
        use_ns = True  # times in integer nanoseconds: the fingerprint hashes mtime_ns

        def _real(self, path):
            return os.path.join(source, path.lstrip("/"))

        def init(self, path):
            log("mounted %s read-only at %s (reads stall while %s exists)" %
                (source, mountpoint, control))

        def getattr(self, path, fh=None):
            try:
                st = os.lstat(self._real(path))
            except OSError as e:
                raise fuse.FuseOSError(e.errno)
            attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid",
                                                 "st_size", "st_ino")}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns,
                         st_ctime=st.st_ctime_ns)
            return attrs

        def readdir(self, path, fh):
            try:
                return [".", ".."] + os.listdir(self._real(path))
            except OSError as e:
                raise fuse.FuseOSError(e.errno)

        def readlink(self, path):
            try:
                return os.readlink(self._real(path))
            except OSError as e:
                raise fuse.FuseOSError(e.errno)

        def access(self, path, mode):
            if mode & os.W_OK:
                raise fuse.FuseOSError(errno.EROFS)
            if not os.access(self._real(path), mode):
                raise fuse.FuseOSError(errno.EACCES)

        def statfs(self, path):
            sv = os.statvfs(self._real(path))
            return {k: getattr(sv, k) for k in (
                "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
                "f_flag", "f_frsize", "f_namemax")}

        def open(self, path, flags):
            if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
                raise fuse.FuseOSError(errno.EROFS)
            try:
                return os.open(self._real(path), os.O_RDONLY | os.O_CLOEXEC)
            except OSError as e:
                raise fuse.FuseOSError(e.errno)

        def read(self, path, size, offset, fh):
            if os.path.exists(control):
                with lock:
                    count["stalled"] += 1
                    k = count["stalled"]
                t = time.monotonic()
                log("read %d stalled: %s, %d bytes at %d" % (k, path, size, offset))
                while os.path.exists(control):
                    time.sleep(0.01)
                log("read %d goes on after %.2f s" % (k, time.monotonic() - t))
            try:
                return os.pread(fh, size, offset)
            except OSError as e:
                raise fuse.FuseOSError(e.errno)

        def release(self, path, fh):
            os.close(fh)
            return 0

    # Foreground, multithreaded (a stalled read holds one thread, others go on), read-only.
    # No kernel_cache/auto_cache: an open invalidates the file's cached pages (see above).
    try:
        fuse.FUSE(StallFS(), mountpoint, foreground=True, ro=True, fsname="bwstallfs",
                  default_permissions=True, use_ino=True)
    except RuntimeError:
        sys.exit("stall_fs: mounting %s at %s failed (libfuse said why above)" %
                 (source, mountpoint))
    log("unmounted")


if __name__ == "__main__":
    main(sys.argv)
