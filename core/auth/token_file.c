/* A caller's credential: the bearer token of --token-file (docs/security.md, auth.h), and the
 * warning about credentials files that others can write. The only part of core/auth/ that the
 * client library contains; the daemons' principals and table are in auth.c. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "auth/auth.h"
#include "batchwire/batchwire.h"
#include "common/log.h"

void bw__auth_warn_file_mode(int fd, const char *flag, const char *path, bool secret)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return;
    unsigned mode = (unsigned)(st.st_mode & 0777);
    if (mode & 0022)
        BW_WARN("auth: the %s file can be written by %s; whoever can write it chooses the "
                "credentials: chmod 600 it (docs/security.md) file=%s mode=%03o",
                flag, (mode & 0002) ? "every user" : "its group", path, mode);
    if (secret && (mode & 0004))
        BW_WARN("auth: the %s file can be read by every user; it holds credentials: chmod 600 "
                "it (docs/security.md) file=%s mode=%03o",
                flag, path, mode);
}

int bw__auth_read_token_file(const char *path, char **token, char *err, size_t errlen)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        snprintf(err, errlen, "--token-file %s: %s", path, strerror(errno));
        return BW_IO;
    }
    bw__auth_warn_file_mode(fileno(f), "--token-file", path, false);
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
