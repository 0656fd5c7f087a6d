/* What this build is (version.h): the version, commit, build type and optional parts, as
 * `--version` prints them and the Info RPC reports them. */
#include "common/version.h"

#include <string.h>

#include "batchwire/batchwire.h"
#include "bw_build_info.h"

const char *bw_version(void)
{
    return BW_BUILD_VERSION;
}

const char *bw__build_commit(void)
{
    return BW_BUILD_COMMIT;
}

const char *bw__build_type(void)
{
    return BW_BUILD_TYPE;
}

const char *const *bw__build_features(size_t *n)
{
    /* TLS is always built (OpenSSL is required); the GPU copy path when CUDA was found. */
    static const char *const features[] = {"tls", "cuda"};
    *n = BW_BUILD_CUDA ? 2 : 1;
    return features;
}

const char *bw_build_info(void)
{
    return BW_BUILD_INFO;
}

void bw__version_print(FILE *out, const char *prog)
{
    fprintf(out, "%s %s\n", prog, bw_build_info());
}

bool bw__version_flag(int argc, char **argv, const char *prog)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--version") == 0) {
            bw__version_print(stdout, prog);
            return true;
        }
    return false;
}
