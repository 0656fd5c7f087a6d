/* The journal: round trip, group commit, a torn tail at every byte offset of the last record,
 * a flipped bit anywhere in a middle record, a record the state rejects or cannot apply for
 * want of memory, truncation on request, snapshot plus tail,
 * interrupted compaction, compaction limits across reopens, a full disk (records and a
 * rotation wait, nothing acknowledged is lost), and the state directory's lock. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_dir.h"
#include "batchwire/batchwire.h"
#include "journal/journal.h"
#include "server/state_dir.h"

/* ---- a tiny "state": the records seen, in order ---- */

typedef struct seen {
    uint64_t snap_seq;
    char snap[256];
    size_t n;
    uint64_t seqs[4096];
    char recs[4096][48];
    int reject_seq; /* a record the "state" refuses (0: none) */
    int reject_rc;  /* with this code (0: BW_CORRUPT) */
} seen;

static int on_snap(void *user, uint64_t seq, const uint8_t *data, size_t len, char *err,
                   size_t errlen)
{
    (void)err;
    (void)errlen;
    seen *s = user;
    s->snap_seq = seq;
    snprintf(s->snap, sizeof(s->snap), "%.*s", (int)len, (const char *)data);
    return BW_OK;
}

static int on_rec(void *user, uint64_t seq, const uint8_t *data, size_t len, char *err,
                  size_t errlen)
{
    seen *s = user;
    if (s->reject_seq && (uint64_t)s->reject_seq == seq) {
        snprintf(err, errlen, "record %llu makes no sense", (unsigned long long)seq);
        return s->reject_rc ? s->reject_rc : BW_CORRUPT;
    }
    s->seqs[s->n] = seq;
    snprintf(s->recs[s->n], sizeof(s->recs[0]), "%.*s", (int)len, (const char *)data);
    s->n++;
    return BW_OK;
}

static char dir[512];

static void fresh_dir(void)
{
    assert_int_equal(bw_test_dir_make(dir, sizeof(dir), "journal"), 0);
}

static void rm_dir(void)
{
    assert_int_equal(bw_test_dir_remove(dir), 0);
}

static bw_journal *open_ok(seen *s, const char *truncate_at, bw_journal_report *rep)
{
    memset(s, 0, sizeof(*s));
    bw_journal *j = NULL;
    char err[1024];
    int rc = bw__journal_open(dir, truncate_at, on_snap, on_rec, s, &j, rep, err, sizeof(err));
    if (rc != BW_OK)
        fail_msg("open: %s", err);
    return j;
}

static void append_str(bw_journal *j, const char *text)
{
    uint64_t seq;
    assert_int_equal(bw__journal_append(j, text, strlen(text), &seq), BW_OK);
    assert_int_equal(bw__journal_sync(j, seq), BW_OK);
}

static void path_of(uint64_t first, char *out, size_t outlen)
{
    char name[64];
    bw__journal_file_name(first, name, sizeof(name));
    snprintf(out, outlen, "%s/%s", dir, name);
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

/* Writes n records "rec-1".."rec-n"; returns the offset of the start of each in offs. */
static void write_records(int n, long *offs)
{
    seen s;
    bw_journal_report rep;
    bw_journal *j = open_ok(&s, NULL, &rep);
    char path[600];
    path_of(1, path, sizeof(path));
    for (int i = 1; i <= n; i++) {
        if (offs)
            offs[i - 1] = file_size(path);
        char text[32];
        snprintf(text, sizeof(text), "rec-%d", i);
        append_str(j, text);
    }
    bw__journal_close(j);
}

static void test_round_trip(void **state)
{
    (void)state;
    fresh_dir();
    seen s;
    bw_journal_report rep;
    bw_journal *j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.n, 0);
    assert_int_equal(bw__journal_next_seq(j), 1);
    for (int i = 1; i <= 100; i++) {
        char text[32];
        snprintf(text, sizeof(text), "rec-%d", i);
        uint64_t seq;
        assert_int_equal(bw__journal_append(j, text, strlen(text), &seq), BW_OK);
        assert_int_equal(seq, (uint64_t)i);
    }
    assert_int_equal(bw__journal_sync(j, 100), BW_OK);
    assert_true(bw__journal_durable_seq(j) >= 100);
    assert_int_equal(bw__journal_append(j, "x", 0, &(uint64_t){0}), BW_TOO_BIG);
    bw__journal_close(j);

    j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.n, 100);
    for (int i = 0; i < 100; i++) {
        char text[32];
        snprintf(text, sizeof(text), "rec-%d", i + 1);
        assert_int_equal(s.seqs[i], (uint64_t)i + 1);
        assert_string_equal(s.recs[i], text);
    }
    assert_int_equal(rep.last_seq, 100);
    assert_string_equal(rep.notes, "");
    append_str(j, "rec-101");
    bw__journal_close(j);
    j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.n, 101);
    assert_string_equal(s.recs[100], "rec-101");
    bw__journal_close(j);
    rm_dir();
}

