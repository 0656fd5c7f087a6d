/* Opening a journal: snapshot, replay, torn-tail and corruption handling, and the operator's
 * explicit truncation. See journal.h for the rules; the comments here say why. */
#include "journal/journal_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "common/crc32c.h"
#include "common/util.h"

typedef struct loader {
    bw_journal *j;
    const char *truncate_at;
    bw_journal_snapshot_fn on_snapshot;
    bw_journal_record_fn on_record;
    void *user;
    bw_journal_report *report;
    char *err;
    size_t errlen;
    uint64_t *files; /* first seqs, sorted */
    size_t nfiles;
} loader;

static void note(bw_journal_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(bw_journal_report *r, const char *fmt, ...)
{
    size_t used = strlen(r->notes);
    if (used + 2 >= sizeof(r->notes))
        return;
    if (used)
        r->notes[used++] = ' ';
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->notes + used, sizeof(r->notes) - used, fmt, ap);
    va_end(ap);
}

/* Reads a whole file; *buf is malloc'ed (NULL for an empty file). -1 with errno set on
 * failure (ENOMEM when the buffer cannot be allocated). */
static int read_file(int dirfd, const char *name, uint8_t **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return -1;
    }
    size_t size = (size_t)st.st_size, got = 0;
    uint8_t *b = size ? malloc(size) : NULL;
    if (size && !b) {
        close(fd);
        errno = ENOMEM;
        return -1;
    }
    while (got < size) {
        ssize_t n = read(fd, b + got, size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            free(b);
            close(fd);
            errno = e;
            return -1;
        }
        got += (size_t)n;
    }
    close(fd);
    *buf = b;
    *len = size;
    return 0;
}

/* The code for a read_file failure: the file's fault or the machine's. */
static int read_error(void)
{
    return errno == ENOMEM ? BW_NOMEM : BW_IO;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Lists journal files, removes leftovers of interrupted writes (*.tmp). */
static int list_dir(loader *L)
{
    DIR *d = fdopendir(dup(L->j->dirfd));
    if (!d) {
        snprintf(L->err, L->errlen, "journal %s: cannot list: %s", L->j->dir, strerror(errno));
        return BW_IO;
    }
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        size_t len = strlen(n);
        if (len > 4 && strcmp(n + len - 4, ".tmp") == 0 &&
            (strncmp(n, "journal-", 8) == 0 || strcmp(n, "snapshot.tmp") == 0)) {
            unlinkat(L->j->dirfd, n, 0); /* never renamed into place: never part of the state */
            continue;
        }
        if (len != 28 || strncmp(n, "journal-", 8) != 0 || strspn(n + 8, "0123456789") != 20)
            continue;
        if (L->nfiles == cap) {
            cap = cap ? cap * 2 : 8;
            uint64_t *files = realloc(L->files, cap * sizeof(*files));
            if (!files) {
                closedir(d);
                snprintf(L->err, L->errlen, "journal %s: out of memory listing %zu files",
                         L->j->dir, cap);
                return BW_NOMEM;
            }
            L->files = files;
        }
        L->files[L->nfiles++] = strtoull(n + 8, NULL, 10);
    }
    closedir(d);
    if (L->nfiles > 1)
        qsort(L->files, L->nfiles, sizeof(*L->files), cmp_u64);
    return BW_OK;
}

static int load_snapshot(loader *L, uint64_t *snap_seq)
{
    *snap_seq = 0;
    uint8_t *b;
    size_t len;
    if (read_file(L->j->dirfd, "snapshot", &b, &len) != 0) {
        if (errno == ENOENT)
            return BW_OK;
        int rc = read_error();
        snprintf(L->err, L->errlen, "snapshot %s/snapshot: cannot read: %s", L->j->dir,
                 strerror(errno));
        return rc;
    }
    int rc = BW_OK;
    const char *why = NULL;
    if (len < BW_SNAPSHOT_HEADER || memcmp(b, BW_SNAPSHOT_MAGIC, 8) != 0)
        why = "not a batchwire snapshot (bad header)";
    else if (bw__journal_get32(b + 16) != len - BW_SNAPSHOT_HEADER)
        why = "its length does not match its header";
    if (!why) { /* the checksum covers seq, length and payload */
        uint32_t crc = bw__crc32c(0, b + 8, 12);
        crc = bw__crc32c(crc, b + BW_SNAPSHOT_HEADER, len - BW_SNAPSHOT_HEADER);
        if (crc != bw__journal_get32(b + 20))
            why = "checksum mismatch";
    }
    if (why) {
        snprintf(L->err, L->errlen,
                 "snapshot %s/snapshot is corrupt: %s; refusing to start. Restore the state "
                 "directory from a backup (docs/operating.md)",
                 L->j->dir, why);
        rc = BW_CORRUPT;
    } else {
        *snap_seq = bw__journal_get64(b + 8);
        rc = L->on_snapshot(L->user, *snap_seq, b + BW_SNAPSHOT_HEADER, len - BW_SNAPSHOT_HEADER,
                            L->err, L->errlen);
    }
    free(b);
    return rc;
}

