/* The coordinator's state directory (state_dir.h): created if missing and locked, so two
 * coordinators never share one. */
#include "state_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "batchwire/batchwire.h"

int bw__state_dir_lock(const char *dir, int *fd, char *err, size_t errlen)
{
    *fd = -1;
    if (mkdir(dir, 0750) != 0 && errno != EEXIST) {
        snprintf(err, errlen, "--state-dir %s: cannot create: %s", dir, strerror(errno));
        return BW_IO;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s/LOCK", dir);
    *fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (*fd < 0) {
        snprintf(err, errlen, "--state-dir %s: cannot open %s: %s", dir, path, strerror(errno));
        return BW_IO;
    }
    if (flock(*fd, LOCK_EX | LOCK_NB) != 0) {
        char holder[64] = "";
        ssize_t n = pread(*fd, holder, sizeof(holder) - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        snprintf(err, errlen,
                 "--state-dir %s is in use by another coordinator (%s holds %s); two "
                 "coordinators must not share a state directory",
                 dir, *holder ? holder : "another process", path);
        close(*fd);
        *fd = -1;
        return BW_ALREADY_EXISTS;
    }
    char me[64];
    int len = snprintf(me, sizeof(me), "pid %d\n", (int)getpid());
    if (ftruncate(*fd, 0) != 0 || pwrite(*fd, me, (size_t)len, 0) != len) {
        snprintf(err, errlen, "--state-dir %s: cannot write %s: %s", dir, path, strerror(errno));
        close(*fd);
        *fd = -1;
        return BW_IO;
    }
    return BW_OK;
}