/* Group commit: concurrent appenders, callbacks in any order, all durable. */
typedef struct gc_arg {
    bw_journal *j;
    int id;
} gc_arg;

static pthread_mutex_t gc_mu = PTHREAD_MUTEX_INITIALIZER;
static int gc_acked;

static void gc_done(void *arg, int rc)
{
    (void)arg;
    assert_int_equal(rc, BW_OK);
    pthread_mutex_lock(&gc_mu);
    gc_acked++;
    pthread_mutex_unlock(&gc_mu);
}

static void *gc_thread(void *p)
{
    gc_arg *a = p;
    for (int i = 0; i < 200; i++) {
        char text[32];
        snprintf(text, sizeof(text), "t%d-%d", a->id, i);
        uint64_t seq;
        if (bw__journal_append(a->j, text, strlen(text), &seq) != BW_OK)
            abort();
        bw__journal_when_durable(a->j, seq, gc_done, NULL);
    }
    return NULL;
}

static void test_group_commit(void **state)
{
    (void)state;
    fresh_dir();
    seen s;
    bw_journal_report rep;
    bw_journal *j = open_ok(&s, NULL, &rep);
    pthread_t t[4];
    gc_arg args[4];
    gc_acked = 0;
    for (int i = 0; i < 4; i++) {
        args[i] = (gc_arg){j, i};
        pthread_create(&t[i], NULL, gc_thread, &args[i]);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    bw__journal_close(j); /* runs every pending callback */
    assert_int_equal(gc_acked, 800);
    j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.n, 800);
    for (size_t i = 0; i < s.n; i++)
        assert_int_equal(s.seqs[i], i + 1);
    bw__journal_close(j);
    rm_dir();
}

/* The sync hook (metrics): told of every group commit with the record bytes it made durable
 * (each record's 8-byte header included) and how long it took; not called once removed. */
typedef struct synced {
    int calls;
    uint64_t bytes;
    double seconds;
} synced;

static void on_sync(void *user, double seconds, uint64_t bytes)
{
    synced *y = user;
    y->calls++;
    y->bytes += bytes;
    y->seconds += seconds;
}

static void test_sync_hook(void **state)
{
    (void)state;
    fresh_dir();
    seen s;
    bw_journal_report rep;
    bw_journal *j = open_ok(&s, NULL, &rep);
    synced y = {0, 0, 0};
    bw__journal_set_sync_hook(j, on_sync, &y);
    append_str(j, "first");  /* 5 bytes */
    append_str(j, "second"); /* 6 bytes */
    assert_int_equal(y.calls, 2);
    assert_int_equal(y.bytes, 5 + 6 + 2 * 8); /* u32 length, u32 CRC (journal.h) */
    assert_true(y.seconds > 0 && y.seconds < 60);
    bw__journal_set_sync_hook(j, NULL, NULL);
    append_str(j, "third");
    assert_int_equal(y.calls, 2);
    bw__journal_close(j);
    rm_dir();
}

/* Cutting the file anywhere inside the last record (or padding it with zeros, as a crash
 * after the file grew can leave it) loses exactly that record, with a note; the journal
 * then continues where it stopped. */
