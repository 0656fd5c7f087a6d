/* The journal's writer: group commit on one thread, rotation to a new file, and snapshots.
 *
 * Why one thread: an fsync takes milliseconds, and gRPC's completion-queue threads must never
 * wait for one. Appenders queue records under the mutex and return; the writer takes the whole
 * queue, writes it with one write() and makes it durable with one fdatasync(), so N concurrent
 * changes cost one fsync, not N.
 *
 * A full disk. The caller applies a change to its state before the change is durable (it is
 * acknowledged only once durable), so a record that cannot be written cannot simply be
 * dropped: the state would hold a change the disk lacks. Nor is a full disk a reason to stop
 * the process (a restart on a still-full disk would not help). So a write() that fails with
 * ENOSPC or EDQUOT is cut back -- the file truncated to its length before the write, which
 * needs no space -- and its records go back to the front of the queue, to be tried again
 * every BW_JOURNAL_FULL_RETRY_MS. Until one succeeds, new records are refused and waits for
 * records not yet durable end with BW_UNAVAILABLE, so no one is told a change is durable that
 * is not, and everything acknowledged before stays on disk. Once there is space the waiting
 * records are written: a change whose caller was told it did not become durable may still
 * take effect then, as after any failed call. A failed fdatasync is another matter: the
 * kernel may have dropped the pages it could not write, and a second fdatasync would report
 * success, so it fails the journal as before. */
#include "journal/journal_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "common/crc32c.h"
#include "common/log.h"
#include "common/util.h"

void bw__journal_put32(uint8_t *p, uint32_t v)
{
    bw__put_le32(p, v);
}

void bw__journal_put64(uint8_t *p, uint64_t v)
{
    bw__put_le64(p, v);
}

uint32_t bw__journal_get32(const uint8_t *p)
{
    return bw__get_le32(p);
}

uint64_t bw__journal_get64(const uint8_t *p)
{
    return bw__get_le64(p);
}

void bw__journal_file_name(uint64_t first_seq, char *out, size_t outlen)
{
    snprintf(out, outlen, "journal-%020llu", (unsigned long long)first_seq);
}

