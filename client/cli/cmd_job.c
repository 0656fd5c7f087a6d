/* batchwire job delete: removes a job from the coordinator (its owner or an admin;
 * docs/security.md, "Jobs"). */
#include <stdio.h>
#include <string.h>

#include "commands.h"

typedef struct job_cfg {
    char *coordinator;
    char *job;
    int64_t timeout_ms;
    bw_cli_tls tls;
} job_cfg;

static const bw_opt options[] = {
    {"coordinator", BW_OPT_ADDR, offsetof(job_cfg, coordinator), NULL, 0, 0, NULL, BW_OPT_REQUIRED,
     "HOST:PORT", "the coordinator that holds the job"},
    {"job", BW_OPT_STRING, offsetof(job_cfg, job), NULL, 0, 0, NULL,
     BW_OPT_REQUIRED | BW_OPT_NO_ENV, "NAME", "the job to delete"},
    {"timeout-ms", BW_OPT_INT, offsetof(job_cfg, timeout_ms), "10000", 1, 3600000, NULL, 0, "MS",
     "deadline of the call"},
    BW_CLI_TLS_OPTS(job_cfg, tls),
    BW_OPT_END,
};

static int job_delete(int argc, char **argv)
{
    job_cfg cfg;
    memset(&cfg, 0, sizeof(cfg));
    int status = bw__config_main(
        "batchwire job delete", "--coordinator HOST:PORT --job NAME [options]",
        "Deletes a job: its ranks' leases and committed cursors on the coordinator. Cursors "
        "saved in checkpoints stay valid: a job created again with the same name, dataset and "
        "sampler resumes from them. Only the job's owner or an admin may delete it.",
        options, &cfg, argc, argv);
    if (status >= 0) {
        bw__config_free(options, &cfg);
        return status;
    }
    char err[1024];
    bw_rpc_channel_opts co;
    bw_rpc_channel *ch = NULL;
    bw_arena arena;
    bw__arena_init(&arena, 0);
    int rc = bw__cli_channel_opts(&cfg.tls, cfg.coordinator, &co, err, sizeof(err));
    if (rc == BW_OK)
        rc = bw__rpc_channel_open(&co, &ch, err, sizeof(err));
    if (rc == BW_OK) {
        Batchwire__V1__DeleteJobRequest req = BATCHWIRE__V1__DELETE_JOB_REQUEST__INIT;
        req.job = cfg.job;
        ProtobufCMessage *resp = NULL;
        rc = bw__rpc_call(ch, BW_METHOD(BW_M_JOBS_DELETE), &req.base, &arena, &resp,
                          (int)cfg.timeout_ms, err, sizeof(err));
    }
    if (rc == BW_OK)
        printf("deleted job '%s'\n", cfg.job);
    else
        fprintf(stderr, "batchwire job delete: %s\n", err);
    bw__arena_reset(&arena);
    bw__rpc_channel_close(ch);
    bw__config_free(options, &cfg);
    return rc == BW_OK ? 0 : 1;
}

int bw__cmd_job(int argc, char **argv)
{
    if (argc >= 2 && strcmp(argv[1], "delete") == 0)
        return job_delete(argc - 1, argv + 1);
    FILE *out = argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
                    ? stdout
                    : stderr;
    if (argc >= 2 && out == stderr)
        fprintf(stderr, "batchwire job: unknown subcommand '%s'\n\n", argv[1]);
    fprintf(out, "Usage: batchwire job delete --coordinator HOST:PORT --job NAME [options]\n");
    return out == stdout ? 0 : 2;
}
