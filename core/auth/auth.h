/*
 * Who may call what (docs/security.md): principals with a role, authenticated by a bearer
 * token or by a client certificate, and the one authorization table that says which roles may
 * call each RPC (and each data-channel request, which carries the same methods).
 *
 * The principals come from the file named by --auth-tokens, one a line:
 *     ROLE NAME TOKEN [ids=PATTERN[,PATTERN...]]
 * ROLE is worker, trainer or admin; NAME the principal's name (also what a client
 * certificate's subject common name must be to stand for it); TOKEN the bearer token itself
 * (at least 16 characters), "sha256:" and its SHA-256 in hex, or "-" for a certificate-only
 * principal. The fourth column, on worker lines only, binds the principal to the worker ids
 * it may register: fnmatch(3) patterns (without FNM_PATHNAME); without it the principal may
 * register only the id equal to its NAME (docs/security.md, "Worker ids"). Blank lines and
 * lines starting with '#' are ignored.
 *
 * Without a file the service is open: every caller is the anonymous principal, which may do
 * everything (as before authentication existed); the daemons warn at start.
 */
#ifndef BW_AUTH_H
#define BW_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "rpc/methods.h"

typedef enum bw_role {
    BW_ROLE_NONE = 0, /* not authenticated */
    BW_ROLE_WORKER = 1,
    BW_ROLE_TRAINER = 2,
    BW_ROLE_ADMIN = 4,
    BW_ROLE_OPEN = 8, /* the anonymous principal of a service without --auth-tokens */
    /* the coordinator calling a worker, proven by its grant-key proof (core/auth/grant.h);
     * never in a principals file */
    BW_ROLE_COORDINATOR = 16,
} bw_role;

enum { BW_PRINCIPAL_NAME_MAX = 256, BW_TOKEN_MAX = 4096 };

typedef struct bw_principal {
    bw_role role;
    char name[BW_PRINCIPAL_NAME_MAX]; /* "" for the anonymous principal */
} bw_principal;

/* The role's name ("worker", "trainer", "admin", "open", "none"). */
const char *bw__role_name(bw_role role);

typedef struct bw_auth bw_auth;

/*
 * Loads the principals of `tokens_path` (NULL: the service is open). BW_OK with *out, or
 * BW_INVALID_ARGUMENT / BW_IO with a sentence naming the file and line. Free with
 * bw__auth_free.
 */
int bw__auth_open(const char *tokens_path, bw_auth **out, char *err, size_t errlen);

/* NULL is a no-op. */
void bw__auth_free(bw_auth *a);

/* Whether principals were loaded (false: open service, or a == NULL). */
bool bw__auth_enabled(const bw_auth *a);

/* Reads the file again (on SIGHUP). On error the principals loaded before stay in force and
 * err says why. Thread-safe against concurrent checks. *count: principals now loaded. */
int bw__auth_reload(bw_auth *a, size_t *count, char *err, size_t errlen);

/*
 * Who the caller is and whether it may call `method`. `token` is the bearer token the caller
 * sent (NULL: none); `cert_name` the subject common name of its verified client certificate
 * (NULL: none). BW_OK with *who filled; BW_UNAUTHENTICATED when neither credential names a
 * principal (or they name two different ones); BW_PERMISSION_DENIED when the principal's role
 * may not call the method. err says why, without repeating any token. Thread-safe.
 * a == NULL or an open service: *who is the anonymous principal and everything is allowed.
 */
int bw__auth_check(bw_auth *a, bw_method_id method, const char *token, const char *cert_name,
                   bw_principal *who, char *err, size_t errlen);

/*
 * Whether `who` may register (and heartbeat as) worker id `id` (docs/security.md, "Worker
 * ids"): an admin or the anonymous principal of an open service any id; a worker principal the
 * ids its ids= patterns match, or without ids= only the id equal to its name. BW_OK, or
 * BW_PERMISSION_DENIED with a sentence naming the id and the principal and saying how to bind
 * it. The principal is looked up again, so a binding changed on SIGHUP applies at once.
 * Thread-safe.
 */
int bw__auth_worker_id(bw_auth *a, const bw_principal *who, const char *id, char *err,
                       size_t errlen);

/*
 * Warns (BW_WARN) when the credentials file open as `fd` can be written by its group or by
 * other users (whoever can write it chooses the credentials), and, when `secret`, when other
 * users can read it. `flag` names the file's option ("--auth-tokens", "--token-file",
 * "--grant-key") in the line. In token_file.c, so the client library warns about its token
 * file too (through its log callback).
 */
void bw__auth_warn_file_mode(int fd, const char *flag, const char *path, bool secret);

/* The authorization table: whether `role` may call `method`. */
bool bw__auth_allowed(bw_role role, bw_method_id method);

/* Whether `who` may act on an object owned by principal `owner` (its job, its worker id):
 * the owner itself, an admin, anyone on an open service, and anyone for an object without an
 * owner (made while the service was open). */
bool bw__auth_owns(const bw_principal *who, const char *owner);

/* The option-table row (common/config.h) of --token-file, for the char * field F of struct T:
 * one row for the daemons (their calls to each other) and every command-line tool. */
#define BW_OPT_TOKEN_FILE(T, F)                                                                    \
    {                                                                                              \
        "token-file", BW_OPT_PATH, offsetof(T, F), NULL, 0, 0, NULL, 0, "FILE",                    \
            "bearer token (first line of FILE) presented to daemons started with --auth-tokens "   \
            "(docs/security.md)"                                                                   \
    }

/*
 * Reads a bearer token from `path` (--token-file): the file's first line, surrounding
 * whitespace removed. *token is malloc'd (free it). BW_IO / BW_INVALID_ARGUMENT with a
 * sentence naming the file.
 */
int bw__auth_read_token_file(const char *path, char **token, char *err, size_t errlen);

#endif
