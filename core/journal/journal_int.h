/* The journal's internals, shared by journal.c (writer, compaction) and journal_recover.c
 * (open and replay). Not for other modules. */
#ifndef BW_JOURNAL_JOURNAL_INT_H
#define BW_JOURNAL_JOURNAL_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "journal/journal.h"

#define BW_JOURNAL_FILE_MAGIC "BWJRNL01"
#define BW_SNAPSHOT_MAGIC "BWSNAP01"
enum { BW_JOURNAL_HEADER = 16, BW_RECORD_HEADER = 8, BW_SNAPSHOT_HEADER = 24 };

typedef struct bw_journal_waiter {
    uint64_t seq;
    bw_journal_done_fn fn;
    void *arg;
} bw_journal_waiter;

struct bw_journal {
    char *dir;
    int dirfd;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* the writer: something to do */
    pthread_cond_t done; /* durability, rotation and failure */
    pthread_t thread;
    bool thread_started;
    /* The notifier: runs the callbacks of records made durable, so that the writer goes on
     * to the next group commit while answers are sent (journal.c, "notifier"). */
    pthread_cond_t settle; /* the notifier: durable_seq moved, or the writer stopped */
    pthread_t notifier;
    bool notifier_started;
    bool writer_done; /* the writer has exited: the notifier settles what is left and stops */
    bool closing;
    int failed; /* errno of the first failed write/fsync */
    /* ENOSPC or EDQUOT while the disk is full: the last write found no space, was cut back,
     * and its records wait in `pending` to be tried again (journal.c, "A full disk"). */
    int full;
    uint64_t full_since_ms; /* bw__mono_ms() when it began */

    int fd;              /* the file being appended to (writer-owned after open) */
    uint64_t file_first; /* its first seq */
    uint64_t *old;       /* first seqs of earlier files still on disk */
    size_t nold, oldcap;

    uint8_t *pending; /* framed records queued for the writer */
    size_t plen, pcap;
    uint64_t next_seq;
    uint64_t durable_seq;
    bool rotate_pending; /* requested, not yet taken by the writer */
    bool rotating;       /* taken by the writer, not yet done */
    size_t rotate_at;    /* offset in `pending` where the new file starts */
    uint64_t rotate_seq; /* the new file's first seq */
    /* What the next snapshot makes redundant: the records (and their bytes) in journal
     * files after the last snapshot, counted from open on, and when the first of them was
     * appended (bw__mono_ms; 0: none). */
    uint64_t bytes_since_snapshot;
    uint64_t records_since_snapshot;
    uint64_t first_since_snapshot_ms;

    bw_journal_waiter *waiters;
    size_t nwaiters, wcap;

    bw_journal_sync_fn sync_hook; /* bw__journal_set_sync_hook; under mu */
    void *sync_user;
};

/* How often the writer tries the records that found the disk full again. */
enum { BW_JOURNAL_FULL_RETRY_MS = 200 };

/* Little-endian helpers. */
void bw__journal_put32(uint8_t *p, uint32_t v);
void bw__journal_put64(uint8_t *p, uint64_t v);
uint32_t bw__journal_get32(const uint8_t *p);
uint64_t bw__journal_get64(const uint8_t *p);

/* Creates journal file `first_seq` in j->dir (header written and fsynced through a temporary
 * name, then renamed and the directory fsynced); returns an fd open for appending or -1 with
 * errno set. */
int bw__journal_create_file(bw_journal *j, uint64_t first_seq);

/* Starts the writer and notifier threads. */
int bw__journal_start(bw_journal *j);

/* Frees the struct (no thread running, fd closed by the caller or -1). */
void bw__journal_free(bw_journal *j);

#endif
