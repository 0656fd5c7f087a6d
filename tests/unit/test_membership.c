/* The coordinator's worker table (server/membership.c): which principal may register which
 * id (its ids= binding), the caps on the table, and dead workers leaving it
 * (docs/security.md, "Worker ids"), and the placement table built from it, whose owners are
 * kept per placement version (server/placement_service.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "batchwire/batchwire.h"
#include "placement/placement.h"
#include "server/membership.h"
#include "server/placement_service.h"

static char path[64];

static bw_auth *principals(void)
{
    snprintf(path, sizeof(path), "/tmp/bw-membership-test-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("admin ops 0123456789abcdef-admin\n"
          "worker storage 0123456789abcdef-st ids=store-*\n"
          "worker other 0123456789abcdef-ot ids=*\n",
          f);
    fclose(f);
    bw_auth *a;
    char err[256];
    assert_int_equal(bw__auth_open(path, &a, err, sizeof(err)), BW_OK);
    unlink(path);
    return a;
}

static int reg(bw_membership *m, const bw_principal *who, const char *id, char *err, size_t len)
{
    Batchwire__V1__RegisterWorkerRequest req = BATCHWIRE__V1__REGISTER_WORKER_REQUEST__INIT;
    req.id = (char *)id;
    req.address = "127.0.0.1:1";
    req.incarnation = 1;
    return bw__membership_register(m, who, &req, "test", err, len);
}

static size_t table_size(bw_membership *m)
{
    size_t alive, dead;
    bw__membership_counts(m, &alive, &dead);
    return alive + dead;
}

static void test_binding(void **state)
{
    (void)state;
    bw_auth *a = principals();
    const bw_membership_opts o = {1000, 3, 3600000, 100, 100, a};
    bw_membership *m = bw__membership_new(&o);
    bw_principal storage = {BW_ROLE_WORKER, "storage"}, other = {BW_ROLE_WORKER, "other"};
    char err[1024];
    assert_int_equal(reg(m, &storage, "store-1", err, sizeof(err)), BW_OK);
    assert_int_equal(reg(m, &storage, "evil", err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "worker id 'evil'"));
    assert_int_equal(table_size(m), 1);
    /* another principal whose binding matches still may not take an id held by storage */
    assert_int_equal(reg(m, &other, "store-1", err, sizeof(err)), BW_PERMISSION_DENIED);
    assert_non_null(strstr(err, "registered by another principal"));
    bool known;
    assert_int_equal(bw__membership_heartbeat(m, &other, "store-1", 1, &known, err, sizeof(err)),
                     BW_PERMISSION_DENIED);
    assert_int_equal(bw__membership_heartbeat(m, &storage, "store-1", 1, &known, err, sizeof(err)),
                     BW_OK);
    assert_true(known);
    bw__membership_free(m);
    bw__auth_free(a);
}

static void test_caps(void **state)
{
    (void)state;
    bw_auth *a = principals();
    const bw_membership_opts o = {1000, 3, 3600000, 8, 3, a};
    bw_membership *m = bw__membership_new(&o);
    bw_principal storage = {BW_ROLE_WORKER, "storage"}, ops = {BW_ROLE_ADMIN, "ops"};
    char err[1024], id[32];
    for (int i = 0; i < 300; i++) {
        snprintf(id, sizeof(id), "store-%d", i);
        int rc = reg(m, &storage, id, err, sizeof(err));
        assert_int_equal(rc, i < 3 ? BW_OK : BW_TOO_BIG);
    }
    assert_non_null(strstr(err, "--max-workers-per-principal 3"));
    assert_int_equal(table_size(m), 3);
    /* an id already in the table registers again (a restart) whatever the caps */
    assert_int_equal(reg(m, &storage, "store-0", err, sizeof(err)), BW_OK);
    /* admins: only the total */
    for (int i = 0; i < 10; i++) {
        snprintf(id, sizeof(id), "admin-%d", i);
        int rc = reg(m, &ops, id, err, sizeof(err));
        assert_int_equal(rc, i < 5 ? BW_OK : BW_TOO_BIG);
    }
    assert_non_null(strstr(err, "--max-workers 8"));
    assert_int_equal(table_size(m), 8);
    bw__membership_free(m);
    bw__auth_free(a);
}