/* True when a well-formed record starts at `off`. */
static bool valid_at(const uint8_t *b, size_t size, size_t off, size_t *reclen)
{
    if (size - off < BW_RECORD_HEADER)
        return false;
    uint32_t len = bw__journal_get32(b + off);
    if (len == 0 || len > BW_JOURNAL_MAX_RECORD || len > size - off - BW_RECORD_HEADER)
        return false;
    uint32_t crc = bw__crc32c(0, b + off, 4);
    crc = bw__crc32c(crc, b + off + BW_RECORD_HEADER, len);
    if (crc != bw__journal_get32(b + off + 4))
        return false;
    *reclen = len;
    return true;
}

/* Moves bytes [off, size) of `name` aside into NAME.discarded-OFF, then cuts the file there. */
static int cut_file(loader *L, const char *name, const uint8_t *b, size_t size, size_t off)
{
    bw_journal *j = L->j;
    if (off < size) {
        char keep[96];
        snprintf(keep, sizeof(keep), "%s.discarded-%zu", name, off);
        int kfd = openat(j->dirfd, keep, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
        if (kfd < 0 || write(kfd, b + off, size - off) != (ssize_t)(size - off) || fsync(kfd)) {
            snprintf(L->err, L->errlen, "journal %s/%s: cannot save the discarded bytes: %s",
                     j->dir, keep, strerror(errno));
            if (kfd >= 0)
                close(kfd);
            return BW_IO;
        }
        close(kfd);
    }
    int fd = openat(j->dirfd, name, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)off) != 0 || fsync(fd) != 0) {
        snprintf(L->err, L->errlen, "journal %s/%s: cannot truncate at %zu: %s", j->dir, name, off,
                 strerror(errno));
        if (fd >= 0)
            close(fd);
        return BW_IO;
    }
    close(fd);
    fsync(j->dirfd);
    return BW_OK;
}

/* Applies --truncate-journal-at NAME:OFFSET before replay. */
static int apply_truncation(loader *L)
{
    const char *spec = L->truncate_at;
    const char *colon = strrchr(spec, ':');
    char *end = NULL;
    unsigned long long off = colon ? strtoull(colon + 1, &end, 10) : 0;
    if (!colon || colon == spec || !end || *end || end == colon + 1 ||
        (size_t)(colon - spec) >= 64) {
        snprintf(L->err, L->errlen,
                 "--truncate-journal-at '%s': expected FILE:OFFSET as printed by the error that "
                 "stopped the coordinator, e.g. journal-00000000000000000001:4096",
                 spec);
        return BW_INVALID_ARGUMENT;
    }
    char name[64];
    snprintf(name, sizeof(name), "%.*s", (int)(colon - spec), spec);
    size_t idx = L->nfiles;
    for (size_t i = 0; i < L->nfiles; i++) {
        char n[64];
        bw__journal_file_name(L->files[i], n, sizeof(n));
        if (strcmp(n, name) == 0)
            idx = i;
    }
    if (idx == L->nfiles) {
        snprintf(L->err, L->errlen, "--truncate-journal-at '%s': there is no journal file %s/%s",
                 spec, L->j->dir, name);
        return BW_INVALID_ARGUMENT;
    }
    uint8_t *b;
    size_t size;
    if (read_file(L->j->dirfd, name, &b, &size) != 0) {
        int rc = read_error();
        snprintf(L->err, L->errlen, "journal %s/%s: cannot read: %s", L->j->dir, name,
                 strerror(errno));
        return rc;
    }
    if (off < BW_JOURNAL_HEADER || off > size) {
        snprintf(L->err, L->errlen,
                 "--truncate-journal-at '%s': offset must be from %d to the file's size %zu", spec,
                 BW_JOURNAL_HEADER, size);
        free(b);
        return BW_INVALID_ARGUMENT;
    }
    int rc = cut_file(L, name, b, size, (size_t)off);
    free(b);
    if (rc != BW_OK)
        return rc;
    note(L->report,
         "journal %s/%s: truncated at offset %llu as asked (%zu bytes kept in %s.discarded-%llu).",
         L->j->dir, name, off, size - (size_t)off, name, off);
    /* Later files continue a history that no longer exists. */
    for (size_t i = idx + 1; i < L->nfiles; i++) {
        char n[64], d[96];
        bw__journal_file_name(L->files[i], n, sizeof(n));
        snprintf(d, sizeof(d), "%s.discarded", n);
        if (renameat(L->j->dirfd, n, L->j->dirfd, d) != 0) {
            snprintf(L->err, L->errlen, "journal %s/%s: cannot rename to %s: %s", L->j->dir, n, d,
                     strerror(errno));
            return BW_IO;
        }
        note(L->report, "journal %s/%s: set aside as %s (it followed the truncation).", L->j->dir,
             n, d);
    }
    L->nfiles = idx + 1;
    fsync(L->j->dirfd);
    return BW_OK;
}

