/* The jobs state without gRPC: cursors (binary and text, corrupt and foreign), the
 * configuration diff, that replaying the journal, with or without a snapshot, rebuilds
 * exactly the state the operations built, and that a left lease stays released. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "batchwire/batchwire.h"
#include "test_dir.h"
#include "server/jobs_int.h"
#include "common/crc32c.h"
#include "cursor/cursor.h"
#include "rpc/pbdiff.h"

static char dir[512];

static void fresh_dir(void)
{
    assert_int_equal(bw_test_dir_make(dir, sizeof(dir), "jobs"), 0);
}

static void rm_dir(void)
{
    assert_int_equal(bw_test_dir_remove(dir), 0);
}

static void test_cursor_codec(void **state)
{
    (void)state;
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__Cursor c = BATCHWIRE__V1__CURSOR__INIT;
    c.job = "j";
    c.job_fingerprint = 0x1234;
    c.rank = 3;
    c.world_size = 4;
    c.epoch = 2;
    c.step = 99;
    size_t len;
    uint8_t *bin = bw__cursor_encode(&c, &len);
    Batchwire__V1__Cursor *d;
    char err[256];
    assert_int_equal(bw__cursor_decode(bin, len, &a, &d, err, sizeof(err)), BW_OK);
    assert_int_equal(d->version, 1);
    assert_int_equal(d->step, 99);
    char text[256];
    assert_true(bw__cursor_to_text(bin, len, text, sizeof(text)) > 0);
    assert_memory_equal(text, "bwc1:", 5);
    assert_int_equal(bw__cursor_to_text(bin, len, text, 4), 0);
    assert_int_equal(bw__cursor_decode((uint8_t *)text, strlen(text), &a, &d, err, sizeof(err)),
                     BW_OK);
    assert_int_equal(d->rank, 3);
    assert_int_equal(d->job_fingerprint, 0x1234);
    /* Every truncation of the text form is refused or decodes to something checked. */
    for (size_t cut = 5; cut < strlen(text); cut++)
        if (bw__cursor_decode((uint8_t *)text, cut, &a, &d, err, sizeof(err)) == BW_OK)
            assert_true(d->rank < d->world_size);

    /* A flipped bit anywhere is caught by the checksum, never decoded as another position. */
    for (size_t i = 0; i < len * 8; i++) {
        bin[i / 8] ^= (uint8_t)(1u << (i % 8));
        assert_int_equal(bw__cursor_decode(bin, len, &a, &d, err, sizeof(err)),
                         BW_INVALID_ARGUMENT);
        bin[i / 8] ^= (uint8_t)(1u << (i % 8));
    }
    assert_int_equal(bw__cursor_decode(bin, len, &a, &d, err, sizeof(err)), BW_OK);

    struct {
        const char *bytes;
        size_t len;
        const char *needle;
        int seal; /* append a valid checksum: the structure itself is wrong */
    } bad[] = {
        {"", 0, "empty", 0},
        {"\xff\xff\xff", 3, "does not end with its checksum", 0},
        {"\x08\x01\x7d\x00\x00\x00\x00", 7, "checksum mismatch", 0},
        {"bwc1:@@@@", 9, "not base64", 0},
        {"bwc1:abc", 8, "multiple of 4", 0},
        {"bwc9:AAAA", 9, "unknown prefix", 0},
        {"\xff\xff\xff", 3, "corrupt", 1},
        {"\x08\x02", 2, "version 2", 1},
        {"\x08\x01", 2, "no job fingerprint", 1},
        {"\x08\x01\x19\x01\x00\x00\x00\x00\x00\x00\x00\x20\x05\x28\x02", 15, "not below", 1},
        /* Canonical form only (docs/security.md): an unknown field 0 in a non-minimal varint
         * key, found by fuzzing, and a field given twice, both with valid checksums. */
        {"\x08\x01\x19\x01\x19\xef\x01\x80\x20\x20\x20\x28\x42\x80\x00\x01", 16, "does not have",
         1},
        {"\x08\x01\x19\x01\x00\x00\x00\x00\x00\x00\x00\x28\x02\x28\x02", 15, "not in the form", 1},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint8_t sealed[64];
        size_t n = bad[i].len;
        memcpy(sealed, bad[i].bytes, n);
        if (bad[i].seal) {
            uint32_t crc = bw__crc32c(0, sealed, n);
            sealed[n++] = 0x7d;
            for (int k = 0; k < 4; k++)
                sealed[n++] = (uint8_t)(crc >> (8 * k));
        }
        int rc = bw__cursor_decode(sealed, n, &a, &d, err, sizeof(err));
        assert_int_equal(rc, BW_INVALID_ARGUMENT);
        if (!strstr(err, bad[i].needle))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, bad[i].needle);
    }
    /* The cursor of the report, whole: refused, so it can never be journaled. */
    const char *reported = "bwc1:CAEZARnvAYAgICAoQoAAAX2IPmCV";
    assert_int_equal(
        bw__cursor_decode((const uint8_t *)reported, strlen(reported), &a, &d, err, sizeof(err)),
        BW_INVALID_ARGUMENT);
    free(bin);
    bw__arena_reset(&a);
}

