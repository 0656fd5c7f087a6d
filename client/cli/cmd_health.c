/* batchwire health: the standard gRPC health check against any batchwire daemon. */
#include <stdio.h>
#include <string.h>

#include "commands.h"

typedef struct health_cfg {
    char *coordinator, *addr;
    char *service;
    int64_t timeout_ms;
    bw_cli_tls tls;
} health_cfg;

static const bw_opt options[] = {
    {"coordinator", BW_OPT_ADDR, offsetof(health_cfg, coordinator), NULL, 0, 0, NULL, 0,
     "HOST:PORT", "the coordinator to check, as for every other command"},
    {"addr", BW_OPT_ADDR, offsetof(health_cfg, addr), NULL, 0, 0, NULL, 0, "HOST:PORT",
     "any daemon to check instead, e.g. a worker (wins over --coordinator)"},
    {"service", BW_OPT_STRING, offsetof(health_cfg, service), "", 0, 0, NULL, 0, "NAME",
     "service name to check (empty: the whole server)"},
    {"timeout-ms", BW_OPT_INT, offsetof(health_cfg, timeout_ms), "5000", 1, 3600000, NULL, 0, "MS",
     "deadline of the call"},
    BW_CLI_TLS_OPTS(health_cfg, tls),
    BW_OPT_END,
};

int bw__cmd_health(int argc, char **argv)
{
    health_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    int status = bw__config_main(
        "batchwire health", "--coordinator HOST:PORT | --addr HOST:PORT [options]",
        "Exits 0 and prints SERVING when the daemon answers the gRPC health check, 1 otherwise. "
        "--coordinator checks the coordinator (like every other command, also from "
        "BATCHWIRE_COORDINATOR); --addr checks any batchwire daemon, a worker too.",
        options, &cfg, argc, argv);
    if (status < 0 && !cfg.addr && !cfg.coordinator) {
        fprintf(stderr, "batchwire health: --coordinator is required (or set "
                        "BATCHWIRE_COORDINATOR), or --addr HOST:PORT to check a worker or any "
                        "other daemon\n");
        status = 2;
    }
    if (status >= 0) {
        bw__config_free(options, &cfg);
        return status;
    }
    const char *target = cfg.addr ? cfg.addr : cfg.coordinator;
    char err[1024];
    bw_rpc_channel_opts co;
    bw_rpc_channel *ch = NULL;
    int crc = bw__cli_channel_opts(&cfg.tls, target, &co, err, sizeof(err));
    if (crc != BW_OK) {
        fprintf(stderr, "batchwire health: %s\n", err);
        bw__config_free(options, &cfg);
        return 2;
    }
    bw_arena arena;
    bw__arena_init(&arena, 0);
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = cfg.service;
    ProtobufCMessage *resp = NULL;
    int rc = bw__rpc_channel_open(&co, &ch, err, sizeof(err));
    if (rc == BW_OK)
        rc = bw__rpc_call(ch, BW_METHOD(BW_M_HEALTH_CHECK), &req.base, &arena, &resp,
                          (int)cfg.timeout_ms, err, sizeof(err));
    if (rc == BW_OK) {
        const Grpc__Health__V1__HealthCheckResponse *r = (const void *)resp;
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
            &grpc__health__v1__health_check_response__serving_status__descriptor, (int)r->status);
        printf("%s\n", v ? v->name : "UNKNOWN");
        status =
            r->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? 0 : 1;
    } else {
        fprintf(stderr, "batchwire health: %s\n", err);
        status = 1;
    }
    bw__arena_reset(&arena);
    bw__rpc_channel_close(ch);
    bw__config_free(options, &cfg);
    return status;
}
