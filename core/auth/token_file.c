/* A caller's credential: the bearer token of --token-file (docs/security.md, auth.h). The only
 * part of core/auth/ that the client library contains; the daemons' principals and table are
 * in auth.c. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/auth.h"
#include "batchwire/batchwire.h"

int bw__auth_read_token_file(const char *path, char **token, char *err, size_t errlen)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(err, errlen, "--token-file %s: %s", path, strerror(errno));
        return BW_IO;
    }
    char buf[BW_TOKEN_MAX + 2];
    char *line = fgets(buf, sizeof(buf), f);
    fclose(f);
    if (!line) {
        snprintf(err, errlen, "--token-file %s is empty", path);
        return BW_INVALID_ARGUMENT;
    }
    size_t len = strlen(buf);
    if (len > BW_TOKEN_MAX) {
        snprintf(err, errlen, "--token-file %s: the token is longer than %d bytes", path,
                 BW_TOKEN_MAX);
        return BW_INVALID_ARGUMENT;
    }
    while (len && isspace((unsigned char)buf[len - 1]))
        buf[--len] = 0;
    char *p = buf;
    while (isspace((unsigned char)*p))
        p++;
    if (!*p) {
        snprintf(err, errlen, "--token-file %s holds no token on its first line", path);
        return BW_INVALID_ARGUMENT;
    }
    for (char *q = p; *q; q++)
        if ((unsigned char)*q < 0x21 || (unsigned char)*q > 0x7e) {
            snprintf(err, errlen,
                     "--token-file %s: the token holds a space or a character outside printable "
                     "ASCII",
                     path);
            return BW_INVALID_ARGUMENT;
        }
    *token = strdup(p);
    if (!*token) {
        snprintf(err, errlen, "out of memory");
        return BW_NOMEM;
    }
    return BW_OK;
}