static void test_diff(void **state)
{
    (void)state;
    Batchwire__V1__SamplerConfig sa = BATCHWIRE__V1__SAMPLER_CONFIG__INIT,
                                 sb = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
    sa.mode = sb.mode = BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_TORCH;
    sa.batch_size = 4;
    sb.batch_size = 8;
    sb.seed = -3;
    char *srcs_a[] = {"a.npy"}, *srcs_b[] = {"a.npy", "b.npy"};
    Batchwire__V1__Dataset da = BATCHWIRE__V1__DATASET__INIT, db = BATCHWIRE__V1__DATASET__INIT;
    da.format = db.format = "npy";
    da.sources = srcs_a;
    da.n_sources = 1;
    db.sources = srcs_b;
    db.n_sources = 2;
    Batchwire__V1__JobConfig a = BATCHWIRE__V1__JOB_CONFIG__INIT,
                             b = BATCHWIRE__V1__JOB_CONFIG__INIT;
    a.sampler = &sa;
    b.sampler = &sb;
    a.dataset = &da;
    b.dataset = &db;
    char out[1024];
    bw__pb_diff(&batchwire__v1__job_config__descriptor, &a.base, "job", &b.base, "request", NULL, 0,
                out, sizeof(out));
    assert_non_null(strstr(out, "sampler.batch_size: job has 4, request has 8"));
    assert_non_null(strstr(out, "sampler.seed: job has 0, request has -3"));
    assert_non_null(
        strstr(out, "dataset.sources: job has [\"a.npy\"], request has [\"a.npy\", \"b.npy\"]"));
    assert_null(strstr(out, "mode"));
    b.dataset = NULL; /* absent compares like empty */
    bw__pb_diff(&batchwire__v1__job_config__descriptor, &a.base, "job", &b.base, "request", NULL, 0,
                out, sizeof(out));
    assert_non_null(strstr(out, "dataset.format: job has \"npy\", request has \"\""));
    bw__pb_diff(&batchwire__v1__job_config__descriptor, &a.base, "job", &a.base, "request", NULL, 0,
                out, sizeof(out));
    assert_string_equal(out, "");
}

/* The caller of every operation: the anonymous principal of an open service. */
static const bw_principal anyone = {BW_ROLE_OPEN, ""};
#define ANY (&anyone)

static bw_jobs *open_jobs(void)
{
    bw_jobs_opts o = {dir, NULL, 60000, 100, 100, 1000, 0};
    bw_jobs *s = NULL;
    bw_journal_report rep;
    char err[1024];
    if (bw__jobs_open(&o, &s, &rep, err, sizeof(err)) != BW_OK)
        fail_msg("open: %s", err);
    return s;
}

