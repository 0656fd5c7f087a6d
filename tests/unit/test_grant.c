/* Read grants (core/auth/grant.c, docs/security.md "Read grants"): the --grant-key file,
 * minting, verification at a worker (each refusal the design names, and the cache), revoked
 * leases, key rotation and the coordinator's proof. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth/grant.h"
#include "batchwire/batchwire.h"

static const char K1[] = "k1 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
static const char K2[] = "k2 ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100\n";
static const uint64_t NOW = 1800000000000ull;

static char path[64];

static void write_keys(const char *text)
{
    snprintf(path, sizeof(path), "/tmp/bw-grant-test-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    chmod(path, 0600);
}

static bw_grants *open_keys(const char *text)
{
    write_keys(text);
    bw_grants *g = NULL;
    char err[256];
    int rc = bw__grants_open(path, &g, err, sizeof(err));
    if (rc != BW_OK)
        fail_msg("open: %s", err);
    return g;
}

static void dataset(Batchwire__V1__Dataset *ds, char **src, const char *name)
{
    batchwire__v1__dataset__init(ds);
    ds->format = "npy";
    src[0] = (char *)name;
    ds->sources = src;
    ds->n_sources = 1;
}

/* A grant for job "j" rank 3 over `ds`, expiring at `expires`, and its proof for `worker`. */
typedef struct minted {
    bw_arena arena;
    ProtobufCBinaryData claims, secret;
    uint8_t proof[BW_GRANT_PROOF_BYTES];
    Batchwire__V1__ReadGrant grant;
} minted;

static void mint(bw_grants *g, minted *m, const Batchwire__V1__Dataset *ds, uint64_t expires,
                 uint64_t tag, const char *worker)
{
    bw__arena_init(&m->arena, 0);
    bw_grant_claims c;
    memset(&c, 0, sizeof(c));
    c.job = "j";
    c.rank = 3;
    assert_int_equal(bw__grant_dataset_hash(ds, c.dataset), BW_OK);
    c.lease_tag = tag;
    c.expires_ms = expires;
    assert_int_equal(bw__grant_mint(g, &c, &m->arena, &m->claims, &m->secret), BW_OK);
    assert_int_equal(m->secret.len, BW_GRANT_SECRET_BYTES);
    bw__grant_proof(m->secret.data, worker, m->proof);
    batchwire__v1__read_grant__init(&m->grant);
    m->grant.claims = m->claims;
    m->grant.proof.data = m->proof;
    m->grant.proof.len = sizeof(m->proof);
}

/* The usual start: keys K1 and dataset "a.npy" (cmocka setup and teardown). */
typedef struct fixture {
    bw_grants *g;
    Batchwire__V1__Dataset ds;
    char *src[1];
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    f->g = open_keys(K1);
    dataset(&f->ds, f->src, "a.npy");
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    bw__grants_free(f->g);
    free(f);
    unlink(path);
    return 0;
}

static int verify(bw_grants *g, minted *m, const char *worker, const Batchwire__V1__Dataset *ds,
                  uint64_t now, char *err, size_t errlen)
{
    err[0] = 0;
    return bw__grant_verify(g, worker, &m->grant, ds, now, err, errlen);
}

static void test_good_grant_and_cache(void **state)
{
    fixture *f = *state;
    bw_grants *g = f->g;
    Batchwire__V1__Dataset ds = f->ds;
    minted m;
    mint(g, &m, &ds, NOW + 10000, 42, "w1");
    char err[512];
    assert_int_equal(verify(g, &m, "w1", &ds, NOW, err, sizeof(err)), BW_OK);
    assert_int_equal(verify(g, &m, "w1", &ds, NOW + 1, err, sizeof(err)), BW_OK); /* cached */
    /* the claims decode as the coordinator packed them */
    Batchwire__V1__GrantClaims *c =
        batchwire__v1__grant_claims__unpack(NULL, m.claims.len, m.claims.data);
    assert_non_null(c);
    assert_string_equal(c->key_id, "k1");
    assert_string_equal(c->job, "j");
    assert_int_equal(c->rank, 3);
    assert_int_equal(c->lease_tag, 42);
    batchwire__v1__grant_claims__free_unpacked(c, NULL);
    /* no grant at all */
    assert_int_equal(bw__grant_verify(g, "w1", NULL, &ds, NOW, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "no read grant"));
    bw__arena_reset(&m.arena);
}