static void test_torn_tail_every_offset(void **state)
{
    (void)state;
    fresh_dir();
    long offs[5];
    write_records(5, offs);
    char path[600];
    path_of(1, path, sizeof(path));
    long size = file_size(path);
    uint8_t *orig = malloc((size_t)size);
    FILE *f = fopen(path, "rb");
    assert_int_equal(fread(orig, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    for (int zero_fill = 0; zero_fill <= 1; zero_fill++) {
        for (long cut = offs[4]; cut < size; cut++) {
            f = fopen(path, "wb");
            fwrite(orig, 1, (size_t)cut, f);
            for (long z = cut; zero_fill && z < size + 7; z++)
                fputc(0, f);
            fclose(f);
            seen s;
            bw_journal_report rep;
            bw_journal *j = open_ok(&s, NULL, &rep);
            assert_int_equal(s.n, 4);
            assert_string_equal(s.recs[3], "rec-4");
            if (cut > offs[4] || zero_fill)
                assert_non_null(strstr(rep.notes, "torn final record"));
            else
                assert_string_equal(rep.notes, "");
            assert_int_equal(file_size(path), offs[4]);
            append_str(j, "rec-5b");
            bw__journal_close(j);
            j = open_ok(&s, NULL, &rep);
            assert_int_equal(s.n, 5);
            assert_int_equal(s.seqs[4], 5);
            assert_string_equal(s.recs[4], "rec-5b");
            assert_string_equal(rep.notes, "");
            bw__journal_close(j);
        }
    }
    free(orig);
    rm_dir();
}

/* A flipped bit anywhere in a record that has good records after it: refuse to start,
 * naming the file and the record's offset; --truncate-journal-at FILE:OFFSET cuts there. */
static void test_flipped_bit_in_the_middle(void **state)
{
    (void)state;
    fresh_dir();
    long offs[5];
    write_records(5, offs);
    char path[600];
    path_of(1, path, sizeof(path));
    uint8_t orig[4096];
    long size = file_size(path);
    FILE *f = fopen(path, "rb");
    assert_int_equal(fread(orig, 1, (size_t)size, f), (size_t)size);
    fclose(f);
    char name[64], want[128];
    bw__journal_file_name(1, name, sizeof(name));
    snprintf(want, sizeof(want), "%s is corrupt at offset %ld", name, offs[2]);
    for (long at = offs[2]; at < offs[3]; at++) {
        uint8_t bad[4096];
        memcpy(bad, orig, (size_t)size);
        bad[at] ^= (uint8_t)(1u << (at % 8));
        f = fopen(path, "wb");
        fwrite(bad, 1, (size_t)size, f);
        fclose(f);
        seen s;
        bw_journal *j = NULL;
        bw_journal_report rep;
        char err[1024];
        int rc = bw__journal_open(dir, NULL, on_snap, on_rec, &s, &j, &rep, err, sizeof(err));
        assert_int_equal(rc, BW_CORRUPT);
        assert_null(j);
        if (!strstr(err, want))
            fail_msg("byte %ld: %s", at, err);
        assert_non_null(strstr(err, "--truncate-journal-at"));
        assert_int_equal(file_size(path), size); /* nothing was cut */
    }
    /* The operator accepts the loss. */
    char spec[128];
    snprintf(spec, sizeof(spec), "%s:%ld", name, offs[2]);
    seen s;
    bw_journal_report rep;
    bw_journal *j = open_ok(&s, spec, &rep);
    assert_int_equal(s.n, 2);
    assert_non_null(strstr(rep.notes, "truncated at offset"));
    char kept[700];
    snprintf(kept, sizeof(kept), "%s.discarded-%ld", path, offs[2]);
    assert_int_equal(file_size(kept), size - offs[2]);
    append_str(j, "rec-3b");
    bw__journal_close(j);
    j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.n, 3);
    assert_string_equal(s.recs[2], "rec-3b");
    bw__journal_close(j);

    /* Bad truncation requests are refused with a reason. */
    char err[1024];
    const char *bad_specs[] = {"nonsense", "journal-00000000000000000009:20", "x:", ":5"};
    for (size_t i = 0; i < sizeof(bad_specs) / sizeof(bad_specs[0]); i++) {
        j = NULL;
        int rc =
            bw__journal_open(dir, bad_specs[i], on_snap, on_rec, &s, &j, &rep, err, sizeof(err));
        assert_int_equal(rc, BW_INVALID_ARGUMENT);
        assert_non_null(strstr(err, "--truncate-journal-at"));
    }
    rm_dir();
}

/* A record with a good checksum that the state rejects is corruption too. */
static void test_rejected_record(void **state)
{
    (void)state;
    fresh_dir();
    write_records(3, NULL);
    seen s;
    memset(&s, 0, sizeof(s));
    s.reject_seq = 2;
    bw_journal *j = NULL;
    bw_journal_report rep;
    char err[1024];
    int rc = bw__journal_open(dir, NULL, on_snap, on_rec, &s, &j, &rep, err, sizeof(err));
    assert_int_equal(rc, BW_CORRUPT);
    assert_non_null(strstr(err, "record 2 makes no sense"));
    rm_dir();
}

/* A state that runs out of memory applying a record stops the open with BW_NOMEM: the record
 * is not called corrupt, no truncation is offered, and nothing on disk changes. */
static void test_record_out_of_memory(void **state)
{
    (void)state;
    fresh_dir();
    write_records(3, NULL);
    char path[600];
    path_of(1, path, sizeof(path));
    long size = file_size(path);
    seen s;
    memset(&s, 0, sizeof(s));
    s.reject_seq = 2;
    s.reject_rc = BW_NOMEM;
    bw_journal *j = NULL;
    bw_journal_report rep;
    char err[1024];
    int rc = bw__journal_open(dir, NULL, on_snap, on_rec, &s, &j, &rep, err, sizeof(err));
    assert_int_equal(rc, BW_NOMEM);
    assert_null(j);
    assert_non_null(strstr(err, "record 2: record 2 makes no sense"));
    assert_null(strstr(err, "corrupt"));
    assert_null(strstr(err, "--truncate-journal-at"));
    assert_int_equal(file_size(path), size);
    j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.n, 3);
    bw__journal_close(j);
    rm_dir();
}

