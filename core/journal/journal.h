/*
 * An append-only journal with snapshots, in one directory, for state that must survive
 * kill -9 and power loss. The journal stores opaque records; the caller decides what they
 * mean.
 *
 * On disk (all integers little-endian):
 *   snapshot                  "BWSNAP01", u64 seq, u32 len, u32 crc32c(seq..payload), payload
 *   journal-<20-digit seq>    "BWJRNL01", u64 first seq, then records:
 *                             u32 len, u32 crc32c(len bytes + payload), payload
 * Records are numbered 1, 2, 3, ... with no gap: record i of journal-S has seq S + i. A
 * snapshot with seq S stands for records 1..S; journal files hold the records after it (and
 * possibly older ones not yet removed, which are skipped).
 *
 * Durability: bw__journal_append only queues a record; one writer thread writes everything
 * queued in one write() and one fdatasync() (group commit) and goes on to the next, while a
 * notifier thread runs the callbacks of every record that became durable, in turn.
 * Acknowledge a change only from such a callback.
 *
 * Recovery (bw__journal_open): loads the snapshot, replays the records after it in order, and
 * classifies a record that fails its checks:
 *   - torn tail: it is in the last file and no valid record follows it (a write cut short by
 *     a crash). The bytes from its offset on are cut off and the cut is reported.
 *   - corruption: anything else (a valid record follows, it is not in the last file, a seq
 *     gap, or the caller rejects a record). Opening fails with the file and the offset;
 *     `truncate_at` ("journal-...:OFFSET") cuts that file there (keeping the cut bytes in
 *     FILE.discarded-OFFSET, and later files renamed *.discarded) and opening goes on.
 *
 * Thread safety: append, rotate and the durability functions may be called from any thread;
 * callers serialise appends with their own state changes so that journal order is the order
 * in which changes were applied.
 */
#ifndef BW_JOURNAL_JOURNAL_H
#define BW_JOURNAL_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bw_journal bw_journal;

/* The largest record accepted (append and replay). */
#define BW_JOURNAL_MAX_RECORD (64u << 20)

/* Receives the snapshot (if any) during bw__journal_open. Returns BW_OK or an error with a
 * sentence in err; an error stops the open. */
typedef int (*bw_journal_snapshot_fn)(void *user, uint64_t seq, const uint8_t *data, size_t len,
                                      char *err, size_t errlen);

/* Receives each record after the snapshot, in order. An error marks the record as corrupt,
 * except BW_NOMEM: the record is not at fault, and the open stops with BW_NOMEM. */
typedef int (*bw_journal_record_fn)(void *user, uint64_t seq, const uint8_t *data, size_t len,
                                    char *err, size_t errlen);

/* What bw__journal_open found and did, for the caller to log. */
typedef struct bw_journal_report {
    uint64_t snapshot_seq;     /* 0: no snapshot */
    uint64_t records_replayed; /* records applied after the snapshot */
    uint64_t last_seq;         /* the last record now in the state */
    size_t files;              /* journal files read */
    uint64_t journal_bytes;    /* record bytes (with their headers) in the files kept */
    uint64_t journal_records;  /* records in the files kept */
    char notes[2048];          /* "" or sentences about torn tails and truncations */
} bw_journal_report;

/*
 * Opens (creating if needed) the journal in `dir` (which must exist and be locked by the
 * caller), replays it into the callbacks and starts the writer thread. `truncate_at` may be
 * NULL. On error returns BW_CORRUPT (with file and offset in err), BW_IO, BW_NOMEM or
 * BW_INVALID_ARGUMENT, and nothing is left open.
 */
int bw__journal_open(const char *dir, const char *truncate_at, bw_journal_snapshot_fn on_snapshot,
                     bw_journal_record_fn on_record, void *user, bw_journal **out,
                     bw_journal_report *report, char *err, size_t errlen);

/* Writes everything queued, waits for it to be durable, stops the writer and frees the
 * journal. Callbacks still pending run before it returns. NULL is a no-op. */
void bw__journal_close(bw_journal *j);

/* The seq the next appended record will get. */
uint64_t bw__journal_next_seq(bw_journal *j);

/* Queues a record (copied). Returns BW_OK with its seq in *seq, BW_TOO_BIG, BW_NOMEM (nothing
 * queued), BW_UNAVAILABLE while the disk is full (nothing queued; see bw__journal_full), or
 * BW_IO once the journal has failed (see bw__journal_failed). */
int bw__journal_append(bw_journal *j, const void *data, size_t len, uint64_t *seq);

/* Called with BW_OK once every record up to the seq given is durable, with BW_IO if the
 * journal failed first, with BW_UNAVAILABLE if the disk is full before it is durable (the
 * record stays queued and becomes durable once there is space; only this wait ends), or with
 * BW_NOMEM when the wait could not be recorded (the records still become durable; only this
 * notice is lost). */