static void test_expired(void **state)
{
    fixture *f = *state;
    bw_grants *g = f->g;
    Batchwire__V1__Dataset ds = f->ds;
    minted m;
    mint(g, &m, &ds, NOW, 1, "w1");
    char err[512];
    /* within the skew it still holds; past it, refused, first verified or cached */
    assert_int_equal(verify(g, &m, "w1", &ds, NOW + BW_GRANT_SKEW_MS, err, sizeof(err)), BW_OK);
    assert_int_equal(verify(g, &m, "w1", &ds, NOW + BW_GRANT_SKEW_MS + 1, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "expired"));
    bw__arena_reset(&m.arena);
    mint(g, &m, &ds, NOW, 2, "w1");
    assert_int_equal(verify(g, &m, "w1", &ds, NOW + 60000, err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "expired"));
    bw__arena_reset(&m.arena);
}

static void test_unknown_key_and_rotation(void **state)
{
    (void)state;
    Batchwire__V1__Dataset ds;
    char *src[1];
    dataset(&ds, src, "a.npy");
    bw_grants *coord = open_keys(K2); /* a coordinator with another key */
    minted other;
    mint(coord, &other, &ds, NOW + 10000, 1, "w1");
    bw__grants_free(coord);

    bw_grants *g = open_keys(K1);
    minted old;
    mint(g, &old, &ds, NOW + 10000, 2, "w1");
    char err[512];
    assert_int_equal(verify(g, &other, "w1", &ds, NOW, err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "key 'k2'"));
    assert_int_equal(verify(g, &old, "w1", &ds, NOW, err, sizeof(err)), BW_OK);

    /* Rotation: k2 first signs, k1 still verifies; the k2 grant now verifies too. */
    char both[256];
    snprintf(both, sizeof(both), "# rotated\n%s\n%s", K2, K1);
    write_keys(both);
    size_t n = 0;
    assert_int_equal(bw__grants_reload(g, &n, err, sizeof(err)), BW_OK);
    assert_int_equal(n, 2);
    assert_int_equal(verify(g, &old, "w1", &ds, NOW, err, sizeof(err)), BW_OK);
    assert_int_equal(verify(g, &other, "w1", &ds, NOW, err, sizeof(err)), BW_OK);
    minted fresh;
    mint(g, &fresh, &ds, NOW + 10000, 3, "w1");
    Batchwire__V1__GrantClaims *c =
        batchwire__v1__grant_claims__unpack(NULL, fresh.claims.len, fresh.claims.data);
    assert_string_equal(c->key_id, "k2");
    batchwire__v1__grant_claims__free_unpacked(c, NULL);

    /* k1 removed: its grant, verified and cached before, is refused now. */
    write_keys(K2);
    assert_int_equal(bw__grants_reload(g, &n, err, sizeof(err)), BW_OK);
    assert_int_equal(verify(g, &old, "w1", &ds, NOW, err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "key 'k1'"));
    /* a bad file on reload leaves the keys in force */
    write_keys("k3 abc\n");
    assert_int_not_equal(bw__grants_reload(g, &n, err, sizeof(err)), BW_OK);
    assert_int_equal(verify(g, &fresh, "w1", &ds, NOW, err, sizeof(err)), BW_OK);
    bw__arena_reset(&other.arena);
    bw__arena_reset(&old.arena);
    bw__arena_reset(&fresh.arena);
    bw__grants_free(g);
    unlink(path);
}