static void test_snapshot_and_tail(void **state)
{
    (void)state;
    fresh_dir();
    seen s;
    bw_journal_report rep;
    bw_journal *j = open_ok(&s, NULL, &rep);
    for (int i = 1; i <= 10; i++) {
        char text[32];
        snprintf(text, sizeof(text), "rec-%d", i);
        append_str(j, text);
    }
    assert_true(bw__journal_bytes_since_snapshot(j) > 0);
    uint64_t snap_seq;
    assert_int_equal(bw__journal_rotate(j, &snap_seq), BW_OK);
    assert_int_equal(snap_seq, 10);
    /* Records appended between rotation and snapshot go to the new file. */
    append_str(j, "rec-11");
    char err[512];
    const char *blob = "state-after-10";
    assert_int_equal(bw__journal_write_snapshot(j, snap_seq, blob, strlen(blob), err, sizeof(err)),
                     BW_OK);
    for (int i = 12; i <= 15; i++) {
        char text[32];
        snprintf(text, sizeof(text), "rec-%d", i);
        append_str(j, text);
    }
    bw__journal_close(j);
    char p1[600], p11[600];
    path_of(1, p1, sizeof(p1));
    path_of(11, p11, sizeof(p11));
    assert_int_equal(file_size(p1), -1); /* compacted away */
    assert_true(file_size(p11) > 0);

    j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.snap_seq, 10);
    assert_string_equal(s.snap, "state-after-10");
    assert_int_equal(s.n, 5);
    assert_int_equal(s.seqs[0], 11);
    assert_string_equal(s.recs[4], "rec-15");
    assert_int_equal(rep.snapshot_seq, 10);
    assert_int_equal(rep.last_seq, 15);

    /* A second compaction with nothing new since the rotation. */
    assert_int_equal(bw__journal_rotate(j, &snap_seq), BW_OK);
    assert_int_equal(snap_seq, 15);
    assert_int_equal(bw__journal_write_snapshot(j, 15, "s15", 3, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__journal_rotate(j, &snap_seq), BW_OK); /* empty file: no new file */
    assert_int_equal(bw__journal_write_snapshot(j, 15, "s15", 3, err, sizeof(err)), BW_OK);
    bw__journal_close(j);
    j = open_ok(&s, NULL, &rep);
    assert_string_equal(s.snap, "s15");
    assert_int_equal(s.n, 0);
    append_str(j, "rec-16");
    bw__journal_close(j);
    j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.seqs[0], 16);
    bw__journal_close(j);

    /* A corrupt snapshot stops the start with a clear message. */
    char sp[600];
    snprintf(sp, sizeof(sp), "%s/snapshot", dir);
    int fd = open(sp, O_WRONLY);
    assert_int_equal(pwrite(fd, "X", 1, 30), 1);
    close(fd);
    bw_journal *j2 = NULL;
    int rc = bw__journal_open(dir, NULL, on_snap, on_rec, &s, &j2, &rep, err, sizeof(err));
    assert_int_equal(rc, BW_CORRUPT);
    assert_non_null(strstr(err, "snapshot is corrupt"));
    rm_dir();
}