static int write_all(int fd, const uint8_t *p, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int bw__journal_create_file(bw_journal *j, uint64_t first_seq)
{
    char name[64], tmp[80];
    bw__journal_file_name(first_seq, name, sizeof(name));
    snprintf(tmp, sizeof(tmp), "%s.tmp", name);
    int fd = openat(j->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0)
        return -1;
    uint8_t hdr[BW_JOURNAL_HEADER];
    memcpy(hdr, BW_JOURNAL_FILE_MAGIC, 8);
    bw__journal_put64(hdr + 8, first_seq);
    if (write_all(fd, hdr, sizeof(hdr)) != 0 || fdatasync(fd) != 0 ||
        renameat(j->dirfd, tmp, j->dirfd, name) != 0 || fsync(j->dirfd) != 0) {
        int e = errno;
        close(fd);
        unlinkat(j->dirfd, tmp, 0);
        errno = e;
        return -1;
    }
    /* O_APPEND is not needed: only the writer writes, always at the end. */
    return fd;
}

uint64_t bw__journal_next_seq(bw_journal *j)
{
    pthread_mutex_lock(&j->mu);
    uint64_t s = j->next_seq;
    pthread_mutex_unlock(&j->mu);
    return s;
}

uint64_t bw__journal_durable_seq(bw_journal *j)
{
    pthread_mutex_lock(&j->mu);
    uint64_t s = j->durable_seq;
    pthread_mutex_unlock(&j->mu);
    return s;
}

int bw__journal_failed(bw_journal *j)
{
    pthread_mutex_lock(&j->mu);
    int f = j->failed;
    pthread_mutex_unlock(&j->mu);
    return f;
}

int bw__journal_full(bw_journal *j, char *why, size_t whylen)
{
    pthread_mutex_lock(&j->mu);
    int full = j->failed ? 0 : j->full;
    uint64_t since = j->full_since_ms;
    size_t waiting = j->plen;
    pthread_mutex_unlock(&j->mu);
    if (full && why && whylen)
        snprintf(why, whylen,
                 "journal %s: %s for %llu ms (%zu bytes of records wait; tried again every %d ms)",
                 j->dir, strerror(full), (unsigned long long)(bw__mono_ms() - since), waiting,
                 BW_JOURNAL_FULL_RETRY_MS);
    return full;
}

void bw__journal_set_sync_hook(bw_journal *j, bw_journal_sync_fn fn, void *user)
{
    pthread_mutex_lock(&j->mu);
    j->sync_hook = fn;
    j->sync_user = user;
    pthread_mutex_unlock(&j->mu);
}

uint64_t bw__journal_bytes_since_snapshot(bw_journal *j)
{
    pthread_mutex_lock(&j->mu);
    uint64_t b = j->bytes_since_snapshot;
    pthread_mutex_unlock(&j->mu);
    return b;
}

bool bw__journal_compaction_due(bw_journal *j, const bw_journal_policy *p, char *why, size_t whylen)
{
    pthread_mutex_lock(&j->mu);
    uint64_t bytes = j->bytes_since_snapshot, records = j->records_since_snapshot;
    uint64_t first_ms = j->first_since_snapshot_ms;
    int full = j->full;
    pthread_mutex_unlock(&j->mu);
    if (records == 0 || full)
        return false; /* a snapshot now would hold nothing the last one lacks, or has no room */
    uint64_t age = first_ms ? bw__mono_ms() - first_ms : 0;
    char buf[160];
    if (p->max_bytes && bytes >= p->max_bytes)
        snprintf(buf, sizeof(buf), "%llu journal bytes (limit %llu)", (unsigned long long)bytes,
                 (unsigned long long)p->max_bytes);
    else if (p->max_records && records >= p->max_records)
        snprintf(buf, sizeof(buf), "%llu journal records (limit %llu)", (unsigned long long)records,
                 (unsigned long long)p->max_records);
    else if (p->max_age_ms && age >= p->max_age_ms)
        snprintf(buf, sizeof(buf), "the oldest journal record is %llu ms old (limit %llu)",
                 (unsigned long long)age, (unsigned long long)p->max_age_ms);
    else
        return false;
    if (why && whylen)
        snprintf(why, whylen, "%s", buf);
    return true;
}

int bw__journal_append(bw_journal *j, const void *data, size_t len, uint64_t *seq)
{
    if (len == 0 || len > BW_JOURNAL_MAX_RECORD)
        return BW_TOO_BIG;
    pthread_mutex_lock(&j->mu);
    if (j->failed || j->closing || j->full) {
        int rc = j->failed || j->closing ? BW_IO : BW_UNAVAILABLE;
        pthread_mutex_unlock(&j->mu);
        return rc;
    }
    size_t need = j->plen + BW_RECORD_HEADER + len;
    if (need > j->pcap) {
        size_t cap = j->pcap ? j->pcap : 4096;
        while (cap < need)
            cap *= 2;
        uint8_t *np = realloc(j->pending, cap);
        if (!np) {
            pthread_mutex_unlock(&j->mu);
            return BW_NOMEM; /* nothing queued: the caller's change is not made */
        }
        j->pending = np;
        j->pcap = cap;
    }
    uint8_t *p = j->pending + j->plen;
    bw__journal_put32(p, (uint32_t)len);
    memcpy(p + BW_RECORD_HEADER, data, len);
    uint32_t crc = bw__crc32c(0, p, 4);
    bw__journal_put32(p + 4, bw__crc32c(crc, data, len));
    j->plen = need;
    j->bytes_since_snapshot += BW_RECORD_HEADER + len;
    if (j->records_since_snapshot++ == 0)
        j->first_since_snapshot_ms = bw__mono_ms();
    *seq = j->next_seq++;
    pthread_cond_signal(&j->wake);
    pthread_mutex_unlock(&j->mu);
    return BW_OK;
}

/* Under j->mu: what a wait for `seq` learns now, or 1 while it must go on waiting. */
static int settled(const bw_journal *j, uint64_t seq)
{
    if (j->failed)
        return BW_IO;
    if (seq <= j->durable_seq)
        return BW_OK;
    return j->full ? BW_UNAVAILABLE : 1;
}

void bw__journal_when_durable(bw_journal *j, uint64_t seq, bw_journal_done_fn fn, void *arg)
{
    pthread_mutex_lock(&j->mu);
    int rc = settled(j, seq);
    if (rc != 1) {
        pthread_mutex_unlock(&j->mu);
        fn(arg, rc);
        return;
    }
    if (j->nwaiters == j->wcap) {
        size_t cap = j->wcap ? j->wcap * 2 : 64;
        bw_journal_waiter *w = realloc(j->waiters, cap * sizeof(*w));
        if (!w) {
            /* The record stays queued and becomes durable; only this wait is given up. */
            pthread_mutex_unlock(&j->mu);
            fn(arg, BW_NOMEM);
            return;
        }
        j->waiters = w;
        j->wcap = cap;
    }
    j->waiters[j->nwaiters++] = (bw_journal_waiter){seq, fn, arg};
    pthread_mutex_unlock(&j->mu);
}

int bw__journal_sync(bw_journal *j, uint64_t seq)
{
    pthread_mutex_lock(&j->mu);
    int rc;
    while ((rc = settled(j, seq)) == 1)
        pthread_cond_wait(&j->done, &j->mu);
    pthread_mutex_unlock(&j->mu);
    return rc;
}

/* Runs (outside the mutex, which the caller holds on entry and exit) the callbacks of every
 * waiter that is now settled. */
static void run_settled(bw_journal *j)
{
    bw_journal_waiter ready[64];
    int rcs[64];
    for (;;) {
        size_t n = 0;
        for (size_t i = 0; i < j->nwaiters && n < 64;) {
            int rc = settled(j, j->waiters[i].seq);
            if (rc != 1) {
                rcs[n] = rc;
                ready[n++] = j->waiters[i];
                j->waiters[i] = j->waiters[--j->nwaiters];
            } else {
                i++;
            }
        }
        if (n == 0)
            return;
        pthread_mutex_unlock(&j->mu);
        for (size_t i = 0; i < n; i++)
            ready[i].fn(ready[i].arg, rcs[i]);
        pthread_mutex_lock(&j->mu);
    }
}

/* Under j->mu: room for one more retired file, so that the writer never allocates. */
static int reserve_old(bw_journal *j)
{
    if (j->nold < j->oldcap)
        return BW_OK;
    size_t cap = j->oldcap ? j->oldcap * 2 : 8;
    uint64_t *old = realloc(j->old, cap * sizeof(*old));
    if (!old)
        return BW_NOMEM;
    j->old = old;
    j->oldcap = cap;
    return BW_OK;
}

static void push_old(bw_journal *j, uint64_t first)
{
    BW_INVARIANT(j->nold < j->oldcap, "a rotation reserved room for the file it retires");
    j->old[j->nold++] = first;
}

static bool no_space(int e)
{
    return e == ENOSPC || e == EDQUOT;
}

/* Cuts fd back to `off` after a write that found no space (shrinking a file needs none). */
static bool cut_back(int fd, off_t off)
{
    return off >= 0 && ftruncate(fd, off) == 0 && lseek(fd, off, SEEK_SET) == off;
}

/* What one pass of the writer did with the queue it took. */
typedef struct pass {
    size_t done; /* bytes of the queue now durable: 0, rot_at or all */
    int newfd;   /* the rotation's new file, once created (-1: not) */
    int err;     /* errno of the first failure */
    bool retry;  /* err found no space and was cut back: the rest may be tried again */
} pass;

/* Writes buf[0..rot_at) to fd, then, with `rot`, creates file rot_seq and writes the rest of
 * the buffer to it, each part made durable with fdatasync. Stops at the first failure. */
static pass write_queue(bw_journal *j, int fd, const uint8_t *buf, size_t len, bool rot,
                        size_t rot_at, uint64_t rot_seq)
{
    pass p = {0, -1, 0, false};
    if (rot_at > 0) {
        off_t off0 = lseek(fd, 0, SEEK_CUR);
        errno = 0;
        if (write_all(fd, buf, rot_at) != 0) {
            p.err = errno ? errno : EIO;
            p.retry = no_space(p.err) && cut_back(fd, off0);
            return p;
        }
        if (fdatasync(fd) != 0) {
            p.err = errno ? errno : EIO;
            return p;
        }
    }
    p.done = rot_at;
    if (!rot)
        return p;
    errno = 0;
    p.newfd = bw__journal_create_file(j, rot_seq);
    if (p.newfd < 0) {
        /* Nothing is in the new file yet: creating it again later rewrites it whole. */
        p.err = errno ? errno : EIO;
        p.retry = no_space(p.err);
        return p;
    }
    if (len > rot_at) {
        errno = 0;
        if (write_all(p.newfd, buf + rot_at, len - rot_at) != 0) {
            p.err = errno ? errno : EIO;
            p.retry = no_space(p.err) && cut_back(p.newfd, BW_JOURNAL_HEADER);
            return p;
        }
        if (fdatasync(p.newfd) != 0) {
            p.err = errno ? errno : EIO;
            return p;
        }
    }
    p.done = len;
    return p;
}

/* Under j->mu, after a pass that found the disk full: buf[done..len) goes back in front of
 * whatever was queued meanwhile, and an unfinished rotation is asked for again. Returns the
 * buffer the writer keeps as its spare (its capacity in *bufcap); *ok is false when memory
 * for the queue ran out (nothing was requeued). */
static uint8_t *requeue(bw_journal *j, uint8_t *buf, size_t *bufcap, size_t len, size_t done,
                        bool rot, bool rotated, size_t rot_at, uint64_t rot_seq, bool *ok)
{
    size_t rest = len - done, need = rest + j->plen;
    *ok = true;
    memmove(buf, buf + done, rest);
    if (need > *bufcap) {
        uint8_t *nb = realloc(buf, need);
        if (!nb) {
            *ok = false;
            return buf;
        }
        buf = nb;
        *bufcap = need;
    }
    if (j->plen)
        memcpy(buf + rest, j->pending, j->plen);
    uint8_t *spare = j->pending;
    size_t sparecap = j->pcap;
    j->pending = buf;
    j->pcap = *bufcap;
    j->plen = need;
    if (rot && !rotated) {
        j->rotate_pending = true;
        j->rotate_at = rot_at - done; /* done is 0 or rot_at */
        j->rotate_seq = rot_seq;
    } else if (j->rotate_pending) {
        j->rotate_at += rest; /* asked for while this pass ran */
    }
    *bufcap = sparecap;
    return spare;
}

static void *writer(void *arg)
{
    bw_journal *j = arg;
    uint8_t *spare = NULL; /* the previous batch's buffer, reused for the next queue */
    size_t sparecap = 0;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->full && !j->closing) {
            struct timespec until = bw__mono_deadline(BW_JOURNAL_FULL_RETRY_MS);
            while (!j->closing && pthread_cond_timedwait(&j->wake, &j->mu, &until) == 0)
                ;
        }
        while (!j->closing && j->plen == 0 && !j->rotate_pending)
            pthread_cond_wait(&j->wake, &j->mu);
        if (j->plen == 0 && !j->rotate_pending)
            break; /* closing with nothing left */
        /* Take the whole queue: this is the group commit. */
        uint8_t *buf = j->pending;
        size_t bufcap = j->pcap, len = j->plen;
        j->pending = spare;
        j->pcap = sparecap;
        j->plen = 0;
        spare = NULL;
        uint64_t target = j->next_seq - 1;
        bool rot = j->rotate_pending;
        size_t rot_at = rot ? j->rotate_at : len;
        uint64_t rot_seq = j->rotate_seq;
        j->rotate_pending = false;
        j->rotating = rot;
        int fd = j->fd;
        bool failed = j->failed != 0;
        pthread_mutex_unlock(&j->mu);

        pass p = {len, -1, 0, false};
        uint64_t t0 = bw__mono_ns();
        if (!failed)
            p = write_queue(j, fd, buf, len, rot, rot_at, rot_seq);
        double took = (double)(bw__mono_ns() - t0) * 1e-9;
        bool rotated = p.newfd >= 0;

        pthread_mutex_lock(&j->mu);
        if (!failed && p.done > 0 && j->sync_hook)
            j->sync_hook(j->sync_user, took, p.done);
        BW_INVARIANT(p.done == 0 || p.done == len || (rot && p.done == rot_at),
                     "a pass of the journal's writer makes whole parts of its queue durable");
        /* Records up to rot_seq - 1 are the part before the rotation. */
        if (!failed && p.done > 0)
            j->durable_seq = p.done == len ? target : rot_seq - 1;
        if (!failed && rotated) {
            close(j->fd);
            push_old(j, j->file_first);
            j->fd = p.newfd;
            j->file_first = rot_seq;
        }
        bool again = false;
        if (p.err && p.retry && !j->closing) {
            bool ok;
            spare = requeue(j, buf, &bufcap, len, p.done, rot, rotated, rot_at, rot_seq, &ok);
            sparecap = bufcap;
            again = ok;
            if (!ok)
                p.err = ENOMEM;
        } else {
            spare = buf;
            sparecap = bufcap;
        }
        if (again && !j->full) {
            j->full = p.err;
            j->full_since_ms = bw__mono_ms();
            BW_ERROR("journal full: %zu bytes of records wait to be written; nothing more is "
                     "acknowledged until there is space (tried again every %d ms) journal=%s "
                     "err=%s",
                     j->plen, BW_JOURNAL_FULL_RETRY_MS, j->dir, strerror(p.err));
        } else if (!p.err && j->full) {
            BW_INFO("journal has space again: the records that waited are durable journal=%s "
                    "waited_ms=%llu",
                    j->dir, (unsigned long long)(bw__mono_ms() - j->full_since_ms));
            j->full = 0;
        }
        if (p.err && !again && !j->failed) {
            j->failed = p.err;
            j->full = 0;
            if (p.retry && j->closing)
                BW_ERROR("journal failed while closing: bytes of records were never written (none "
                         "of them was acknowledged) journal=%s bytes=%zu err=%s",
                         j->dir, len - p.done, strerror(p.err));
            else
                BW_ERROR("journal write or fsync failed; nothing more will be acknowledged "
                         "(restart the coordinator to recover from what is on disk) journal=%s "
                         "err=%s",
                         j->dir, strerror(p.err));
        }
        j->rotating = false;
        pthread_cond_broadcast(&j->done);
        if (j->nwaiters > 0)
            pthread_cond_signal(&j->settle);
    }
    pthread_mutex_unlock(&j->mu);
    free(spare);
    return NULL;
}