/* The observable state, packed, with the clock-dependent fields zeroed. */
static size_t observe(bw_jobs *s, uint8_t *buf, size_t cap)
{
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__ListJobsResponse *l;
    uint64_t ws;
    char err[256];
    assert_int_equal(bw__jobs_list(s, ANY, &a, &l, &ws, err, sizeof(err)), BW_OK);
    size_t used = batchwire__v1__list_jobs_response__pack(l, buf);
    for (size_t i = 0; i < l->n_jobs; i++) {
        Batchwire__V1__GetJobRequest g = BATCHWIRE__V1__GET_JOB_REQUEST__INIT;
        g.name = l->jobs[i]->name;
        Batchwire__V1__GetJobResponse *r;
        assert_int_equal(bw__jobs_get(s, ANY, &g, &a, &r, &ws, err, sizeof(err)), BW_OK);
        for (size_t k = 0; k < r->n_ranks; k++)
            r->ranks[k]->ms_since_heartbeat = 0;
        assert_true(used + batchwire__v1__get_job_response__get_packed_size(r) < cap);
        used += batchwire__v1__get_job_response__pack(r, buf + used);
    }
    bw__arena_reset(&a);
    return used;
}

static int leave(bw_jobs *s, const char *job, uint32_t rank, bw_lease lease, bool *released)
{
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__LeaveJobRequest req = BATCHWIRE__V1__LEAVE_JOB_REQUEST__INIT;
    req.job = (char *)job;
    req.rank = rank;
    req.lease_id = lease.lo;
    req.lease_id_hi = lease.hi;
    Batchwire__V1__LeaveJobResponse *resp = NULL;
    uint64_t ws;
    char err[512];
    int rc = bw__jobs_leave(s, ANY, &req, &a, &resp, &ws, err, sizeof(err));
    *released = rc == BW_OK && resp->released;
    if (rc == BW_OK)
        assert_int_equal(bw__journal_sync(bw__jobs_journal(s), ws), BW_OK);
    bw__arena_reset(&a);
    return rc;
}

static int join(bw_jobs *s, const char *job, uint32_t rank, uint32_t pid, bw_lease *lease)
{
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__Holder h = BATCHWIRE__V1__HOLDER__INIT;
    h.host = "node";
    h.pid = pid;
    Batchwire__V1__JoinJobRequest req = BATCHWIRE__V1__JOIN_JOB_REQUEST__INIT;
    req.job = (char *)job;
    req.rank = rank;
    req.world_size = 4;
    req.holder = &h;
    Batchwire__V1__JoinJobResponse *resp = NULL;
    uint64_t ws;
    char err[1024];
    int rc = bw__jobs_join(s, ANY, &req, &a, &resp, &ws, err, sizeof(err));
    if (rc == BW_OK) {
        *lease = (bw_lease){resp->lease_id, resp->lease_id_hi};
        assert_int_equal(bw__journal_sync(bw__jobs_journal(s), ws), BW_OK);
    }
    bw__arena_reset(&a);
    return rc;
}

/* Creates job `name` over a described dataset (no worker needed); BW_OK or the refusal. */
static int create(bw_jobs *s, const char *name, Batchwire__V1__JobConfig *cfg,
                  const Batchwire__V1__DatasetInfo *info, uint32_t world, char *err, size_t errlen)
{
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__GetOrCreateJobRequest req = BATCHWIRE__V1__GET_OR_CREATE_JOB_REQUEST__INIT;
    req.name = (char *)name;
    req.config = cfg;
    req.world_size = world;
    Batchwire__V1__GetOrCreateJobResponse *cr;
    uint64_t ws;
    bool need = false;
    int rc = bw__jobs_lookup(s, ANY, &req, &a, &cr, &need, &ws, err, errlen);
    if (rc == BW_OK && need)
        rc = bw__jobs_create(s, ANY, &req, info, &a, &cr, &ws, err, errlen);
    bw__arena_reset(&a);
    return rc;
}

