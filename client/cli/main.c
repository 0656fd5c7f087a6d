/* batchwire: the command-line tool. One subcommand per file (cmd_*.c). */
#include <stdio.h>
#include <string.h>

#include "batchwire/batchwire.h"
#include "commands.h"
#include "common/version.h"
#include "rpc/daemon.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"status", bw__cmd_status,
     "show the cluster: workers, jobs and every rank's progress (--job NAME: one job; "
     "--json; --watch)"},
    {"health", bw__cmd_health,
     "ask the coordinator (--coordinator) or any daemon (--addr) whether it is serving"},
    {"fetch", bw__cmd_fetch, "pull one rank's batches from a running cluster (JSON lines)"},
    {"plan", bw__cmd_plan, "print the batches each rank gets, offline (JSON lines)"},
    {"gen", bw__cmd_gen, "write a synthetic dataset (npy, npz, tfrecord, jsonl, tar, files)"},
    {"job", bw__cmd_job, "manage jobs on the coordinator: job delete --job NAME"},
};

static void usage(FILE *out)
{
    fprintf(out, "Usage: batchwire COMMAND [options]   (batchwire COMMAND --help for details)\n\n"
                 "Commands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(out, "  %-8s %s\n", commands[i].name, commands[i].help);
    fprintf(out, "  version  print the version and what this build has (also --version)\n");
}

int main(int argc, char **argv)
{
    /* Errors reach the user through each command's own message; gRPC's internal log lines
     * (handshake failures and the like) would only repeat them in another format. */
    bw__daemon_route_grpc_logs(BW_LOG_ERROR);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "version") == 0 || strcmp(argv[1], "--version") == 0) {
        bw__version_print(stdout, "batchwire");
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "batchwire: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