/* The notifier thread: runs the callbacks of waits that have settled, in turn, while the
 * writer goes on with the next group commit. Sending 64 answers takes the gRPC runtime
 * about as long as an fdatasync on a fast disk; done on the writer, it held back the next
 * one and every commit queued behind it (docs/performance.md, "Coordinator"). */
static void *notifier(void *arg)
{
    bw_journal *j = arg;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        run_settled(j);
        if (j->writer_done)
            break;
        pthread_cond_wait(&j->settle, &j->mu);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* Stops the notifier once the writer is gone (or never started): it settles what is left. */
static void stop_notifier(bw_journal *j)
{
    pthread_mutex_lock(&j->mu);
    j->writer_done = true;
    pthread_cond_signal(&j->settle);
    pthread_mutex_unlock(&j->mu);
    if (j->notifier_started)
        pthread_join(j->notifier, NULL);
    j->notifier_started = false;
}

int bw__journal_start(bw_journal *j)
{
    if (pthread_create(&j->notifier, NULL, notifier, j) != 0)
        return BW_IO;
    j->notifier_started = true;
    if (pthread_create(&j->thread, NULL, writer, j) != 0) {
        stop_notifier(j);
        return BW_IO;
    }
    j->thread_started = true;
    return BW_OK;
}

void bw__journal_free(bw_journal *j)
{
    if (!j)
        return;
    if (j->dirfd >= 0)
        close(j->dirfd);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->wake);
    pthread_cond_destroy(&j->done);
    pthread_cond_destroy(&j->settle);
    free(j->pending);
    free(j->old);
    free(j->waiters);
    free(j->dir);
    free(j);
}