typedef void (*bw_journal_done_fn)(void *arg, int rc);

/* Runs fn(arg, rc) once record `seq` is durable: at once, in the calling thread, when it
 * already is (or the journal has failed, or the disk is full, or memory for the wait ran
 * out: rc BW_NOMEM); otherwise later, on the journal's notifier thread (one thread: callbacks
 * never run concurrently with each other, and a slow one delays the others, not the disk). */
void bw__journal_when_durable(bw_journal *j, uint64_t seq, bw_journal_done_fn fn, void *arg);

/* Blocks until record `seq` is durable; returns BW_OK, BW_IO, or BW_UNAVAILABLE once the
 * disk is full before it is. */
int bw__journal_sync(bw_journal *j, uint64_t seq);

/* The highest durable seq. */
uint64_t bw__journal_durable_seq(bw_journal *j);

/* Nonzero (an errno) once a write or fsync failed: nothing more is acknowledged and the
 * process should exit so that a restart recovers from what is on disk. A full disk is not a
 * failure (bw__journal_full). */
int bw__journal_failed(bw_journal *j);

/*
 * A full disk: nonzero (ENOSPC or EDQUOT) while a write found no space. Such a write is cut
 * back (the file is truncated to where it was) and its records stay queued; the writer tries
 * them again every 200 ms and they become durable once there is space. Meanwhile appends,
 * rotations and waits for records not yet durable answer BW_UNAVAILABLE at once, so nothing
 * is acknowledged that is not on disk and nothing acknowledged is lost. A failed fdatasync
 * is never taken for a full disk: it fails the journal (bw__journal_failed). When full and
 * `why` is not NULL, says so in a sentence naming the directory, e.g. "journal /var/lib/bw:
 * No space left on device for 1200 ms (312 bytes of records wait; tried again every 200 ms)".
 */
int bw__journal_full(bw_journal *j, char *why, size_t whylen);

/* Record bytes (headers included) in the journal files that the next snapshot removes: those
 * found at open plus those appended since, until the last rotation. */
uint64_t bw__journal_bytes_since_snapshot(bw_journal *j);

/* Told after each group commit that made records durable: how long writing and fdatasync'ing
 * them took (seconds) and how many record bytes became durable. Runs on the writer thread with
 * the journal's lock held: it must be quick (count, observe) and must not call the journal. */
typedef void (*bw_journal_sync_fn)(void *user, double seconds, uint64_t bytes);

/* Sets (fn NULL: removes) the function told about each group commit, e.g. for metrics; once
 * it returns, the previous function is not called any more. */
void bw__journal_set_sync_hook(bw_journal *j, bw_journal_sync_fn fn, void *user);

/* When compaction is due (docs/operating.md, "Coordinator state"). A zero limit is off. */
typedef struct bw_journal_policy {
    uint64_t max_bytes;   /* bw__journal_bytes_since_snapshot reached this */
    uint64_t max_records; /* this many records since the snapshot */
    uint64_t max_age_ms;  /* the first record since the snapshot was appended this long ago
                             (records found at open count as appended at open) */
} bw_journal_policy;

/* True when a limit of `p` is reached, there is a record since the last snapshot and the disk
 * is not full (a snapshot needs space too); then
 * `why` (may be NULL) says which, e.g. "70000 journal bytes (limit 65536)". */
bool bw__journal_compaction_due(bw_journal *j, const bw_journal_policy *p, char *why,
                                size_t whylen);

/*
 * Compaction, step 1: records appended from now on go to a new file. Call it in the same
 * critical section in which the state that the snapshot will hold is captured, so that the
 * snapshot's seq is bw__journal_next_seq() - 1 at that moment. Returns BW_OK,
 * BW_UNAVAILABLE while a previous rotation is still pending or the disk is full, BW_NOMEM
 * (nothing rotated), or BW_IO once the journal has failed.
 */
int bw__journal_rotate(bw_journal *j, uint64_t *snapshot_seq);

/*
 * Compaction, step 2 (outside the critical section): waits for the rotation, writes the
 * snapshot (temporary file, fsync, rename, fsync of the directory) and removes the journal
 * files it makes redundant. On error (BW_UNAVAILABLE when the disk became full before the
 * rotation was done) the previous snapshot and all journal files remain.
 */
int bw__journal_write_snapshot(bw_journal *j, uint64_t seq, const void *data, size_t len, char *err,
                               size_t errlen);

/* Helpers shared with the tests: the file names used in `dir`. */
void bw__journal_file_name(uint64_t first_seq, char *out, size_t outlen);

#endif
