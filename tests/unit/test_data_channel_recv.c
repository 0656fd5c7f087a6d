/* The data-channel client's receiving (client/lib/data_channel.c; docs/data-channel.md,
 * "Protocol"): a listener standing for a worker answers one request with scripted frames,
 * written in pieces of random sizes with pauses between some, so that reads end inside frame
 * headers and inside samples. Fixed-size samples go through the many-at-a-time path (the sink
 * peeks, as the fetch loop's does for fixed-size samples), and without peek through the usual
 * one; either way every byte lands in its place, samples count in order, and an ERROR frame,
 * an early END, an unexpected sample or a connection cut mid-sample ends the request as the
 * protocol says, with the samples before it complete. The same against a worker older than
 * the FEATURES request (the client asks again without it), and RUN frames ("Versions", "RUN
 * frames"): runs of every length among SAMPLE frames land byte for byte; a run longer than
 * the samples due, of other samples, of size 0 or on a connection that did not ask for runs,
 * and a FEATURES answer naming features not offered, end the request with BW_PROTOCOL and
 * write nothing outside the places of the samples due (the batch buffer is exactly their
 * size: ASan sees any write past it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../client/lib/transport.h"
#include "data.pb-c.h"
#include "fake_dchan_worker.h"
#include "rpc/dchan.h"

/* ---- the scripted worker ---- */

typedef struct script {
    uint8_t *bytes;
    size_t len, cap;
    bool cut; /* close the connection after the bytes (else keep it open until the client
               * has read them) */
} script;

static void put(script *s, const void *p, size_t n)
{
    if (s->len + n > s->cap) {
        s->cap = (s->len + n) * 2;
        s->bytes = realloc(s->bytes, s->cap);
        assert_non_null(s->bytes);
    }
    memcpy(s->bytes + s->len, p, n);
    s->len += n;
}

static void put_frame(script *s, uint32_t type, int32_t code, uint64_t a, uint64_t b)
{
    uint8_t h[BW_DCHAN_FRAME_HEADER];
    bw_dchan_frame f = {type, (uint32_t)code, a, b};
    bw__dchan_put_frame(h, &f);
    put(s, h, sizeof(h));
}

static uint8_t pattern(uint64_t key, size_t i)
{
    return (uint8_t)(key * 31 + i * 7 + 1);
}

/* A SAMPLE frame for key with size bytes of its pattern. */
static void put_sample(script *s, uint64_t key, size_t size)
{
    put_frame(s, BW_DCHAN_SAMPLE, 0, key, size);
    for (size_t i = 0; i < size; i++) {
        uint8_t b = pattern(key, i);
        put(s, &b, 1);
    }
}

/* A RUN frame of keys[0..count), size bytes each, of their patterns. */
static void put_run(script *s, const uint64_t *keys, uint32_t count, size_t size)
{
    put_frame(s, BW_DCHAN_RUN, (int32_t)count, keys[0], size);
    for (uint32_t k = 0; k < count; k++)
        for (size_t i = 0; i < size; i++) {
            uint8_t b = pattern(keys[k], i);
            put(s, &b, 1);
        }
}

typedef struct worker {
    int lfd;
    script *sc;
    unsigned seed;
    size_t max_piece;
    fake_versions v;
    fake_request req;
} worker;

static void *serve(void *arg)
{
    worker *w = arg;
    int fd = fake_accept_request(w->lfd, &w->v, &w->req);
    if (fd >= 0) {
        unsigned r = w->seed;
        for (size_t off = 0; off < w->sc->len;) {
            r = r * 1103515245u + 12345u;
            size_t n = 1 + (r >> 8) % w->max_piece;
            if (n > w->sc->len - off)
                n = w->sc->len - off;
            ssize_t wr = send(fd, w->sc->bytes + off, n, MSG_NOSIGNAL);
            if (wr <= 0)
                break;
            off += (size_t)wr;
            if ((r >> 20) % 4 == 0)
                usleep(300); /* the client reads what came so far */
        }
        if (!w->sc->cut) { /* until the client has read everything and closed or pooled it */
            struct pollfd pf = {fd, POLLIN, 0};
            poll(&pf, 1, 10000); /* (longer than run_v waits for a quiet descriptor) */
        }
        close(fd);
    }
    return NULL;
}