static int corrupt(loader *L, const char *name, size_t off, const char *why)
{
    snprintf(L->err, L->errlen,
             "journal %s/%s is corrupt at offset %zu: %s; refusing to start. The records before "
             "it are intact. Restore the state directory from a backup, or accept losing every "
             "change from this record on by restarting with --truncate-journal-at %s:%zu "
             "(docs/operating.md)",
             L->j->dir, name, off, why, name, off);
    return BW_CORRUPT;
}

/* Replays one file. *expected is the next seq to apply; records below it are skipped.
 * *end_seq is set to the seq after the file's last (kept) record. */
static int replay_file(loader *L, size_t idx, uint64_t *expected, uint64_t *end_seq)
{
    bw_journal *j = L->j;
    bool last = idx + 1 == L->nfiles;
    uint64_t first = L->files[idx];
    char name[64];
    bw__journal_file_name(first, name, sizeof(name));
    uint8_t *b;
    size_t size;
    if (read_file(j->dirfd, name, &b, &size) != 0) {
        int rc = read_error();
        snprintf(L->err, L->errlen, "journal %s/%s: cannot read: %s", j->dir, name,
                 strerror(errno));
        return rc;
    }
    int rc = BW_OK;
    if (size < BW_JOURNAL_HEADER || memcmp(b, BW_JOURNAL_FILE_MAGIC, 8) != 0 ||
        bw__journal_get64(b + 8) != first) {
        rc = corrupt(L, name, 0, "bad file header");
        goto out;
    }
    if (first > *expected) {
        char why[160];
        snprintf(why, sizeof(why), "records %" PRIu64 " to %" PRIu64 " are missing", *expected,
                 first - 1);
        rc = corrupt(L, name, 0, why);
        goto out;
    }
    uint64_t seq = first;
    size_t off = BW_JOURNAL_HEADER, len;
    while (off < size) {
        if (valid_at(b, size, off, &len)) {
            if (seq >= *expected) {
                char why[512];
                rc = L->on_record(L->user, seq, b + off + BW_RECORD_HEADER, len, why, sizeof(why));
                if (rc == BW_NOMEM) { /* the machine's fault, not the record's */
                    snprintf(L->err, L->errlen, "journal %s/%s: record %" PRIu64 ": %s", j->dir,
                             name, seq, why);
                    goto out;
                }
                if (rc != BW_OK) {
                    rc = corrupt(L, name, off, why);
                    goto out;
                }
                (*expected)++;
                L->report->records_replayed++;
            }
            seq++;
            off += BW_RECORD_HEADER + len;
            L->report->journal_records++;
            L->report->journal_bytes += BW_RECORD_HEADER + len;
            continue;
        }
        /* A bad record. Torn tail, or damage with good records after it? */
        bool follows = false;
        for (size_t p = off + 1; p + BW_RECORD_HEADER <= size && !follows; p++)
            follows = valid_at(b, size, p, &len);
        if (follows || !last) {
            rc = corrupt(L, name, off,
                         follows ? "a record fails its checksum but valid records follow it"
                                 : "the file ends inside a record but later journal files "
                                   "exist");
            goto out;
        }
        rc = cut_file(L, name, b, size, off);
        if (rc == BW_OK)
            note(L->report,
                 "journal %s/%s: discarded a torn final record at offset %zu (%zu bytes, kept in "
                 "%s.discarded-%zu): a write cut short by a crash, never acknowledged.",
                 j->dir, name, off, size - off, name, off);
        break;
    }
    *end_seq = seq;
out:
    free(b);
    return rc;
}