static void test_tampered_other_worker_other_dataset(void **state)
{
    fixture *f = *state;
    bw_grants *g = f->g;
    Batchwire__V1__Dataset ds = f->ds, other;
    char *src2[1];
    dataset(&other, src2, "b.npy");
    minted m;
    mint(g, &m, &ds, NOW + 10000, 5, "w1");
    char err[512];
    /* the proof was made for w1 */
    assert_int_equal(verify(g, &m, "w2", &ds, NOW, err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "worker 'w2'"));
    /* the right worker, another dataset: refused, also once the pair is cached */
    assert_int_equal(verify(g, &m, "w1", &other, NOW, err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "dataset"));
    assert_int_equal(verify(g, &m, "w1", &ds, NOW, err, sizeof(err)), BW_OK);
    assert_int_equal(verify(g, &m, "w1", &other, NOW, err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "dataset"));
    /* claims changed (another rank): the proof no longer verifies */
    Batchwire__V1__GrantClaims *c =
        batchwire__v1__grant_claims__unpack(NULL, m.claims.len, m.claims.data);
    c->rank = 4;
    c->expires_ms = NOW + 999999;
    uint8_t buf[512];
    size_t len = batchwire__v1__grant_claims__pack(c, buf);
    batchwire__v1__grant_claims__free_unpacked(c, NULL);
    Batchwire__V1__ReadGrant t = m.grant;
    t.claims.data = buf;
    t.claims.len = len;
    assert_int_equal(bw__grant_verify(g, "w1", &t, &ds, NOW, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "does not verify"));
    /* garbage claims and a short proof */
    uint8_t junk[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    t.claims.data = junk;
    t.claims.len = sizeof(junk);
    assert_int_equal(bw__grant_verify(g, "w1", &t, &ds, NOW, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    t = m.grant;
    t.proof.len = 31;
    assert_int_equal(bw__grant_verify(g, "w1", &t, &ds, NOW, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "malformed"));
    bw__arena_reset(&m.arena);
}

static void test_revoked(void **state)
{
    fixture *f = *state;
    bw_grants *g = f->g;
    Batchwire__V1__Dataset ds = f->ds;
    uint64_t tag = bw__grant_lease_tag(7, 8);
    assert_int_not_equal(tag, bw__grant_lease_tag(7, 9));
    minted m;
    mint(g, &m, &ds, NOW + 10000, tag, "w1");
    char err[512];
    assert_int_equal(verify(g, &m, "w1", &ds, NOW, err, sizeof(err)), BW_OK);
    /* another rank's and another lease's revocations change nothing */
    assert_int_equal(bw__grant_revoke(g, "j", 4, tag, NOW + 20000), BW_OK);
    assert_int_equal(bw__grant_revoke(g, "j", 3, tag + 1, NOW + 20000), BW_OK);
    assert_int_equal(verify(g, &m, "w1", &ds, NOW, err, sizeof(err)), BW_OK);
    assert_int_equal(bw__grant_revoke(g, "j", 3, tag, NOW + 20000), BW_OK);
    assert_int_equal(verify(g, &m, "w1", &ds, NOW, err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "fenced"));
    /* the list a coordinator sends; expired revocations are forgotten */
    bw_arena a;
    bw__arena_init(&a, 0);
    Batchwire__V1__RevokedLease **v;
    size_t n;
    assert_int_equal(bw__grant_revoked(g, NOW, &a, &v, &n), BW_OK);
    assert_int_equal(n, 3);
    assert_int_equal(bw__grant_revoke(g, "old", 0, 1, NOW - 1), BW_OK);
    assert_int_equal(bw__grant_revoked(g, NOW, &a, &v, &n), BW_OK);
    assert_int_equal(n, 3);
    assert_int_equal(bw__grant_revoked(g, NOW + 20001, &a, &v, &n), BW_OK);
    assert_int_equal(n, 0);
    bw__arena_reset(&a);
    bw__arena_reset(&m.arena);
}

static void test_coordinator_proof(void **state)
{
    bw_grants *g = ((fixture *)*state)->g;
    char p[BW_GRANT_COORD_PROOF_MAX], err[512];
    bw__grant_coord_proof(g, "w1", NOW, p);
    assert_int_equal(strncmp(p, "k1.", 3), 0);
    assert_int_equal(bw__grant_coord_verify(g, "w1", p, NOW + 1000, err, sizeof(err)), BW_OK);
    /* captured at w1, replayed at w2 */
    assert_int_equal(bw__grant_coord_verify(g, "w2", p, NOW, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "worker 'w2'"));
    assert_int_equal(bw__grant_coord_verify(g, "w1", p,
                                            NOW + BW_GRANT_COORD_PROOF_MS + BW_GRANT_SKEW_MS + 1,
                                            err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "expired"));
    char bad[BW_GRANT_COORD_PROOF_MAX];
    snprintf(bad, sizeof(bad), "%s", p);
    bad[strlen(bad) - 1] = bad[strlen(bad) - 1] == '0' ? '1' : '0';
    assert_int_equal(bw__grant_coord_verify(g, "w1", bad, NOW, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_int_equal(bw__grant_coord_verify(g, "w1", "k1.x.y", NOW, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "malformed"));
}

static void test_key_file_errors(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"# nothing\n\n", "holds no key"},
        {"k1\n", "line 1: expected two fields"},
        {"\nk1 0011\n", "line 2: key 'k1' is 4 characters long"},
        {"k/1 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", "key id"},
        {"k1 zz112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n", "not hex"},
        {"k1 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n"
         "k1 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n",
         "line 2: key id 'k1' is listed twice"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        write_keys(cases[i].text);
        bw_grants *g = NULL;
        char err[512] = "";
        assert_int_equal(bw__grants_open(path, &g, err, sizeof(err)), BW_INVALID_ARGUMENT);
        assert_null(g);
        if (!strstr(err, cases[i].want) || !strstr(err, path))
            fail_msg("case %zu: '%s' lacks '%s'", i, err, cases[i].want);
        assert_null(strstr(err, "00112233")); /* never a key's bytes */
    }
    bw_grants *g = NULL;
    char err[512];
    assert_int_equal(bw__grants_open("/nonexistent/grant.key", &g, err, sizeof(err)), BW_IO);
    assert_non_null(strstr(err, "/nonexistent/grant.key"));
    unlink(path);
}

/* A mixture's grant (GrantClaims.sources): every source verifies, in any order and again
 * from the cache, at 256 sources (the largest claims); a dataset outside the sources is
 * refused, also right after a source was verified. */
static void test_mixture_sources(void **state)
{
    fixture *f = *state;
    bw_grants *g = f->g;
    enum { NS = 256 };
    static Batchwire__V1__Dataset ds[NS];
    static char *src[NS][1];
    static char names[NS][16];
    static uint8_t hashes[NS][BW_GRANT_HASH_BYTES];
    for (int j = 0; j < NS; j++) {
        snprintf(names[j], sizeof(names[j]), "s%d.npy", j);
        dataset(&ds[j], src[j], names[j]);
        assert_int_equal(bw__grant_dataset_hash(&ds[j], hashes[j]), BW_OK);
    }
    minted m;
    bw__arena_init(&m.arena, 0);
    bw_grant_claims c;
    memset(&c, 0, sizeof(c));
    c.job = "j";
    c.rank = 3;
    assert_int_equal(bw__grant_dataset_hash(NULL, c.dataset), BW_OK);
    c.sources = (const uint8_t(*)[BW_GRANT_HASH_BYTES])hashes;
    c.nsources = NS;
    c.lease_tag = 9;
    c.expires_ms = NOW + 10000;
    assert_int_equal(bw__grant_mint(g, &c, &m.arena, &m.claims, &m.secret), BW_OK);
    assert_true(m.claims.len <= BW_GRANT_CLAIMS_MAX);
    bw__grant_proof(m.secret.data, "w1", m.proof);
    batchwire__v1__read_grant__init(&m.grant);
    m.grant.claims = m.claims;
    m.grant.proof.data = m.proof;
    m.grant.proof.len = sizeof(m.proof);
    char err[512];
    for (int round = 0; round < 3; round++)
        for (int j = 0; j < NS; j++) {
            int k = round == 1 ? NS - 1 - j : (j * 37) % NS; /* other orders */
            if (verify(g, &m, "w1", &ds[k], NOW, err, sizeof(err)) != BW_OK)
                fail_msg("round %d, source %d: %s", round, k, err);
        }
    Batchwire__V1__Dataset other;
    char *osrc[1];
    dataset(&other, osrc, "outside.npy");
    assert_int_equal(verify(g, &m, "w1", &other, NOW, err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "dataset"));
    assert_int_equal(verify(g, &m, "w1", &ds[7], NOW, err, sizeof(err)), BW_OK);
    assert_int_equal(verify(g, &m, "w1", &other, NOW, err, sizeof(err)), BW_PERMISSION_DENIED);
    bw__arena_reset(&m.arena);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_good_grant_and_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expired, setup, teardown),
        cmocka_unit_test(test_unknown_key_and_rotation),
        cmocka_unit_test_setup_teardown(test_tampered_other_worker_other_dataset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_revoked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_coordinator_proof, setup, teardown),
        cmocka_unit_test(test_key_file_errors),
        cmocka_unit_test_setup_teardown(test_mixture_sources, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