/* ---- the sink: fixed-size samples, as the fetch loop's ---- */

/* How the sink works (the `mode` of run_v): place() alone; with peek; with peek, span and
 * landed (as the fetch loop's); and both again with places that do not all follow one
 * another (every third sample's place is followed by a gap), so that a read posts several
 * pieces. */
enum { PLAIN, PEEK, SPAN, PEEK_GAPS, SPAN_GAPS, MODES };

typedef struct sinkctx {
    const uint64_t *keys;
    size_t n, k;
    uint64_t size;
    uint8_t *buf;
    unsigned places;
    bool gaps;
    size_t spans, landed; /* calls of span that gave samples, samples counted by landed */
} sinkctx;

/* Samples each mode's sinks counted through landed, over every request so far. */
static size_t landed_in[MODES];

/* Where sample k goes: back to back, or with a sample's gap after every third one. */
static size_t slot(const sinkctx *c, size_t k)
{
    return c->gaps ? k + k / 3 : k;
}

static int place(void *arg, uint64_t key, uint64_t size, uint64_t chunk_off, uint64_t len,
                 uint8_t **dest, char *err, size_t errlen)
{
    sinkctx *c = arg;
    if (c->k >= c->n || key != c->keys[c->k] || size != c->size || chunk_off || len != size) {
        snprintf(err, errlen, "sample %llu where %llu was due", (unsigned long long)key,
                 (unsigned long long)(c->k < c->n ? c->keys[c->k] : 0));
        return BW_PROTOCOL;
    }
    c->places++;
    *dest = c->buf + slot(c, c->k) * c->size;
    return BW_OK;
}

static void arrived(void *arg, uint64_t len)
{
    sinkctx *c = arg;
    assert_int_equal(len, c->size);
    c->k++;
}

static bool peek(void *arg, size_t ahead, uint64_t *key, uint64_t *size, uint8_t **dest)
{
    sinkctx *c = arg;
    if (c->k + ahead >= c->n)
        return false;
    *key = c->keys[c->k + ahead];
    *size = c->size;
    *dest = c->buf + slot(c, c->k + ahead) * c->size;
    return true;
}

static size_t span(void *arg, size_t ahead, const uint64_t *keys, size_t n, uint64_t size,
                   uint8_t **dest)
{
    sinkctx *c = arg;
    size_t m = 0;
    while (m < n && c->k + ahead + m < c->n && keys[m] == c->keys[c->k + ahead + m] &&
           size == c->size && (m == 0 || slot(c, c->k + ahead + m) == slot(c, c->k + ahead) + m))
        m++;
    if (m) {
        *dest = c->buf + slot(c, c->k + ahead) * c->size;
        c->spans++;
    }
    return m;
}

static void landed(void *arg, size_t k, uint64_t size)
{
    sinkctx *c = arg;
    assert_int_equal(size, c->size);
    assert_true(c->k + k <= c->n);
    c->k += k;
    c->landed += k;
}

/* Runs one request against a worker (versions as v; what it saw in *seen, may be NULL)
 * answering `sc` in pieces of at most max_piece bytes; the sink expects keys[0..n) of `size`
 * bytes. Returns the request's outcome; *done: samples that arrived, checked byte for byte. */