static void build_state(bw_jobs *s)
{
    bw_arena a;
    bw__arena_init(&a, 0);
    char err[1024];
    uint64_t ws;
    Batchwire__V1__SamplerConfig sc = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
    sc.mode = BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_TORCH;
    sc.batch_size = 10;
    sc.shuffle = true;
    Batchwire__V1__JobConfig cfg = BATCHWIRE__V1__JOB_CONFIG__INIT;
    cfg.sampler = &sc;
    cfg.synthetic_samples = 1000;
    char name[16];
    for (int j = 0; j < 3; j++) {
        snprintf(name, sizeof(name), "job%d", j);
        assert_null(bw__jobs_find(s, name));
        assert_int_equal(
            create(s, name, &cfg, bw__jobs_synthetic_info(&a, 1000), 4, err, sizeof(err)), BW_OK);
    }
    uint64_t fp = bw__jobs_find(s, "job2")->fingerprint;
    bw_lease leases[4];
    for (uint32_t r = 0; r < 4; r++)
        assert_int_equal(join(s, "job2", r, 10 + r, &leases[r]), BW_OK);
    /* job0: rank 0 held, rank 1 joined and left (RankLeft must replay too) */
    bw_lease held, left;
    bool released = false;
    assert_int_equal(join(s, "job0", 0, 20, &held), BW_OK);
    assert_int_equal(join(s, "job0", 1, 21, &left), BW_OK);
    assert_int_equal(leave(s, "job0", 1, left, &released), BW_OK);
    assert_true(released);
    uint8_t *curs[4];
    ProtobufCBinaryData cb[4];
    for (uint32_t r = 0; r < 4; r++) {
        for (uint64_t step = 1; step <= 5; step++) {
            Batchwire__V1__Cursor c = BATCHWIRE__V1__CURSOR__INIT;
            c.job_fingerprint = fp;
            c.rank = r;
            c.world_size = 4;
            c.step = step;
            size_t len;
            uint8_t *bin = bw__cursor_encode(&c, &len);
            Batchwire__V1__CommitCursorRequest cc = BATCHWIRE__V1__COMMIT_CURSOR_REQUEST__INIT;
            cc.job = "job2";
            cc.rank = r;
            cc.lease_id = leases[r].lo;
            cc.lease_id_hi = leases[r].hi;
            cc.cursor.data = bin;
            cc.cursor.len = len;
            Batchwire__V1__CommitCursorResponse *resp;
            assert_int_equal(bw__jobs_commit(s, ANY, &cc, &a, &resp, &ws, err, sizeof(err)), BW_OK);
            if (step == 5) {
                curs[r] = bin;
                cb[r].data = bin;
                cb[r].len = len;
            } else {
                free(bin);
            }
        }
    }
    Batchwire__V1__ResumeElasticRequest rr = BATCHWIRE__V1__RESUME_ELASTIC_REQUEST__INIT;
    rr.job = "job2";
    rr.world_size = 3;
    rr.cursors = cb;
    rr.n_cursors = 4;
    Batchwire__V1__ResumeElasticResponse *rresp;
    if (bw__jobs_resume(s, ANY, &rr, &a, &rresp, &ws, err, sizeof(err)) != BW_OK)
        fail_msg("resume: %s", err);
    assert_true(rresp->resumed);
    assert_int_equal(rresp->job->n_history, 2);
    for (int r = 0; r < 4; r++)
        free(curs[r]);
    assert_int_equal(bw__journal_sync(bw__jobs_journal(s), ws), BW_OK);
    bw__arena_reset(&a);
}

static void test_replay_rebuilds_state(void **state)
{
    (void)state;
    fresh_dir();
    static uint8_t before[1 << 16], after[1 << 16];
    bw_jobs *s = open_jobs();
    build_state(s);
    size_t n1 = observe(s, before, sizeof(before));
    bw__jobs_close(s);

    s = open_jobs(); /* journal only */
    size_t n2 = observe(s, after, sizeof(after));
    assert_int_equal(n1, n2);
    assert_memory_equal(before, after, n1);
    char err[512];
    assert_int_equal(bw__jobs_compact(s, 1, err, sizeof(err)), BW_OK);
    bw__jobs_close(s);

    s = open_jobs(); /* snapshot only */
    n2 = observe(s, after, sizeof(after));
    assert_int_equal(n1, n2);
    assert_memory_equal(before, after, n1);
    bw__jobs_close(s);
    rm_dir();
}