/* A crash after rotation but before the snapshot: the old file and the new one are both
 * replayed; a leftover snapshot.tmp is ignored. */
static void test_interrupted_compaction(void **state)
{
    (void)state;
    fresh_dir();
    seen s;
    bw_journal_report rep;
    bw_journal *j = open_ok(&s, NULL, &rep);
    for (int i = 1; i <= 3; i++)
        append_str(j, "a");
    uint64_t snap_seq;
    assert_int_equal(bw__journal_rotate(j, &snap_seq), BW_OK);
    append_str(j, "b");
    bw__journal_close(j);
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s/snapshot.tmp", dir);
    FILE *f = fopen(tmp, "wb");
    fputs("half a snapshot", f);
    fclose(f);
    j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.n, 4);
    assert_int_equal(s.seqs[3], 4);
    assert_string_equal(s.recs[3], "b");
    assert_int_equal(file_size(tmp), -1);
    assert_int_equal(rep.files, 2);
    bw__journal_close(j);

    /* A missing middle file is corruption, not silence. */
    char p1[600];
    path_of(1, p1, sizeof(p1));
    unlink(p1);
    char err[1024];
    int rc = bw__journal_open(dir, NULL, on_snap, on_rec, &s, &j, &rep, err, sizeof(err));
    assert_int_equal(rc, BW_CORRUPT);
    assert_non_null(strstr(err, "records 1 to 3 are missing"));
    rm_dir();
}

/* Bytes of the journal-<seq> files in dir. */
static long journal_bytes_on_disk(void)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    long total = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strlen(e->d_name) != 28 || strncmp(e->d_name, "journal-", 8) != 0)
            continue;
        char p[1100];
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        total += file_size(p);
    }
    closedir(d);
    return total;
}

/* What the journal found at open counts toward compaction, and the policy's three limits:
 * a process restarted more often than it journals the byte limit must still compact. */