static int run_v(script *sc, const uint64_t *keys, size_t n, size_t size, int mode,
                 size_t max_piece, unsigned seed, const fake_versions *v, fake_request *seen,
                 size_t *done, bw__xres *res)
{
    char err[256];
    bw__worker_opts wo;
    memset(&wo, 0, sizeof(wo));
    bw__transport t;
    assert_int_equal(bw__transport_open(&bw__transport_dchan_ops, &wo, &t, err, sizeof(err)),
                     BW_OK);
    worker w;
    memset(&w, 0, sizeof(w));
    w.lfd = -1;
    w.sc = sc;
    w.seed = seed;
    w.max_piece = max_piece;
    w.v = *v;
    int port = 0;
    assert_int_equal(bw__sock_listen("127.0.0.1:0", &w.lfd, &port, err, sizeof(err)), BW_OK);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, serve, &w), 0);
    char daddr[64];
    snprintf(daddr, sizeof(daddr), "127.0.0.1:%d", port);
    bw__worker_ref wr = {"w-test", "127.0.0.1:1", daddr};
    /* the request asks for the keys the sink expects (a RUN frame's samples are its next) */
    uint64_t none = 0;
    Batchwire__V1__ReadSamplesRequest rs = BATCHWIRE__V1__READ_SAMPLES_REQUEST__INIT;
    rs.indices = n ? (uint64_t *)keys : &none;
    rs.n_indices = n;
    bw__read_req req = {BW_DCHAN_KIND_READ_SAMPLES, &rs.base};
    bw__xfer *x = NULL;
    memset(res, 0, sizeof(*res));
    assert_int_equal(t.ops->start(t.state, &wr, &req, 10000, &x, res), BW_OK);
    uint8_t *buf = calloc(n ? n + n / 3 : 1, size ? size : 1);
    assert_non_null(buf);
    sinkctx c = {keys, n, 0, size, buf, 0, mode == PEEK_GAPS || mode == SPAN_GAPS, 0, 0};
    bool spans = mode == SPAN || mode == SPAN_GAPS;
    bw__sink sink = {place,
                     arrived,
                     &c,
                     mode == PLAIN ? NULL : peek,
                     spans ? span : NULL,
                     spans ? landed : NULL};
    while (!t.ops->recv(x, &sink, res)) {
        /* Every byte the worker sends wakes the descriptor in time: inside a RUN the client
         * asks to be woken only once bytes the run still owes have come (wait_more), never
         * for more than that -- so a quiet descriptor here is a request that hangs. */
        struct pollfd pf = {t.ops->fd(x), POLLIN, 0};
        if (poll(&pf, 1, 3000) == 0)
            fail_msg("the request's descriptor stayed quiet for 3 s (%zu of %zu samples in)", c.k,
                     n);
    }
    t.ops->finish(x);
    bw__transport_close(&t); /* closes the pooled connection: the worker's thread ends */
    pthread_join(th, NULL);
    close(w.lfd);
    for (size_t k = 0; k < c.k; k++)
        for (size_t i = 0; i < size; i++)
            if (buf[slot(&c, k) * size + i] != pattern(keys[k], i))
                fail_msg("sample %zu (key %llu) byte %zu: %u, want %u", k,
                         (unsigned long long)keys[k], i, buf[slot(&c, k) * size + i],
                         pattern(keys[k], i));
    assert_true(c.places + c.landed >= c.k);
    landed_in[mode] += c.landed;
    free(buf);
    *done = c.k;
    if (seen)
        *seen = w.req;
    return res->rc;
}

/* run_v against a current worker that uses no feature: today's frames. */
static int run(script *sc, const uint64_t *keys, size_t n, size_t size, int mode, size_t max_piece,
               unsigned seed, size_t *done, bw__xres *res)
{
    fake_versions v = {false, 0, 0};
    return run_v(sc, keys, n, size, mode, max_piece, seed, &v, NULL, done, res);
}

static uint64_t *shuffled_keys(size_t n, unsigned seed)
{
    uint64_t *k = malloc(n * sizeof(*k));
    assert_non_null(k);
    unsigned r = seed;
    for (size_t i = 0; i < n; i++) {
        r = r * 1103515245u + 12345u;
        k[i] = i * 1000 + (r >> 16) % 1000; /* distinct, any order the request asked */
    }
    return k;
}

/* Run lengths (1 to 40) covering n samples, as a worker's flushes split a request's samples
 * into RUN frames (a run of one as a SAMPLE frame). */
