/* Scratch directories for unit tests: below $BW_TEST_TMP (ctest sets it), else $TMPDIR, else
 * /tmp. Both return 0 on success, -1 on failure. */
#ifndef BW_TEST_DIR_H
#define BW_TEST_DIR_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* Makes a fresh PREFIX-XXXXXX directory; its path goes to dir. */
static inline int bw_test_dir_make(char *dir, size_t len, const char *prefix)
{
    const char *base = getenv("BW_TEST_TMP");
    if (!base || !*base)
        base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0755);
    snprintf(dir, len, "%s/%s-XXXXXX", base, prefix);
    return mkdtemp(dir) ? 0 : -1;
}

/* Removes the directory and everything in it. */
static inline int bw_test_dir_remove(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

#endif
