/* The loader's read grant (client/lib/session.c, transport.h; docs/security.md, "Read
 * grants"): the session keeps the coordinator's grant and gives each worker's proof (cached
 * per worker per grant, the same as bw__grant_proof computes); a request to a worker carries
 * the claims and that worker's proof and nothing else; the data-channel transport sends no
 * AUTH hello and no token (only FEATURES, which carries neither, and the request with its
 * grant), which a listener standing for a worker captures here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../client/lib/session.h"
#include "../../client/lib/transport.h"
#include "auth/grant.h"
#include "data.pb-c.h"
#include "fake_dchan_worker.h"
#include "rpc/dchan.h"

static void session_init(bw__session *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    bw__arena_init(&s->job_arena, 0);
}

/* Gives s a grant with these claims and a secret of bytes `fill`. */
static void give(bw__session *s, const char *claims, uint8_t fill)
{
    uint8_t secret[BW_GRANT_SECRET_BYTES];
    memset(secret, fill, sizeof(secret));
    ProtobufCBinaryData c = {strlen(claims), (uint8_t *)claims}, k = {sizeof(secret), secret};
    char err[256];
    assert_int_equal(bw__session_set_grant(s, "JoinJob", &c, &k, err, sizeof(err)), BW_OK);
    uint8_t zero[BW_GRANT_SECRET_BYTES] = {0};
    assert_memory_equal(secret, zero, sizeof(zero)); /* the answer's copy is wiped */
}

static void expect_proof(bw__session *s, const char *claims, uint8_t fill, const char *wid)
{
    uint8_t secret[BW_GRANT_SECRET_BYTES], want[BW_GRANT_PROOF_BYTES];
    memset(secret, fill, sizeof(secret));
    bw__grant_proof(secret, wid, want);
    bw__grant_copy got;
    assert_true(bw__session_grant(s, wid, &got));
    assert_int_equal(got.claims_len, strlen(claims));
    assert_memory_equal(got.claims, claims, got.claims_len);
    assert_memory_equal(got.proof, want, sizeof(want));
}

static void grants_and_proofs(void **state)
{
    (void)state;
    bw__session s;
    session_init(&s);
    bw__grant_copy got;
    assert_false(bw__session_grant(&s, "w1", &got)); /* no grant: authentication off */
    give(&s, "claims-one", 1);
    for (int round = 0; round < 2; round++) { /* computed, then from the cache */
        expect_proof(&s, "claims-one", 1, "w1");
        expect_proof(&s, "claims-one", 1, "w2");
    }
    bw__grant_copy a, b;
    assert_true(bw__session_grant(&s, "w1", &a));
    assert_true(bw__session_grant(&s, "w2", &b));
    assert_memory_not_equal(a.proof, b.proof, sizeof(a.proof)); /* bound to the worker */

    /* An answer without a grant changes nothing; a malformed one is refused and changes
     * nothing either. */
    char err[256];
    ProtobufCBinaryData none = {0, NULL}, c = {3, (uint8_t *)"abc"};
    uint8_t short_secret[16] = {0};
    ProtobufCBinaryData k = {sizeof(short_secret), short_secret};
    assert_int_equal(bw__session_set_grant(&s, "LeaseHeartbeat", &none, &none, err, sizeof(err)),
                     BW_OK);
    assert_int_equal(bw__session_set_grant(&s, "LeaseHeartbeat", &c, &k, err, sizeof(err)),
                     BW_PROTOCOL);
    assert_non_null(strstr(err, "LeaseHeartbeat"));
    assert_non_null(strstr(err, "secret of 16 bytes"));
    static uint8_t big[BW_GRANT_CLAIMS_MAX + 1];
    uint8_t secret[BW_GRANT_SECRET_BYTES] = {7};
    ProtobufCBinaryData cbig = {sizeof(big), big}, k32 = {sizeof(secret), secret};
    assert_int_equal(bw__session_set_grant(&s, "LeaseHeartbeat", &cbig, &k32, err, sizeof(err)),
                     BW_PROTOCOL);
    assert_int_equal(bw__session_set_grant(&s, "LeaseHeartbeat", &none, &k32, err, sizeof(err)),
                     BW_PROTOCOL);
    expect_proof(&s, "claims-one", 1, "w1");

    /* A renewed grant replaces it: new claims, new proofs (none from the old cache). */
    give(&s, "claims-two", 2);
    expect_proof(&s, "claims-two", 2, "w1");
    expect_proof(&s, "claims-two", 2, "w2");

    /* More workers than the cache keeps: every proof is still right. */
    char wid[32];
    for (int i = 0; i < 9000; i++) {
        snprintf(wid, sizeof(wid), "storage-%d", i);
        expect_proof(&s, "claims-two", 2, wid);
    }
    for (int i = 0; i < 9000; i += 997) {
        snprintf(wid, sizeof(wid), "storage-%d", i);
        expect_proof(&s, "claims-two", 2, wid);
    }
    bw__session_close(&s);
}