static size_t run_lengths(size_t n, unsigned seed, uint32_t *runs)
{
    unsigned r = seed;
    size_t nruns = 0;
    for (size_t k = 0; k < n;) {
        r = r * 1103515245u + 12345u;
        uint32_t len = 1 + (r >> 16) % 40;
        if (len > n - k)
            len = (uint32_t)(n - k);
        runs[nruns++] = len;
        k += len;
    }
    return nruns;
}

/* One request of n samples of `size` bytes, answered whole (then END) in pieces of at most
 * `piece` bytes, with and without peek: one SAMPLE frame per sample, or (runs) RUN frames of
 * random lengths among them, from a worker that offers runs; every sample lands byte for
 * byte. */
static void whole_case(size_t n, size_t size, size_t piece, unsigned seed, bool runs)
{
    for (int mode = 0; mode < MODES; mode++) {
        uint64_t *keys = shuffled_keys(n, seed);
        uint32_t *lens = malloc((n ? n : 1) * sizeof(*lens));
        assert_non_null(lens);
        size_t nruns = n, k = 0;
        if (runs)
            nruns = run_lengths(n, seed, lens);
        else
            for (size_t i = 0; i < n; i++)
                lens[i] = 1;
        script sc = {0};
        for (size_t i = 0; i < nruns; k += lens[i++])
            if (lens[i] == 1)
                put_sample(&sc, keys[k], size);
            else
                put_run(&sc, keys + k, lens[i], size);
        put_frame(&sc, BW_DCHAN_END, 0, n, 0);
        fake_versions v = {false, runs ? BW_DCHAN_FEATURE_RUNS : 0, 0};
        fake_request seen;
        size_t done = 0;
        bw__xres res;
        int rc = run_v(&sc, keys, n, size, mode, piece, seed * 7 + 3, &v, &seen, &done, &res);
        if (rc != BW_OK)
            fail_msg("%zu samples of %zu bytes in pieces of %zu (runs %d, mode %d): %s", n, size,
                     piece, runs, mode, res.err);
        assert_int_equal(done, n);
        assert_int_equal(seen.features_asked, 1);
        assert_true(seen.offered & BW_DCHAN_FEATURE_RUNS);
        free(sc.bytes);
        free(lens);
        free(keys);
    }
}

/* Every sample of the request, then END: sizes below and above a read's usual size, more
 * samples than one read posts, pieces from 1 byte up; with and without peek. */
static void whole_responses(void **state)
{
    (void)state;
    static const size_t cases[][3] = {{600, 40, 7000},  {600, 40, 37},      {300, 256, 65536},
                                      {40, 4096, 1500}, {12, 70000, 30000}, {5, 1, 3},
                                      {3, 0, 10}};
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++)
        whole_case(cases[ci][0], cases[ci][1], cases[ci][2], (unsigned)ci + 1, false);
}

/* An ERROR frame after some samples: those are complete, the request ends with the code and
 * the message (the bytes after an unexpected header go through the usual path). */
static void error_after_samples(void **state)
{
    (void)state;
    for (size_t piece = 5; piece <= 5000; piece *= 10)
        for (int mode = 0; mode < MODES; mode++) {
            size_t n = 120, size = 100, good = 50;
            uint64_t *keys = shuffled_keys(n, 9);
            script sc = {0};
            for (size_t k = 0; k < good; k++)
                put_sample(&sc, keys[k], size);
            static const char msg[] = "ReadSamples: shard 3 is owned by w-other now";
            put_frame(&sc, BW_DCHAN_ERROR, BW_WRONG_OWNER, sizeof(msg) - 1, 0);
            put(&sc, msg, sizeof(msg) - 1);
            size_t done = 0;
            bw__xres res;
            assert_int_equal(run(&sc, keys, n, size, mode, piece, 11, &done, &res), BW_WRONG_OWNER);
            assert_non_null(strstr(res.err, msg));
            assert_int_equal(done, good);
            free(sc.bytes);
            free(keys);
        }
}

/* END before every sample: the transport ends well with the samples that came (the fetch
 * loop then finds the request short); a sample not due is refused by place(); a connection
 * cut inside a sample loses only that sample. */