/* Jobs created and deleted in any order are found by name (s->jobs is kept sorted for a binary
 * search), listed in name order, and the same after a replay. */
static void test_find_many(void **state)
{
    (void)state;
    fresh_dir();
    bw_jobs *s = open_jobs();
    bw_arena a;
    bw__arena_init(&a, 0);
    char err[1024], name[32];
    uint64_t ws;
    Batchwire__V1__SamplerConfig sc = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
    sc.mode = BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_TORCH;
    sc.batch_size = 10;
    Batchwire__V1__JobConfig cfg = BATCHWIRE__V1__JOB_CONFIG__INIT;
    cfg.sampler = &sc;
    cfg.synthetic_samples = 100;
    enum { N = 61 };
    for (int k = 0; k < N; k++) { /* 37 k mod 61: every number once, not in order */
        snprintf(name, sizeof(name), "job-%02d", (37 * k) % N);
        assert_int_equal(
            create(s, name, &cfg, bw__jobs_synthetic_info(&a, 100), 2, err, sizeof(err)), BW_OK);
    }
    for (int i = 0; i < N; i += 3) {
        Batchwire__V1__DeleteJobRequest d = BATCHWIRE__V1__DELETE_JOB_REQUEST__INIT;
        Batchwire__V1__DeleteJobResponse *dr;
        snprintf(name, sizeof(name), "job-%02d", i);
        d.job = name;
        assert_int_equal(bw__jobs_delete(s, ANY, &d, &a, &dr, &ws, err, sizeof(err)), BW_OK);
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < N; i++) {
            snprintf(name, sizeof(name), "job-%02d", i);
            bw_job *j = bw__jobs_find(s, name);
            if (i % 3 == 0)
                assert_null(j);
            else
                assert_true(j && strcmp(j->name, name) == 0);
        }
        assert_null(bw__jobs_find(s, "job-"));
        assert_null(bw__jobs_find(s, "job-999"));
        Batchwire__V1__ListJobsResponse *l;
        assert_int_equal(bw__jobs_list(s, ANY, &a, &l, &ws, err, sizeof(err)), BW_OK);
        assert_int_equal(l->n_jobs, N - (N + 2) / 3);
        for (size_t i = 1; i < l->n_jobs; i++)
            assert_true(strcmp(l->jobs[i - 1]->name, l->jobs[i]->name) < 0);
        assert_int_equal(bw__journal_sync(bw__jobs_journal(s), ws), BW_OK);
        bw__jobs_close(s);
        s = open_jobs(); /* the second pass: the same after a replay */
    }
    bw__jobs_close(s);
    bw__arena_reset(&a);
    rm_dir();
}

/* Only the current lease releases a rank; the release survives a restart (journal and
 * snapshot), where an unreleased lease is renewed. */