static bool src_get(void *ctx, const char *worker_id, bw__grant_copy *out)
{
    return bw__session_grant(ctx, worker_id, out);
}

/* The message a transport sends: the request itself without a grant, else the same request
 * with ReadGrant {claims, this worker's proof} and nothing else changed. */
static void granted_request(void **state)
{
    (void)state;
    bw__session s;
    session_init(&s);
    bw__grant_src src = {src_get, &s};
    uint64_t idx[3] = {4, 5, 9};
    Batchwire__V1__ReadSamplesRequest rs = BATCHWIRE__V1__READ_SAMPLES_REQUEST__INIT;
    rs.indices = idx;
    rs.n_indices = 3;
    rs.fingerprint = "fp";
    bw__read_req req = {BW_DCHAN_KIND_READ_SAMPLES, &rs.base};
    bw__granted g;
    assert_ptr_equal(bw__read_req_granted(&req, &src, "w1", &g), &rs.base);
    bw__grant_src nosrc = {NULL, NULL};
    assert_ptr_equal(bw__read_req_granted(&req, &nosrc, "w1", &g), &rs.base);
    give(&s, "the-claims", 3);
    for (int kind = 0; kind < 2; kind++) {
        Batchwire__V1__ReadStreamRequest rq = BATCHWIRE__V1__READ_STREAM_REQUEST__INIT;
        rq.source = 2;
        rq.first_record = 17;
        bw__read_req sreq = {BW_DCHAN_KIND_READ_STREAM, &rq.base};
        const bw__read_req *r = kind ? &sreq : &req;
        const ProtobufCMessage *m = bw__read_req_granted(r, &src, "w7", &g);
        assert_ptr_not_equal(m, r->msg);
        uint8_t buf[2048];
        size_t n = protobuf_c_message_pack(m, buf);
        bw__granted_wipe(&g);
        uint8_t zero[BW_GRANT_PROOF_BYTES] = {0};
        assert_memory_equal(g.copy.proof, zero, sizeof(zero));
        uint8_t secret[BW_GRANT_SECRET_BYTES], want[BW_GRANT_PROOF_BYTES];
        memset(secret, 3, sizeof(secret));
        bw__grant_proof(secret, "w7", want);
        const Batchwire__V1__ReadGrant *gr;
        ProtobufCMessage *u = protobuf_c_message_unpack(r->msg->descriptor, NULL, n, buf);
        assert_non_null(u);
        if (kind) {
            Batchwire__V1__ReadStreamRequest *q = (void *)u;
            assert_int_equal(q->source, 2);
            assert_int_equal(q->first_record, 17);
            gr = q->grant;
        } else {
            Batchwire__V1__ReadSamplesRequest *q = (void *)u;
            assert_int_equal(q->n_indices, 3);
            assert_int_equal(q->indices[2], 9);
            assert_string_equal(q->fingerprint, "fp");
            gr = q->grant;
        }
        assert_non_null(gr);
        assert_int_equal(gr->claims.len, strlen("the-claims"));
        assert_memory_equal(gr->claims.data, "the-claims", gr->claims.len);
        assert_int_equal(gr->proof.len, BW_GRANT_PROOF_BYTES);
        assert_memory_equal(gr->proof.data, want, sizeof(want));
        protobuf_c_message_free_unpacked(u, NULL);
    }
    assert_null(rs.grant); /* the caller's request is untouched */
    bw__session_close(&s);
}