static void test_compaction_due_across_reopens(void **state)
{
    (void)state;
    fresh_dir();
    seen s;
    bw_journal_report rep;
    bw_journal *j = open_ok(&s, NULL, &rep);
    bw_journal_policy none = {0, 0, 0};
    assert_false(bw__journal_compaction_due(j, &(bw_journal_policy){1, 1, 1}, NULL, 0));
    for (int i = 1; i <= 5; i++)
        append_str(j, "rec-x"); /* 8 + 5 bytes each */
    assert_int_equal(bw__journal_bytes_since_snapshot(j), 65);
    bw__journal_close(j);

    j = open_ok(&s, NULL, &rep);
    assert_int_equal(rep.journal_records, 5);
    assert_int_equal(rep.journal_bytes, 65);
    assert_int_equal(bw__journal_bytes_since_snapshot(j), 65);
    char why[160];
    assert_false(bw__journal_compaction_due(j, &none, why, sizeof(why)));
    assert_false(bw__journal_compaction_due(j, &(bw_journal_policy){66, 6, 0}, why, sizeof(why)));
    assert_true(bw__journal_compaction_due(j, &(bw_journal_policy){65, 0, 0}, why, sizeof(why)));
    assert_non_null(strstr(why, "65 journal bytes (limit 65)"));
    assert_true(bw__journal_compaction_due(j, &(bw_journal_policy){0, 5, 0}, why, sizeof(why)));
    assert_non_null(strstr(why, "5 journal records"));
    assert_false(bw__journal_compaction_due(j, &(bw_journal_policy){0, 0, 60000}, NULL, 0));
    usleep(30 * 1000); /* records found at open are as old as the open */
    assert_true(bw__journal_compaction_due(j, &(bw_journal_policy){0, 0, 20}, why, sizeof(why)));
    assert_non_null(strstr(why, "ms old"));
    bw__journal_close(j);

    /* 40 short runs, each appending 3 records and compacting only when due: the journal
     * stays under the limit plus one run's records, and every record survives. */
    const bw_journal_policy every100 = {100, 0, 0};
    int total = 5, compactions = 0;
    long peak = 0;
    for (int run = 0; run < 40; run++) {
        j = open_ok(&s, NULL, &rep);
        assert_int_equal(rep.last_seq, (uint64_t)total);
        if (bw__journal_compaction_due(j, &every100, NULL, 0)) {
            uint64_t seq;
            assert_int_equal(bw__journal_rotate(j, &seq), BW_OK);
            char blob[32], err[512];
            int len = snprintf(blob, sizeof(blob), "upto-%llu", (unsigned long long)seq);
            assert_int_equal(
                bw__journal_write_snapshot(j, seq, blob, (size_t)len, err, sizeof(err)), BW_OK);
            compactions++;
        }
        for (int i = 0; i < 3; i++)
            append_str(j, "rec-x");
        total += 3;
        bw__journal_close(j);
        long now = journal_bytes_on_disk();
        peak = now > peak ? now : peak;
        assert_true(now <= 100 + 3 * 13 + 16);
    }
    assert_true(compactions >= 10);
    j = open_ok(&s, NULL, &rep);
    char want[32];
    snprintf(want, sizeof(want), "upto-%llu", (unsigned long long)s.snap_seq);
    assert_string_equal(s.snap, want);
    assert_int_equal(s.snap_seq + s.n, (uint64_t)total);
    assert_int_equal(rep.last_seq, (uint64_t)total);

    /* A kill after the snapshot's rename but before the files it covers are removed: the
     * next open removes them and counts none of their records toward the next compaction. */
    uint64_t first = s.snap_seq + 1, seq;
    char covered[600], keep[700];
    path_of(first, covered, sizeof(covered));
    snprintf(keep, sizeof(keep), "%s.keep", covered);
    assert_int_equal(bw__journal_rotate(j, &seq), BW_OK);
    assert_int_equal(link(covered, keep), 0);
    char err[512];
    assert_int_equal(bw__journal_write_snapshot(j, seq, "all", 3, err, sizeof(err)), BW_OK);
    bw__journal_close(j);
    assert_int_equal(file_size(covered), -1);
    assert_int_equal(rename(keep, covered), 0);
    j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.snap_seq, (uint64_t)total);
    assert_int_equal(s.n, 0);
    assert_int_equal(rep.journal_records, 0);
    assert_int_equal(rep.journal_bytes, 0);
    assert_int_equal(file_size(covered), -1);
    assert_false(bw__journal_compaction_due(j, &(bw_journal_policy){1, 1, 1}, NULL, 0));
    bw__journal_close(j);
    rm_dir();
}

/* ---- a full disk: the directory is a small tmpfs, filled up by another file ---- */

static char filler[600];

/* Mounts a 64 KiB tmpfs on a fresh `dir` and opens a journal there (the test is skipped
 * where mounting is not allowed: not root). */
static bw_journal *open_on_tmpfs(seen *s, bw_journal_report *rep)
{
    fresh_dir();
    if (mount("tmpfs", dir, "tmpfs", 0, "size=64k") != 0) {
        rm_dir();
        skip();
    }
    snprintf(filler, sizeof(filler), "%s/filler", dir);
    return open_ok(s, NULL, rep);
}

static void fill(void)
{
    int fd = open(filler, O_WRONLY | O_CREAT | O_APPEND, 0600);
    assert_true(fd >= 0);
    char page[4096];
    memset(page, 'f', sizeof(page));
    while (write(fd, page, sizeof(page)) > 0)
        ;
    assert_int_equal(errno, ENOSPC);
    close(fd);
}