void bw__journal_close(bw_journal *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->mu);
    j->closing = true;
    pthread_cond_signal(&j->wake);
    pthread_mutex_unlock(&j->mu);
    if (j->thread_started)
        pthread_join(j->thread, NULL);
    stop_notifier(j);
    pthread_mutex_lock(&j->mu);
    if (!j->failed && j->nwaiters > 0)
        j->failed = EIO; /* cannot happen: everything queued was written */
    run_settled(j);
    pthread_mutex_unlock(&j->mu);
    if (j->fd >= 0)
        close(j->fd);
    bw__journal_free(j);
}

int bw__journal_rotate(bw_journal *j, uint64_t *snapshot_seq)
{
    pthread_mutex_lock(&j->mu);
    if (j->rotate_pending || j->rotating || j->failed || j->full) {
        int rc = j->failed ? BW_IO : BW_UNAVAILABLE;
        pthread_mutex_unlock(&j->mu);
        return rc;
    }
    /* A current file with no record in it already starts at the right seq. */
    bool rotate = j->file_first != j->next_seq;
    if (rotate && reserve_old(j) != BW_OK) {
        pthread_mutex_unlock(&j->mu);
        return BW_NOMEM;
    }
    *snapshot_seq = j->next_seq - 1;
    j->bytes_since_snapshot = 0;
    j->records_since_snapshot = 0;
    j->first_since_snapshot_ms = 0;
    if (rotate) {
        j->rotate_pending = true;
        j->rotate_at = j->plen;
        j->rotate_seq = j->next_seq;
        pthread_cond_signal(&j->wake);
    }
    pthread_mutex_unlock(&j->mu);
    return BW_OK;
}