/* A listener standing for a worker's data channel (fake_dchan_worker.h): captures the first
 * read request of a connection (after FEATURES, answered as a current worker) and ends it
 * with END. */
typedef struct capture {
    int lfd;
    fake_request req;
    bool ok;
} capture;

static void *listener(void *arg)
{
    capture *c = arg;
    fake_versions v = {false, 0, 0};
    int fd = fake_accept_request(c->lfd, &v, &c->req);
    if (fd < 0)
        return NULL;
    c->ok = true;
    fake_put_frame(fd, BW_DCHAN_END, 0, 0, 0);
    close(fd);
    return NULL;
}

static int place(void *ctx, uint64_t key, uint64_t size, uint64_t chunk_off, uint64_t len,
                 uint8_t **dest, char *err, size_t errlen)
{
    (void)ctx, (void)key, (void)size, (void)chunk_off, (void)len, (void)dest;
    snprintf(err, errlen, "no sample was asked for");
    return BW_PROTOCOL;
}

static void arrived(void *ctx, uint64_t len)
{
    (void)ctx, (void)len;
}

/* The data-channel transport created from settings that hold a token sends neither a hello
 * nor the token: the first bytes on the connection are the request, with its grant. */
static void data_channel_sends_grant_not_token(void **state)
{
    (void)state;
    bw__session s;
    session_init(&s);
    give(&s, "claims-for-dchan", 4);
    static const char token[] = "trainer-token-must-not-leave-0123456789";
    bw__worker_opts wo = {.grant = {src_get, &s}};
    wo.rpc.tls.token = token;
    char err[256];
    bw__transport t;
    assert_int_equal(bw__transport_open(&bw__transport_dchan_ops, &wo, &t, err, sizeof(err)),
                     BW_OK);
    capture c = {0};
    int port = 0;
    assert_int_equal(bw__sock_listen("127.0.0.1:0", &c.lfd, &port, err, sizeof(err)), BW_OK);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, listener, &c), 0);
    char daddr[64];
    snprintf(daddr, sizeof(daddr), "127.0.0.1:%d", port);
    bw__worker_ref wr = {"w-dchan", "127.0.0.1:1", daddr};
    uint64_t idx[1] = {0};
    Batchwire__V1__ReadSamplesRequest rs = BATCHWIRE__V1__READ_SAMPLES_REQUEST__INIT;
    rs.indices = idx;
    rs.n_indices = 1;
    bw__read_req req = {BW_DCHAN_KIND_READ_SAMPLES, &rs.base};
    bw__xfer *x = NULL;
    bw__xres res;
    memset(&res, 0, sizeof(res));
    assert_int_equal(t.ops->start(t.state, &wr, &req, 5000, &x, &res), BW_OK);
    bw__sink sink = {place, arrived, NULL, NULL, NULL, NULL};
    while (!t.ops->recv(x, &sink, &res))
        usleep(1000);
    if (res.rc != BW_OK)
        fail_msg("%s", res.err);
    t.ops->finish(x);
    pthread_join(th, NULL);
    close(c.lfd);
    bw__transport_close(&t);

    assert_true(c.ok);
    assert_int_equal(c.req.kind, BW_DCHAN_KIND_READ_SAMPLES); /* no AUTH hello first */
    const uint8_t *body = c.req.body;
    size_t blen = c.req.len;
    assert_null(memmem(body, blen, token, strlen(token)));
    Batchwire__V1__ReadSamplesRequest *got =
        batchwire__v1__read_samples_request__unpack(NULL, blen, body);
    assert_non_null(got);
    assert_non_null(got->grant);
    assert_memory_equal(got->grant->claims.data, "claims-for-dchan", got->grant->claims.len);
    uint8_t secret[BW_GRANT_SECRET_BYTES], want[BW_GRANT_PROOF_BYTES];
    memset(secret, 4, sizeof(secret));
    assert_null(memmem(body, blen, secret, sizeof(secret))); /* nor the secret */
    bw__grant_proof(secret, "w-dchan", want);
    assert_memory_equal(got->grant->proof.data, want, sizeof(want));
    batchwire__v1__read_samples_request__free_unpacked(got, NULL);
    bw__session_close(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(grants_and_proofs),
        cmocka_unit_test(granted_request),
        cmocka_unit_test(data_channel_sends_grant_not_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