static void test_forget(void **state)
{
    (void)state;
    /* dead after 1 x 5 ms, forgotten 300 ms later */
    const bw_membership_opts o = {5, 1, 300, 2, 2, NULL};
    bw_membership *m = bw__membership_new(&o);
    bw_principal open = {BW_ROLE_OPEN, ""};
    char err[1024];
    assert_int_equal(reg(m, &open, "a", err, sizeof(err)), BW_OK);
    assert_int_equal(reg(m, &open, "b", err, sizeof(err)), BW_OK);
    assert_int_equal(reg(m, &open, "c", err, sizeof(err)), BW_TOO_BIG);
    nanosleep(&(struct timespec){0, 30 * 1000 * 1000}, NULL);
    bw__membership_sweep(m);
    size_t alive, dead;
    bw__membership_counts(m, &alive, &dead);
    assert_int_equal(alive, 0);
    assert_int_equal(dead, 2); /* dead, still counted */
    assert_int_equal(reg(m, &open, "c", err, sizeof(err)), BW_TOO_BIG);
    nanosleep(&(struct timespec){0, 400 * 1000 * 1000}, NULL);
    assert_int_equal(reg(m, &open, "c", err, sizeof(err)), BW_OK); /* a and b forgotten */
    assert_int_equal(table_size(m), 1);
    bw__membership_free(m);
}

/* The owners Placement.Get hands out are rendezvous hashing over the live workers sorted by
 * id, whether computed or kept from an earlier call, and follow every change of the set. */
static void check_owners(bw_coordinator *c, uint32_t shards, const char *const *ids, size_t n,
                         uint64_t *version)
{
    bw_arena a;
    bw__arena_init(&a, 0);
    for (int round = 0; round < 2; round++) { /* computed, then kept */
        Batchwire__V1__PlacementTable *t = NULL;
        assert_int_equal(bw__placement_table(c, &a, shards, &t), BW_OK);
        assert_int_equal(t->n_workers, n);
        assert_int_equal(t->n_owners, shards);
        for (size_t i = 0; i < n; i++)
            assert_string_equal(t->workers[i]->id, ids[i]);
        for (uint32_t s = 0; s < shards; s++)
            assert_int_equal(t->owners[s], bw__placement_owner(ids, n, s));
        *version = t->version;
    }
    bw__arena_reset(&a);
}

static void test_placement_owners(void **state)
{
    (void)state;
    const bw_membership_opts o = {60000, 3, 3600000, 100, 100, NULL};
    bw_coordinator c;
    memset(&c, 0, sizeof(c));
    c.members = bw__membership_new(&o);
    c.owners = bw__owner_cache_new();
    assert_non_null(c.members);
    assert_non_null(c.owners);
    bw_principal open = {BW_ROLE_OPEN, ""};
    char err[1024];
    const char *three[] = {"a", "b", "c"}, *four[] = {"a", "b", "c", "d"};
    for (int i = 0; i < 3; i++)
        assert_int_equal(reg(c.members, &open, three[i], err, sizeof(err)), BW_OK);
    uint64_t v3, v3b, v4;
    check_owners(&c, 64, three, 3, &v3);
    check_owners(&c, 17, three, 3, &v3b); /* another shard count, same version */
    assert_true(v3 == v3b);
    assert_int_equal(reg(c.members, &open, "d", err, sizeof(err)), BW_OK);
    check_owners(&c, 17, four, 4, &v4); /* the shard count kept last: not what was kept */
    check_owners(&c, 64, four, 4, &v4);
    assert_true(v4 != v3);
    bw__owner_cache_free(c.owners);
    bw__membership_free(c.members);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binding),
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_forget),
        cmocka_unit_test(test_placement_owners),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
