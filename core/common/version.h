/* What this build is (cmake/build_info.cmake generates the facts at build time): the
 * version, the source's git commit, the build type and the optional parts built in. `--version`
 * on every program prints it; the Info RPC reports it. */
#ifndef BW_COMMON_VERSION_H
#define BW_COMMON_VERSION_H

#include <stdbool.h>
#include <stdio.h>

/* `git describe --always --dirty` of the source tree at build time, or "unknown". */
const char *bw__build_commit(void);

/* CMAKE_BUILD_TYPE ("Release", "Debug", ...). */
const char *bw__build_type(void);

/* Optional parts built in, as names ("tls", "cuda"); sets *n. */
const char *const *bw__build_features(size_t *n);

/* Prints "PROG VERSION commit=... build=... tls=yes cuda=no[ sanitize=...]" and a newline. */
void bw__version_print(FILE *out, const char *prog);

/* For programs without a settings table: true (after printing the version to stdout) when
 * argv holds --version. */
bool bw__version_flag(int argc, char **argv, const char *prog);

#endif