static void test_leave(void **state)
{
    (void)state;
    fresh_dir();
    bw_jobs *s = open_jobs();
    build_state(s);
    bw_lease a = {0, 0}, b = {0, 0}, c = {0, 0}, none = {0, 0};
    bool released = true;
    assert_int_equal(join(s, "job1", 2, 100, &a), BW_OK);
    assert_int_equal(join(s, "job1", 2, 200, &b), BW_ALREADY_EXISTS);
    assert_int_equal(leave(s, "job1", 2, (bw_lease){a.lo, a.hi ^ 1}, &released), BW_OK);
    assert_false(released); /* someone else's lease id */
    assert_int_equal(join(s, "job1", 2, 200, &b), BW_ALREADY_EXISTS);
    assert_int_equal(leave(s, "job1", 2, none, &released), BW_INVALID_ARGUMENT);
    assert_int_equal(leave(s, "nosuch", 2, a, &released), BW_NOT_FOUND);
    assert_int_equal(leave(s, "job1", 9, a, &released), BW_OUT_OF_RANGE);
    assert_int_equal(leave(s, "job1", 2, a, &released), BW_OK);
    assert_true(released);
    assert_int_equal(leave(s, "job1", 2, a, &released), BW_OK);
    assert_false(released);                               /* a retry */
    assert_int_equal(join(s, "job1", 2, 200, &b), BW_OK); /* at once, not after 60 s */
    assert_false(bw__lease_eq(b, a));
    assert_int_equal(leave(s, "job1", 2, a, &released), BW_OK);
    assert_false(released); /* the old lease cannot release the new holder's */
    assert_int_equal(leave(s, "job1", 2, b, &released), BW_OK);
    assert_true(released);
    assert_int_equal(join(s, "job1", 3, 300, &c), BW_OK); /* held across the restarts */
    bw__jobs_close(s);

    for (int round = 0; round < 2; round++) { /* journal, then snapshot */
        s = open_jobs();
        bw_job *job = bw__jobs_find(s, "job1");
        assert_non_null(job);
        assert_false(job->ranks[2].leased);
        assert_true(job->ranks[3].leased);
        assert_true(bw__lease_eq(job->ranks[3].lease, c));
        assert_false(bw__jobs_find(s, "job0")->ranks[1].leased);
        assert_true(bw__jobs_find(s, "job0")->ranks[0].leased);
        assert_int_equal(leave(s, "job1", 2, b, &released), BW_OK);
        assert_false(released);
        bw_lease d = {0, 0};
        assert_int_equal(join(s, "job1", 3, 400, &d), BW_ALREADY_EXISTS);
        if (round == 0) {
            char err[512];
            assert_int_equal(bw__jobs_compact(s, 1, err, sizeof(err)), BW_OK);
        }
        bw__jobs_close(s);
    }
    rm_dir();
}

/* Commits (epoch 0, step) for rank r of job `name` at world size `world`. */
static int commit_step(bw_jobs *s, const char *name, uint32_t r, uint32_t world, bw_lease lease,
                       uint64_t step, char *err, size_t errlen)
{
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__Cursor c = BATCHWIRE__V1__CURSOR__INIT;
    c.job_fingerprint = bw__jobs_find(s, name)->fingerprint;
    c.rank = r;
    c.world_size = world;
    c.step = step;
    size_t len;
    uint8_t *bin = bw__cursor_encode(&c, &len);
    assert_non_null(bin);
    Batchwire__V1__CommitCursorRequest cc = BATCHWIRE__V1__COMMIT_CURSOR_REQUEST__INIT;
    cc.job = (char *)name;
    cc.rank = r;
    cc.lease_id = lease.lo;
    cc.lease_id_hi = lease.hi;
    cc.cursor.data = bin;
    cc.cursor.len = len;
    Batchwire__V1__CommitCursorResponse *resp;
    uint64_t ws;
    int rc = bw__jobs_commit(s, ANY, &cc, &a, &resp, &ws, err, errlen);
    free(bin);
    bw__arena_reset(&a);
    return rc;
}

/* The coordinator counts steps with the planner: a pre-sharded stream's ranks each have the
 * longest source's batches (a cursor there is accepted, one past it refused), a pre-sharded
 * job cannot change its world size, a source without records is refused at creation, and a
 * feistel-shuffled job is accepted. */
