#include <stdio.h>
#include <string.h>

#include "commands.h"

void bw__cli_channel_opts(const bw_cli_tls *t, const char *target, bw_rpc_channel_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->target = target;
    o->tls.ca = t->tls_ca;
    o->tls.cert = t->tls_cert;
    o->tls.key = t->tls_key;
    o->tls.server_name = t->tls_server_name;
    o->tls.use_tls = t->tls;
    o->max_receive_bytes = 64 << 20;
}
