/* The coordinator's state directory: created if missing, and locked so that two coordinators
 * never share one (docs/operating.md, "The coordinator"). */
#ifndef BW_SERVER_STATE_DIR_H
#define BW_SERVER_STATE_DIR_H

#include <stddef.h>

/*
 * Creates `dir` if needed and takes an exclusive flock on DIR/LOCK, writing "pid N" into it.
 * On success *fd holds the lock until it is closed (or the process dies, even by SIGKILL).
 * Returns BW_ALREADY_EXISTS with the holder's pid in err when another process holds it, or
 * BW_IO; *fd is then -1.
 */
int bw__state_dir_lock(const char *dir, int *fd, char *err, size_t errlen);

#endif