int bw__journal_open(const char *dir, const char *truncate_at, bw_journal_snapshot_fn on_snapshot,
                     bw_journal_record_fn on_record, void *user, bw_journal **out,
                     bw_journal_report *report, char *err, size_t errlen)
{
    *out = NULL;
    memset(report, 0, sizeof(*report));
    bw_journal *j = calloc(1, sizeof(*j));
    if (!j) {
        snprintf(err, errlen, "journal %s: out of memory", dir);
        return BW_NOMEM;
    }
    j->fd = -1;
    j->dirfd = -1;
    pthread_mutex_init(&j->mu, NULL);
    bw__cond_init_mono(&j->wake); /* the writer's timed waits on a full disk */
    pthread_cond_init(&j->done, NULL);
    pthread_cond_init(&j->settle, NULL);
    if (!(j->dir = strdup(dir))) {
        snprintf(err, errlen, "journal %s: out of memory", dir);
        bw__journal_free(j);
        return BW_NOMEM;
    }
    j->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (j->dirfd < 0) {
        snprintf(err, errlen, "journal %s: cannot open the directory: %s", dir, strerror(errno));
        bw__journal_free(j);
        return BW_IO;
    }
    loader L = {j, truncate_at, on_snapshot, on_record, user, report, err, errlen, NULL, 0};
    uint64_t snap = 0;
    int rc = list_dir(&L);
    if (rc == BW_OK && truncate_at && *truncate_at)
        rc = apply_truncation(&L);
    if (rc == BW_OK)
        rc = load_snapshot(&L, &snap);
    report->snapshot_seq = snap;
    uint64_t expected = snap + 1;
    /* Files wholly covered by the snapshot (their successor starts at or before snap + 1)
     * are not read: a crash between writing a snapshot and removing them leaves them. */
    size_t start = 0;
    while (start + 1 < L.nfiles && L.files[start + 1] <= snap + 1)
        start++;
    uint64_t end_seq = 0;
    for (size_t i = start; rc == BW_OK && i < L.nfiles; i++) {
        if (i > start && L.files[i] != end_seq) {
            char name[64], why[128];
            bw__journal_file_name(L.files[i], name, sizeof(name));
            snprintf(why, sizeof(why),
                     "it starts at record %" PRIu64
                     " but the previous file ends before record %" PRIu64,
                     L.files[i], end_seq);
            rc = corrupt(&L, name, 0, why);
            break;
        }
        rc = replay_file(&L, i, &expected, &end_seq);
        report->files++;
    }
    if (rc == BW_OK) {
        j->next_seq = expected;
        j->durable_seq = expected - 1;
        /* What is on disk counts toward the next compaction: a coordinator restarted more
         * often than it journals --snapshot-bytes must still compact (docs/operating.md). */
        j->bytes_since_snapshot = report->journal_bytes;
        j->records_since_snapshot = report->journal_records;
        j->first_since_snapshot_ms = report->journal_records ? bw__mono_ms() : 0;
        report->last_seq = expected - 1;
        char name[64];
        /* Keep appending to the last file if its records end exactly where the state ends;
         * otherwise (no file, or the snapshot covers more than it holds) start a new one. */
        if (L.nfiles > 0 && end_seq == expected) {
            j->file_first = L.files[L.nfiles - 1];
            bw__journal_file_name(j->file_first, name, sizeof(name));
            j->fd = openat(j->dirfd, name, O_WRONLY | O_APPEND | O_CLOEXEC);
        } else {
            j->file_first = expected;
            j->fd = bw__journal_create_file(j, expected);
        }
        if (j->fd < 0) {
            snprintf(err, errlen, "journal %s: cannot open a journal file for appending: %s", dir,
                     strerror(errno));
            rc = BW_IO;
        }
        /* Earlier files: remove those the snapshot covers, remember the others for the next
         * snapshot to remove. */
        for (size_t i = 0; rc == BW_OK && i < L.nfiles; i++) {
            if (L.files[i] == j->file_first)
                continue;
            uint64_t next_first = i + 1 < L.nfiles ? L.files[i + 1] : j->file_first;
            if (next_first <= snap + 1) {
                bw__journal_file_name(L.files[i], name, sizeof(name));
                unlinkat(j->dirfd, name, 0);
            } else {
                uint64_t *old = realloc(j->old, (j->nold + 1) * sizeof(*old));
                if (!old) {
                    snprintf(err, errlen, "journal %s: out of memory", dir);
                    rc = BW_NOMEM;
                    break;
                }
                j->old = old;
                j->old[j->nold++] = L.files[i];
                j->oldcap = j->nold;
            }
        }
    }
    free(L.files);
    if (rc == BW_OK)
        rc = bw__journal_start(j);
    if (rc != BW_OK) {
        if (j->fd >= 0)
            close(j->fd);
        bw__journal_free(j);
        return rc;
    }
    *out = j;
    return BW_OK;
}