static void short_wrong_and_cut(void **state)
{
    (void)state;
    for (int mode = 0; mode < MODES; mode++) {
        size_t n = 20, size = 64, done = 0;
        uint64_t *keys = shuffled_keys(n, 5);
        bw__xres res;

        script sc = {0};
        for (size_t k = 0; k < 10; k++)
            put_sample(&sc, keys[k], size);
        put_frame(&sc, BW_DCHAN_END, 0, 10, 0);
        assert_int_equal(run(&sc, keys, n, size, mode, 50, 1, &done, &res), BW_OK);
        assert_int_equal(done, 10);
        free(sc.bytes);

        memset(&sc, 0, sizeof(sc));
        for (size_t k = 0; k < 7; k++)
            put_sample(&sc, keys[k], size);
        put_sample(&sc, keys[9], size); /* not the one due */
        for (size_t k = 8; k < n; k++)
            put_sample(&sc, keys[k], size);
        put_frame(&sc, BW_DCHAN_END, 0, n, 0);
        assert_int_equal(run(&sc, keys, n, size, mode, 300, 2, &done, &res), BW_PROTOCOL);
        assert_int_equal(done, 7);
        assert_non_null(strstr(res.err, "where"));
        free(sc.bytes);

        memset(&sc, 0, sizeof(sc));
        for (size_t k = 0; k < 12; k++)
            put_sample(&sc, keys[k], size);
        put_frame(&sc, BW_DCHAN_SAMPLE, 0, keys[12], size);
        put(&sc, "half", 4);
        sc.cut = true;
        assert_int_equal(run(&sc, keys, n, size, mode, 100, 3, &done, &res), BW_UNAVAILABLE);
        assert_int_equal(done, 12);
        free(sc.bytes);

        /* a size other than the fixed one: refused, after the samples before it */
        memset(&sc, 0, sizeof(sc));
        for (size_t k = 0; k < 4; k++)
            put_sample(&sc, keys[k], size);
        put_sample(&sc, keys[4], size + 1);
        put_frame(&sc, BW_DCHAN_END, 0, 5, 0);
        assert_int_equal(run(&sc, keys, n, size, mode, 1000, 4, &done, &res), BW_PROTOCOL);
        assert_int_equal(done, 4);
        free(sc.bytes);
        free(keys);
    }
}

/* A worker older than the FEATURES request refuses it and closes the connection without
 * reading on: the client connects again and sends the request alone, and every sample
 * arrives; the worker saw FEATURES once, on the first of two connections. */
static void older_worker(void **state)
{
    (void)state;
    for (size_t piece = 3; piece <= 30000; piece *= 100)
        for (int mode = 0; mode < MODES; mode++) {
            size_t n = 90, size = 300, done = 0;
            uint64_t *keys = shuffled_keys(n, 21);
            script sc = {0};
            for (size_t k = 0; k < n; k++)
                put_sample(&sc, keys[k], size);
            put_frame(&sc, BW_DCHAN_END, 0, n, 0);
            fake_versions v = {true, 0, 0};
            fake_request seen;
            bw__xres res;
            int rc = run_v(&sc, keys, n, size, mode, piece, 5, &v, &seen, &done, &res);
            if (rc != BW_OK)
                fail_msg("piece %zu (mode %d): %s", piece, mode, res.err);
            assert_int_equal(done, n);
            assert_int_equal(seen.connections, 2);
            assert_int_equal(seen.features_asked, 1);
            assert_int_equal(seen.kind, BW_DCHAN_KIND_READ_SAMPLES);
            free(sc.bytes);
            free(keys);
        }
}

/* RUN frames among SAMPLE frames: every sample lands in its place byte for byte, with and
 * without peek, in pieces from 1 byte up, for samples below and above a read's usual size. */