static void unmount_dir(void)
{
    assert_int_equal(umount2(dir, MNT_DETACH), 0);
    rm_dir();
}

static int full_rc = 1;
static void full_done(void *arg, int rc)
{
    (void)arg;
    full_rc = rc;
}

/* Waits up to 5 s for the journal to find space again. */
static void wait_space(bw_journal *j)
{
    for (int i = 0; i < 500 && bw__journal_full(j, NULL, 0); i++)
        usleep(10000);
    assert_int_equal(bw__journal_full(j, NULL, 0), 0);
}

/* Records of 900 bytes until one finds the disk full: those acknowledged before stay, the one
 * that found no space waits (its wait ends with BW_UNAVAILABLE, later appends are refused)
 * and becomes durable once the filler is gone; after a reopen every record is there, in
 * order, once. */
static void test_disk_full(void **state)
{
    (void)state;
    seen s;
    bw_journal_report rep;
    bw_journal *j = open_on_tmpfs(&s, &rep);
    append_str(j, "before");
    fill();
    char rec[900];
    int acked = 0, rc = BW_OK;
    uint64_t seq = 0;
    while (rc == BW_OK && acked < 100) {
        memset(rec, 'x', sizeof(rec));
        int n = snprintf(rec, sizeof(rec), "full-%03d", acked + 1);
        rec[n] = '.';
        assert_int_equal(bw__journal_append(j, rec, sizeof(rec), &seq), BW_OK);
        rc = bw__journal_sync(j, seq);
        acked += rc == BW_OK;
    }
    assert_int_equal(rc, BW_UNAVAILABLE); /* a page holds at most 4 of them */
    char why[1024];
    assert_int_equal(bw__journal_full(j, why, sizeof(why)), ENOSPC);
    assert_non_null(strstr(why, dir));
    assert_non_null(strstr(why, "No space left on device"));
    assert_non_null(strstr(why, "908 bytes of records wait"));
    assert_int_equal(bw__journal_failed(j), 0);
    assert_int_equal(bw__journal_durable_seq(j), seq - 1);
    uint64_t other;
    assert_int_equal(bw__journal_append(j, "refused", 7, &other), BW_UNAVAILABLE);
    assert_int_equal(bw__journal_next_seq(j), seq + 1);
    full_rc = 1;
    bw__journal_when_durable(j, seq, full_done, NULL);
    assert_int_equal(full_rc, BW_UNAVAILABLE);
    full_rc = 1;
    bw__journal_when_durable(j, seq - 1, full_done, NULL);
    assert_int_equal(full_rc, BW_OK);
    assert_false(bw__journal_compaction_due(j, &(bw_journal_policy){1, 1, 1}, NULL, 0));
    assert_int_equal(bw__journal_rotate(j, &other), BW_UNAVAILABLE);
    usleep(450 * 1000); /* two more tries find no space either */
    assert_int_equal(bw__journal_full(j, NULL, 0), ENOSPC);

    assert_int_equal(unlink(filler), 0);
    wait_space(j);
    assert_int_equal(bw__journal_sync(j, seq), BW_OK);
    append_str(j, "after");
    bw__journal_close(j);

    j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.n, (size_t)acked + 3);
    assert_string_equal(s.recs[0], "before");
    for (int i = 1; i <= acked + 1; i++) {
        char want[32];
        snprintf(want, sizeof(want), "full-%03d.", i);
        assert_memory_equal(s.recs[i], want, strlen(want));
        assert_int_equal(s.seqs[i], (uint64_t)i + 1);
    }
    assert_string_equal(s.recs[acked + 2], "after");
    assert_string_equal(rep.notes, "");
    bw__journal_close(j);
    unmount_dir();
}

/* A rotation (the first step of a compaction) that finds no room for its new file waits as
 * records do: the snapshot is refused meanwhile, and the rotation and the records behind it
 * are done once there is space. */