int bw__journal_write_snapshot(bw_journal *j, uint64_t seq, const void *data, size_t len, char *err,
                               size_t errlen)
{
    pthread_mutex_lock(&j->mu);
    while (!j->failed && !j->full && (j->rotate_pending || j->rotating || j->durable_seq < seq))
        pthread_cond_wait(&j->done, &j->mu);
    bool ok = !j->failed && j->file_first == seq + 1 && j->durable_seq >= seq;
    int rc = j->failed ? BW_IO : j->full ? BW_UNAVAILABLE : BW_INVALID_ARGUMENT;
    int full = j->full;
    pthread_mutex_unlock(&j->mu);
    if (!ok) {
        snprintf(err, errlen, "journal %s: %s", j->dir,
                 rc == BW_IO            ? "the journal has failed"
                 : rc == BW_UNAVAILABLE ? strerror(full)
                                        : "snapshot seq does not match the last rotation");
        return rc;
    }

    uint8_t hdr[BW_SNAPSHOT_HEADER];
    memcpy(hdr, BW_SNAPSHOT_MAGIC, 8);
    bw__journal_put64(hdr + 8, seq);
    bw__journal_put32(hdr + 16, (uint32_t)len);
    uint32_t crc = bw__crc32c(0, hdr + 8, 12);
    bw__journal_put32(hdr + 20, bw__crc32c(crc, data, len));
    int fd = openat(j->dirfd, "snapshot.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0 || write_all(fd, hdr, sizeof(hdr)) != 0 || write_all(fd, data, len) != 0 ||
        fsync(fd) != 0 || renameat(j->dirfd, "snapshot.tmp", j->dirfd, "snapshot") != 0 ||
        fsync(j->dirfd) != 0) {
        snprintf(err, errlen, "journal %s: cannot write the snapshot: %s", j->dir, strerror(errno));
        if (fd >= 0)
            close(fd);
        unlinkat(j->dirfd, "snapshot.tmp", 0);
        return BW_IO;
    }
    close(fd);

    /* Every file before the current one now holds only records <= seq. */
    pthread_mutex_lock(&j->mu);
    size_t n = j->nold;
    uint64_t *old = j->old;
    j->old = NULL;
    j->nold = j->oldcap = 0;
    pthread_mutex_unlock(&j->mu);
    for (size_t i = 0; i < n; i++) {
        char name[64];
        bw__journal_file_name(old[i], name, sizeof(name));
        if (unlinkat(j->dirfd, name, 0) != 0 && errno != ENOENT)
            BW_WARN("cannot remove a journal file after a snapshot journal=%s file=%s err=%s",
                    j->dir, name, strerror(errno));
    }
    free(old);
    if (n > 0)
        fsync(j->dirfd);
    return BW_OK;
}