static void run_frames(void **state)
{
    (void)state;
    static const size_t cases[][3] = {{600, 40, 7000},    {600, 40, 37},    {300, 256, 65536},
                                      {100, 256, 2},      {90, 4096, 1500}, {90, 4096, 70000},
                                      {12, 70000, 30000}, {5, 1, 3}};
    memset(landed_in, 0, sizeof(landed_in));
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++)
        whole_case(cases[ci][0], cases[ci][1], cases[ci][2], (unsigned)ci + 3, true);
    /* the runs' samples went through span and landed where the sink has them, back to back
     * and in pieces, and only there */
    assert_true(landed_in[SPAN] > 0);
    assert_true(landed_in[SPAN_GAPS] > 0);
    assert_int_equal(landed_in[PLAIN] + landed_in[PEEK] + landed_in[PEEK_GAPS], 0);
}

/* Runs that lie: each ends the request with BW_PROTOCOL and a sentence saying so, the samples
 * before it complete, nothing written past the samples due. */
static void run_frames_refused(void **state)
{
    (void)state;
    enum { N = 30, SIZE = 64 };
    uint64_t keys[N];
    for (size_t k = 0; k < N; k++) /* 100..114, then 200..214 */
        keys[k] = k < 15 ? 100 + k : 200 + (k - 15);
    fake_versions runs_on = {false, BW_DCHAN_FEATURE_RUNS, 0}, runs_off = {false, 0, 0},
                  liar = {false, BW_DCHAN_FEATURE_RUNS, (uint64_t)1 << 40};
    const struct {
        const char *what;
        uint64_t first;
        uint32_t count;
        size_t size, before; /* SAMPLE frames of the first keys before the run */
        const fake_versions *v;
        size_t done;
        const char *needle;
    } cases[] = {
        {"longer than the samples due", 200, 40, SIZE, 15, &runs_on, 15, "RUN frame"},
        {"longer than the request", 100, N + 1, SIZE, 0, &runs_on, 0, "RUN frame"},
        {"from an index not due", 101, 5, SIZE, 0, &runs_on, 0, "RUN frame"},
        {"naming the sample before the one due", 104, 5, SIZE, 5, &runs_on, 5, "RUN frame"},
        {"of another size", 100, 5, SIZE + 1, 0, &runs_on, 0, "RUN frame"},
        {"of no samples", 100, 0, SIZE, 0, &runs_on, 0, "RUN frame of 0"},
        {"of samples of 0 bytes", 100, 3, 0, 0, &runs_on, 0, "at least 1 byte"},
        {"on a connection that did not ask for runs", 100, 5, SIZE, 0, &runs_off, 0, "did not ask"},
        {"after a FEATURES answer naming features not offered", 100, 5, SIZE, 0, &liar, 0,
         "FEATURES"},
    };
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++)
        for (int mode = 0; mode < MODES; mode++) {
            script sc = {0};
            for (size_t k = 0; k < cases[ci].before; k++)
                put_sample(&sc, keys[k], SIZE);
            /* the run's header, then its samples' bytes as it announces them */
            put_frame(&sc, BW_DCHAN_RUN, (int32_t)cases[ci].count, cases[ci].first, cases[ci].size);
            for (uint32_t k = 0; k < cases[ci].count; k++)
                for (size_t i = 0; i < cases[ci].size; i++) {
                    size_t at = cases[ci].before + k;
                    uint8_t b = pattern(at < N ? keys[at] : 0, i);
                    put(&sc, &b, 1);
                }
            put_frame(&sc, BW_DCHAN_END, 0, cases[ci].before + cases[ci].count, 0);
            size_t done = 0;
            bw__xres res;
            int rc = run_v(&sc, keys, N, SIZE, mode, 700, (unsigned)ci + 9, cases[ci].v, NULL,
                           &done, &res);
            if (rc != BW_PROTOCOL || !strstr(res.err, cases[ci].needle))
                fail_msg("a run %s (mode %d): %s, want BW_PROTOCOL saying \"%s\": %s",
                         cases[ci].what, mode, bw_err_name(rc), cases[ci].needle, res.err);
            /* the samples before the lie are complete and checked (run_v) */
            assert_int_equal(done, cases[ci].done);
            free(sc.bytes);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(whole_responses),     cmocka_unit_test(error_after_samples),
        cmocka_unit_test(short_wrong_and_cut), cmocka_unit_test(older_worker),
        cmocka_unit_test(run_frames),          cmocka_unit_test(run_frames_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