static void test_plan_checks(void **state)
{
    (void)state;
    fresh_dir();
    bw_jobs *s = open_jobs();
    char err[1536];
    const uint64_t records[4] = {10, 7, 9, 4};
    Batchwire__V1__SourceInfo src[4];
    Batchwire__V1__SourceInfo *srcs[4];
    char *paths[4] = {"p0.jsonl", "p1.jsonl", "p2.jsonl", "p3.jsonl"};
    for (int i = 0; i < 4; i++) {
        batchwire__v1__source_info__init(&src[i]);
        src[i].path = paths[i];
        src[i].records = records[i];
        srcs[i] = &src[i];
    }
    Batchwire__V1__DatasetInfo info = BATCHWIRE__V1__DATASET_INFO__INIT;
    info.format = "jsonl";
    info.length = 30;
    info.fingerprint = "f";
    info.sources = srcs;
    info.n_sources = 4;
    Batchwire__V1__Dataset ds = BATCHWIRE__V1__DATASET__INIT;
    ds.format = "jsonl";
    ds.sources = paths;
    ds.n_sources = 4;
    ds.pre_sharded = true;
    Batchwire__V1__SamplerConfig sc = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
    sc.mode = BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_ITERABLE;
    sc.batch_size = 3;
    Batchwire__V1__JobConfig cfg = BATCHWIRE__V1__JOB_CONFIG__INIT;
    cfg.sampler = &sc;
    cfg.dataset = &ds;
    if (create(s, "ps", &cfg, &info, 4, err, sizeof(err)) != BW_OK)
        fail_msg("create: %s", err);
    /* ceil(10 / 3) = 4 steps for every rank; the whole stream would give ceil(30 / 12) = 3. */
    for (uint32_t r = 0; r < 4; r++) {
        bw_lease lease = {0, 0};
        assert_int_equal(join(s, "ps", r, 50 + r, &lease), BW_OK);
        assert_int_equal(commit_step(s, "ps", r, 4, lease, 4, err, sizeof(err)), BW_OK);
        assert_int_equal(commit_step(s, "ps", r, 4, lease, 5, err, sizeof(err)), BW_OUT_OF_RANGE);
        assert_non_null(strstr(err, "(4 steps)"));
    }
    sc.drop_last = true; /* floor(4 / 3) = 1 step for every rank */
    if (create(s, "ps-drop", &cfg, &info, 4, err, sizeof(err)) != BW_OK)
        fail_msg("create: %s", err);
    bw_lease lease = {0, 0};
    assert_int_equal(join(s, "ps-drop", 2, 60, &lease), BW_OK);
    assert_int_equal(commit_step(s, "ps-drop", 2, 4, lease, 1, err, sizeof(err)), BW_OK);
    assert_int_equal(commit_step(s, "ps-drop", 2, 4, lease, 2, err, sizeof(err)), BW_OUT_OF_RANGE);

    /* A pre-sharded job keeps one source per rank: no elastic resume to 3 ranks. */
    bw_arena a;
    bw__arena_init(&a, 0);
    ProtobufCBinaryData cb[4];
    for (uint32_t r = 0; r < 4; r++) {
        Batchwire__V1__Cursor c = BATCHWIRE__V1__CURSOR__INIT;
        c.job_fingerprint = bw__jobs_find(s, "ps")->fingerprint;
        c.rank = r;
        c.world_size = 4;
        c.step = 1;
        cb[r].data = bw__cursor_encode(&c, &cb[r].len);
    }
    Batchwire__V1__ResumeElasticRequest rr = BATCHWIRE__V1__RESUME_ELASTIC_REQUEST__INIT;
    rr.job = "ps";
    rr.world_size = 3;
    rr.cursors = cb;
    rr.n_cursors = 4;
    Batchwire__V1__ResumeElasticResponse *rresp;
    uint64_t ws;
    assert_int_equal(bw__jobs_resume(s, ANY, &rr, &a, &rresp, &ws, err, sizeof(err)),
                     BW_FAILED_PRECONDITION);
    assert_non_null(strstr(err, "one source per rank"));
    assert_int_equal(bw__jobs_find(s, "ps")->nhistory, 1);
    for (int r = 0; r < 4; r++)
        free(cb[r].data);
    bw__arena_reset(&a);

    /* Refused at creation: a rank whose source has no records could not be padded. */
    src[3].records = 0;
    info.length = 26;
    sc.drop_last = false;
    assert_int_equal(create(s, "ps-empty", &cfg, &info, 4, err, sizeof(err)), BW_INVALID_ARGUMENT);
    assert_non_null(strstr(err, "source 3 (rank 3's) has no records"));

    /* A feistel-shuffled job: its step counts need no order. */
    Batchwire__V1__SamplerConfig fs = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
    fs.mode = BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_TORCH;
    fs.batch_size = 10;
    fs.shuffle = true;
    fs.shuffle_algo = BATCHWIRE__V1__SHUFFLE_ALGO__SHUFFLE_ALGO_FEISTEL;
    Batchwire__V1__JobConfig fc = BATCHWIRE__V1__JOB_CONFIG__INIT;
    fc.sampler = &fs;
    fc.synthetic_samples = 1000;
    bw__arena_init(&a, 0);
    if (create(s, "feistel", &fc, bw__jobs_synthetic_info(&a, 1000), 4, err, sizeof(err)) != BW_OK)
        fail_msg("create feistel: %s", err);
    bw__arena_reset(&a);
    assert_int_equal(join(s, "feistel", 1, 70, &lease), BW_OK);
    assert_int_equal(commit_step(s, "feistel", 1, 4, lease, 25, err, sizeof(err)), BW_OK);
    assert_int_equal(commit_step(s, "feistel", 1, 4, lease, 26, err, sizeof(err)), BW_OUT_OF_RANGE);
    bw__jobs_close(s);
    rm_dir();
}

