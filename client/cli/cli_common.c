#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/auth.h"
#include "commands.h"

int bw__cli_channel_opts(const bw_cli_tls *t, const char *target, bw_rpc_channel_opts *o, char *err,
                         size_t errlen)
{
    /* One token per run of the tool: kept here for the process's life. */
    static char token[BW_TOKEN_MAX + 1];
    memset(o, 0, sizeof(*o));
    o->target = target;
    o->tls.ca = t->tls_ca;
    o->tls.cert = t->tls_cert;
    o->tls.key = t->tls_key;
    o->tls.server_name = t->tls_server_name;
    o->tls.use_tls = t->tls;
    o->max_receive_bytes = 64 << 20;
    if (t->token_file) {
        char *tok = NULL;
        int rc = bw__auth_read_token_file(t->token_file, &tok, err, errlen);
        if (rc != BW_OK)
            return rc;
        snprintf(token, sizeof(token), "%s", tok);
        free(tok);
        o->tls.token = token;
    }
    return BW_OK;
}
