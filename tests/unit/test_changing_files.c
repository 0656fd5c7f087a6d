/* Dataset files that change while open (docs/formats.md, "Files that change under a worker"):
 * the SIGBUS guard turns a read past a truncated file's end into zeros and a faulted mapping
 * instead of a dead process, and bw__dataset_check / bw__dataset_changed see truncation,
 * in-place writes, deletion and replacement by rename. */
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "test_dir.h"
#include "formats/dataset.h"

enum { LINES = 4000 };

static char dir[512], path[1024], err[1024];

/* A text file of LINES lines of 63 characters and a newline (250 KiB), opened and indexed. */
static bw__dataset *open_text(void)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < LINES; i++) {
        char line[64];
        memset(line, 'a' + i % 26, 63);
        line[63] = '\n';
        assert_int_equal(fwrite(line, 1, 64, f), 64);
    }
    assert_int_equal(fclose(f), 0);
    const char *src[] = {"t.txt"};
    bw__dataset *d = NULL;
    int rc = bw__dataset_open(dir, "text", src, 1, &d, err, sizeof(err));
    if (rc != BW_OK)
        fail_msg("open: %s", err);
    assert_int_equal(bw__dataset_index(d, err, sizeof(err)), BW_OK);
    assert_int_equal(d->length, LINES);
    assert_int_equal(bw__dataset_check(d, 0, err, sizeof(err)), BW_OK);
    assert_false(bw__dataset_changed(d, NULL, 0));
    return d;
}

/* The file's times move on the next clock tick of the kernel: wait for one. */
static void next_tick(void)
{
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

static void expect_changed(bw__dataset *d, const char *needle)
{
    err[0] = '\0';
    assert_int_equal(bw__dataset_check(d, 0, err, sizeof(err)), BW_FAILED_PRECONDITION);
    if (!strstr(err, "t.txt changed on disk") || !strstr(err, needle))
        fail_msg("check said: %s (wanted '%s')", err, needle);
    assert_true(bw__dataset_changed(d, NULL, 0));
}

static void truncated_reads_zeros_not_sigbus(void **state)
{
    (void)state;
    bw__dataset *d = open_text();
    bw__record r;
    assert_int_equal(bw__dataset_get(d, LINES - 1, &r, err, sizeof(err)), BW_OK);
    const volatile uint8_t *p = r.parts[0].p; /* page(s) at the end of the mapping */
    assert_int_equal(p[0], 'a' + (LINES - 1) % 26);
    assert_int_equal(truncate(path, 4096), 0);
    /* Without the guard this read kills the process with SIGBUS. */
    assert_int_equal(p[0], 0);
    assert_true(atomic_load(&d->sources[0]->map->faulted));
    expect_changed(d, "its size is now 4096 bytes, it was 256000");
    /* The first page is still the file's. */
    assert_int_equal(bw__dataset_get(d, 0, &r, err, sizeof(err)), BW_OK);
    assert_int_equal(r.parts[0].p[0], 'a');
    bw__dataset_free(d);
}

static void written_in_place(void **state)
{
    (void)state;
    bw__dataset *d = open_text();
    next_tick();
    int fd = open(path, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "zz", 2, 1000), 2); /* same size */
    close(fd);
    expect_changed(d, "it was written to");
    bw__dataset_free(d);
}

static void deleted_or_renamed_over(void **state)
{
    (void)state;
    bw__dataset *d = open_text();
    assert_int_equal(unlink(path), 0);
    expect_changed(d, "it was deleted or replaced");
    bw__dataset_free(d);

    d = open_text();
    char other[1100];
    snprintf(other, sizeof(other), "%s.new", path);
    FILE *f = fopen(other, "wb");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(rename(other, path), 0);
    expect_changed(d, "it was deleted or replaced");
    bw__dataset_free(d);
}

static int setup(void **state)
{
    (void)state;
    if (bw_test_dir_make(dir, sizeof(dir), "changing") != 0)
        return -1;
    snprintf(path, sizeof(path), "%s/t.txt", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return bw_test_dir_remove(dir);
}

int main(void)
{
    /* cmocka sets its own SIGBUS handler around each test and restores the one before it
     * afterwards, so the guard (installed once, at the first mapping) is in place only in the
     * test that maps first: this one. */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(truncated_reads_zeros_not_sigbus),
        cmocka_unit_test(written_in_place),
        cmocka_unit_test(deleted_or_renamed_over),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