static void test_disk_full_rotation(void **state)
{
    (void)state;
    seen s;
    bw_journal_report rep;
    bw_journal *j = open_on_tmpfs(&s, &rep);
    append_str(j, "one");
    append_str(j, "two");
    fill();
    uint64_t snap = 0;
    assert_int_equal(bw__journal_rotate(j, &snap), BW_OK);
    assert_int_equal(snap, 2);
    char err[512];
    /* The writer cannot create journal-3 (no page for it): the snapshot is refused. */
    assert_int_equal(bw__journal_write_snapshot(j, snap, "S2", 2, err, sizeof(err)),
                     BW_UNAVAILABLE);
    assert_non_null(strstr(err, "No space left on device"));
    assert_int_equal(bw__journal_full(j, NULL, 0), ENOSPC);
    uint64_t seq;
    assert_int_equal(bw__journal_append(j, "three", 5, &seq), BW_UNAVAILABLE);
    char path[600];
    path_of(3, path, sizeof(path));
    assert_int_equal(file_size(path), -1);

    assert_int_equal(unlink(filler), 0);
    wait_space(j);
    assert_int_equal(file_size(path), 16);
    append_str(j, "three");
    assert_int_equal(bw__journal_write_snapshot(j, snap, "S2", 2, err, sizeof(err)), BW_OK);
    bw__journal_close(j);
    path_of(1, path, sizeof(path));
    assert_int_equal(file_size(path), -1); /* covered by the snapshot, removed */

    j = open_ok(&s, NULL, &rep);
    assert_int_equal(s.snap_seq, 2);
    assert_string_equal(s.snap, "S2");
    assert_int_equal(s.n, 1);
    assert_string_equal(s.recs[0], "three");
    assert_int_equal(s.seqs[0], 3);
    bw__journal_close(j);
    unmount_dir();
}

/* The state directory's lock: a second holder is refused (naming the first), and a holder
 * that dies, even by SIGKILL, releases it. */
static void test_state_dir_lock(void **state)
{
    (void)state;
    fresh_dir();
    char err[1024];
    int fd1 = -1, fd2 = -1;
    assert_int_equal(bw__state_dir_lock(dir, &fd1, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__state_dir_lock(dir, &fd2, err, sizeof(err)), BW_ALREADY_EXISTS);
    assert_int_equal(fd2, -1);
    char want[64];
    snprintf(want, sizeof(want), "pid %d", (int)getpid());
    assert_non_null(strstr(err, want));
    assert_non_null(strstr(err, "in use by another coordinator"));
    close(fd1);

    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t child = fork();
    if (child == 0) {
        int fd = -1;
        char e[512];
        char ok = bw__state_dir_lock(dir, &fd, e, sizeof(e)) == BW_OK ? 'y' : 'n';
        if (write(pipefd[1], &ok, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char ok = 0;
    assert_int_equal(read(pipefd[0], &ok, 1), 1);
    assert_int_equal(ok, 'y');
    assert_int_equal(bw__state_dir_lock(dir, &fd2, err, sizeof(err)), BW_ALREADY_EXISTS);
    snprintf(want, sizeof(want), "pid %d", (int)child);
    assert_non_null(strstr(err, want));
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    assert_int_equal(bw__state_dir_lock(dir, &fd2, err, sizeof(err)), BW_OK);
    close(fd2);
    close(pipefd[0]);
    close(pipefd[1]);

    /* A state directory that cannot be created is a clear error. */
    char bad[600];
    snprintf(bad, sizeof(bad), "%s/LOCK/sub", dir);
    assert_int_equal(bw__state_dir_lock(bad, &fd2, err, sizeof(err)), BW_IO);
    assert_non_null(strstr(err, "cannot create"));
    rm_dir();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_group_commit),
        cmocka_unit_test(test_sync_hook),
        cmocka_unit_test(test_torn_tail_every_offset),
        cmocka_unit_test(test_flipped_bit_in_the_middle),
        cmocka_unit_test(test_rejected_record),
        cmocka_unit_test(test_record_out_of_memory),
        cmocka_unit_test(test_snapshot_and_tail),
        cmocka_unit_test(test_interrupted_compaction),
        cmocka_unit_test(test_compaction_due_across_reopens),
        cmocka_unit_test(test_disk_full),
        cmocka_unit_test(test_disk_full_rotation),
        cmocka_unit_test(test_state_dir_lock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