static int accept_any(void *user, uint64_t seq, const uint8_t *data, size_t len, char *err,
                      size_t errlen)
{
    (void)user, (void)seq, (void)data, (void)len, (void)err, (void)errlen;
    return BW_OK;
}

/* A snapshot whose job has no world-size history is refused as inconsistent (every plan
 * starts from the history), and nothing of it is kept. */
static void test_snapshot_without_history(void **state)
{
    (void)state;
    fresh_dir();
    Batchwire__V1__SamplerConfig sc = BATCHWIRE__V1__SAMPLER_CONFIG__INIT;
    sc.mode = BATCHWIRE__V1__SAMPLER_MODE__SAMPLER_MODE_TORCH;
    sc.batch_size = 2;
    Batchwire__V1__JobConfig cfg = BATCHWIRE__V1__JOB_CONFIG__INIT;
    cfg.sampler = &sc;
    cfg.synthetic_samples = 10;
    Batchwire__V1__DatasetInfo info = BATCHWIRE__V1__DATASET_INFO__INIT;
    info.length = 10;
    Batchwire__V1__JobSummary sum = BATCHWIRE__V1__JOB_SUMMARY__INIT;
    sum.name = "nohist";
    sum.config = &cfg;
    sum.dataset = &info;
    sum.fingerprint = 7;
    sum.world_size = 2;
    Batchwire__V1__JobSnapshot js = BATCHWIRE__V1__JOB_SNAPSHOT__INIT;
    js.job = &sum;
    Batchwire__V1__JobSnapshot *jobs[1] = {&js};
    Batchwire__V1__Snapshot snap = BATCHWIRE__V1__SNAPSHOT__INIT;
    snap.jobs = jobs;
    snap.n_jobs = 1;
    uint8_t buf[512];
    assert_true(batchwire__v1__snapshot__get_packed_size(&snap) < sizeof(buf));
    size_t len = batchwire__v1__snapshot__pack(&snap, buf);

    bw_journal *j = NULL;
    bw_journal_report rep;
    char err[1024];
    assert_int_equal(
        bw__journal_open(dir, NULL, accept_any, accept_any, NULL, &j, &rep, err, sizeof(err)),
        BW_OK);
    uint64_t seq = 0;
    assert_int_equal(bw__journal_rotate(j, &seq), BW_OK);
    assert_int_equal(seq, 0);
    assert_int_equal(bw__journal_write_snapshot(j, seq, buf, len, err, sizeof(err)), BW_OK);
    bw__journal_close(j);

    bw_jobs_opts o = {dir, NULL, 60000, 100, 100, 1000, 0};
    bw_jobs *s = (bw_jobs *)1;
    assert_int_equal(bw__jobs_open(&o, &s, &rep, err, sizeof(err)), BW_CORRUPT);
    assert_null(s);
    if (!strstr(err, "snapshot is inconsistent: a job without a summary or world-size history"))
        fail_msg("%s", err);
    rm_dir();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cursor_codec),
        cmocka_unit_test(test_diff),
        cmocka_unit_test(test_replay_rebuilds_state),
        cmocka_unit_test(test_find_many),
        cmocka_unit_test(test_leave),
        cmocka_unit_test(test_plan_checks),
        cmocka_unit_test(test_snapshot_without_history),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
