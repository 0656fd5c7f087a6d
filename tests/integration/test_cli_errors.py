"""Command-line and start-up errors of batchwire-coordinator, batchwire-worker and batchwire.

* --help works for every program (and subcommand), exit 0, lists the flags and their
  environment variables;
* a bad flag or BATCHWIRE_* environment value exits 2 with one message naming the flag (or
  variable) and the value; so do unknown options, missing values and missing required flags;
* valid environment values are applied and a flag overrides its variable;
* a second coordinator on the same --state-dir refuses to start, naming the lock and the pid
  that holds it; the lock is released on SIGTERM and on SIGKILL;
* missing, empty, malformed, mismatched or expired TLS files: exit 1 at start with a message
  naming the flag and file, before listening.
"""

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402

COORD = bt.COORDINATOR
WORKER = bt.WORKER
CLI = bt.CLI
NAMES = {COORD: "batchwire-coordinator", WORKER: "batchwire-worker"}


def prog_name(argv):
    if argv[0] == CLI:
        sub = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
        return "batchwire %s" % sub if sub in ("status", "health") else "batchwire"
    return NAMES[argv[0]]


def expect_exit(argv, code, needles=(), env=None, what=None, timeout=15):
    """Runs argv; asserts the exit status, an empty stdout and every needle on stderr."""
    argv = [str(a) for a in argv]
    t = time.monotonic()
    r = bt.run(argv, env=env, timeout=timeout)
    el = time.monotonic() - t
    shown = " ".join(os.path.basename(a) if a in (COORD, WORKER, CLI) else a for a in argv)
    if env:
        shown = " ".join("%s=%s" % kv for kv in env.items()) + " " + shown
    what = what or shown
    detail = "command: %s\nexit: %s\nstdout:\n%s\nstderr:\n%s" % (shown, r.returncode, r.stdout,
                                                                   r.stderr)
    if r.returncode != code:
        raise bt.TestFailure("%s: expected exit %d, got %d" % (what, code, r.returncode) +
                             "\n" + detail)
    if r.stdout != "":
        raise bt.TestFailure("%s: expected nothing on stdout" % what + "\n" + detail)
    for n in needles:
        if n not in r.stderr:
            raise bt.TestFailure("%s: expected %r on stderr" % (what, n) + "\n" + detail)
    if "listening on" in r.stderr:
        raise bt.TestFailure("%s: started listening before failing" % what + "\n" + detail)
    first = r.stderr.strip().splitlines()[0] if r.stderr.strip() else ""
    bt.ok("%s -> exit %d in %.2fs: %s" % (what, code, el, first[:170]))
    return r


# ---------------------------------------------------------------------------

def check_help():
    bt.log("--- --help ---")
    cases = [
        ([COORD, "--help"], "Usage: batchwire-coordinator",
         ["--listen", "--state-dir", "--heartbeat-ms", "--dead-after", "--tls-cert", "--tls-key",
          "--tls-client-ca", "--log-level", "--threads", "--max-message-bytes",
          "--shutdown-grace-ms", "BATCHWIRE_HEARTBEAT_MS", "BATCHWIRE_STATE_DIR"]),
        ([WORKER, "--help"], "Usage: batchwire-worker",
         ["--coordinator", "--listen", "--data-root", "--id", "--advertise", "--tls-ca",
          "--tls-cert", "--tls-key", "--tls-client-ca", "--tls-server-name", "--rpc-timeout-ms",
          "BATCHWIRE_COORDINATOR", "BATCHWIRE_DATA_ROOT"]),
        ([CLI, "--help"], "Usage: batchwire", ["status", "health"]),
        ([CLI, "status", "--help"], "Usage: batchwire status",
         ["--coordinator", "--json", "--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name",
          "--timeout-ms", "BATCHWIRE_COORDINATOR"]),
        ([CLI, "health", "--help"], "Usage: batchwire health",
         ["--coordinator", "--addr", "--service", "--tls-ca", "--timeout-ms"]),
        ([CLI, "status", "--help"], "Usage: batchwire status", ["--job NAME"]),
        ([WORKER, "--help"], "Usage: batchwire-worker", ["--takeover", "HOST:PORT"]),
        # -h, and --help wins over other (even bad) arguments and environment values.
        ([COORD, "-h"], "Usage: batchwire-coordinator", ["--state-dir"]),
        ([COORD, "--heartbeat-ms", "abc", "--help"], "Usage: batchwire-coordinator",
         ["--state-dir"]),
        ([WORKER, "--help", "--bogus"], "Usage: batchwire-worker", ["--data-root"]),
    ]
    for argv, head, words in cases:
        env = {"BATCHWIRE_HEARTBEAT_MS": "abc"} if argv[1:2] == ["-h"] else None
        r = bt.run([str(a) for a in argv], env=env, timeout=15)
        name = " ".join([os.path.basename(argv[0])] + argv[1:])
        missing = [w for w in words if w not in r.stdout]
        bt.check(r.returncode == 0 and r.stdout.startswith(head) and not missing,
                 "%s%s: exit 0, stdout starts with %r and lists %d flags/commands" %
                 ("BATCHWIRE_HEARTBEAT_MS=abc " if env else "", name, head, len(words)),
                 "exit %d, missing %r\nstdout:\n%s\nstderr:\n%s" %
                 (r.returncode, missing, r.stdout, r.stderr))


def check_bad_values(tmp):
    bt.log("--- bad flag values: exit 2 naming the flag and the value ---")
    data = os.path.join(tmp, "data")
    os.makedirs(data, exist_ok=True)
    sd = os.path.join(tmp, "state-bad")

    def base(prog, without=None):
        b = {COORD: [("--listen", "127.0.0.1:0"), ("--state-dir", sd)],
             WORKER: [("--listen", "127.0.0.1:0"), ("--coordinator", "127.0.0.1:1"),
                      ("--data-root", data)],
             "status": [("--coordinator", "127.0.0.1:1")],
             "health": [("--addr", "127.0.0.1:1")]}[prog]
        out = [CLI, prog] if prog in ("status", "health") else [prog]
        for k, v in b:
            if k != without:
                out += [k, v]
        return out

    flag_cases = [
        (COORD, "--heartbeat-ms", "abc", "expected an integer from 10 to 600000"),
        (COORD, "--heartbeat-ms", "5", "expected an integer from 10 to 600000"),
        (COORD, "--heartbeat-ms", "600001", "expected an integer from 10 to 600000"),
        (COORD, "--heartbeat-ms", "100ms", "expected an integer"),
        (COORD, "--dead-after", "0", "expected an integer from 1 to 1000"),
        (COORD, "--dead-after", "2.5", "expected an integer from 1 to 1000"),
        (COORD, "--log-level", "loud", "expected one of error|warn|info|debug"),
        (COORD, "--listen", "localhost", "HOST:PORT"),
        (COORD, "--listen", "127.0.0.1:70000", "70000"),
        (COORD, "--listen", "127.0.0.1:", "port"),
        (COORD, "--threads", "0", "expected an integer from 1 to 64"),
        (COORD, "--max-message-bytes", "1024", "expected an integer from 65536 to 1073741824"),
        (COORD, "--shutdown-grace-ms", "-1", "expected an integer from 0 to 600000"),
        (COORD, "--state-dir", "", "non-empty"),
        (COORD, "--tls-cert", "", "non-empty"),
        (WORKER, "--coordinator", "nohost", "HOST:PORT"),
        (WORKER, "--coordinator", "::1:80", "brackets"),
        (WORKER, "--listen", "[::1", "[IPV6]:PORT"),
        (WORKER, "--advertise", "x", "HOST:PORT"),
        (WORKER, "--rpc-timeout-ms", "0", "expected an integer from 10 to 600000"),
        (WORKER, "--data-root", "", "non-empty"),
        (WORKER, "--log-level", "verbose", "expected one of error|warn|info|debug"),
        ("status", "--timeout-ms", "1s", "expected an integer from 1 to 3600000"),
        ("status", "--timeout-ms", "0", "expected an integer from 1 to 3600000"),
        ("status", "--json=", "maybe", "expected true or false"),
        ("status", "--coordinator", "nope", "HOST:PORT"),
        ("health", "--addr", "1.2.3.4:99999", "99999"),
        ("health", "--coordinator", "nope", "HOST:PORT"),
        ("health", "--timeout-ms", "-3", "expected an integer from 1 to 3600000"),
    ]
    for prog, flag, value, why in flag_cases:
        if flag.endswith("="):
            argv = base(prog) + [flag + value]
            flag = flag[:-1]
        else:
            argv = base(prog, without=flag) + [flag, value]
        want = "%s: %s: invalid value '%s': " % (prog_name(argv), flag, value)
        r = expect_exit(argv, 2, [want, why])
        bt.check(r.stderr.startswith(want), "  ... and the message is the first thing on stderr",
                 r.stderr)
    # The exact wording from the contract.
    r = expect_exit(base(COORD) + ["--heartbeat-ms", "abc"], 2)
    exact = ("batchwire-coordinator: --heartbeat-ms: invalid value 'abc': expected an integer "
             "from 10 to 600000")
    bt.check(r.stderr.strip() == exact, "the whole stderr is exactly: %s" % exact, r.stderr)

    bt.log("--- bad environment values: exit 2 naming the variable and the value ---")
    env_cases = [
        (COORD, "BATCHWIRE_HEARTBEAT_MS", "--heartbeat-ms", "abc",
         "expected an integer from 10 to 600000"),
        (COORD, "BATCHWIRE_DEAD_AFTER", "--dead-after", "-1", "expected an integer from 1 to 1000"),
        (COORD, "BATCHWIRE_LOG_LEVEL", "--log-level", "LOUD", "expected one of"),
        (COORD, "BATCHWIRE_LISTEN", "--listen", "nope", "HOST:PORT"),
        (COORD, "BATCHWIRE_MAX_MESSAGE_BYTES", "--max-message-bytes", "big", "expected an integer"),
        (WORKER, "BATCHWIRE_RPC_TIMEOUT_MS", "--rpc-timeout-ms", "soon", "expected an integer"),
        (WORKER, "BATCHWIRE_COORDINATOR", "--coordinator", ":1", "HOST:PORT"),
        ("status", "BATCHWIRE_TIMEOUT_MS", "--timeout-ms", "x", "expected an integer"),
        ("status", "BATCHWIRE_JSON", "--json", "maybe", "expected true or false"),
        ("health", "BATCHWIRE_ADDR", "--addr", "1.2.3.4", "HOST:PORT"),
    ]
    for prog, var, flag, value, why in env_cases:
        argv = base(prog, without=flag)
        want = "%s: %s (environment): invalid value '%s': " % (prog_name(argv), var, value)
        expect_exit(argv, 2, [want, why], env={var: value})
    r = expect_exit(base(COORD, without="--heartbeat-ms"), 2, env={"BATCHWIRE_HEARTBEAT_MS": "abc"})
    exact = ("batchwire-coordinator: BATCHWIRE_HEARTBEAT_MS (environment): invalid value 'abc': "
             "expected an integer from 10 to 600000")
    bt.check(r.stderr.strip() == exact, "the whole stderr is exactly: %s" % exact, r.stderr)

    bt.log("--- unknown options, missing values, missing required flags, stray arguments ---")
    expect_exit(base(COORD) + ["--bogus", "1"], 2,
                ["batchwire-coordinator: unknown option '--bogus'"])
    expect_exit(base(WORKER) + ["--bogus=1"], 2, ["batchwire-worker: unknown option '--bogus'"])
    expect_exit(base("status") + ["--bogus"], 2, ["batchwire status: unknown option '--bogus'"])
    expect_exit(base(COORD) + ["--heartbeat-ms"], 2,
                ["batchwire-coordinator: --heartbeat-ms: missing value"])
    expect_exit(base(COORD) + ["stray"], 2,
                ["batchwire-coordinator: unexpected argument 'stray'"])
    expect_exit(base(COORD, without="--state-dir"), 2,
                ["batchwire-coordinator: --state-dir is required", "BATCHWIRE_STATE_DIR"])
    expect_exit(base(WORKER, without="--coordinator"), 2,
                ["batchwire-worker: --coordinator is required", "BATCHWIRE_COORDINATOR"])
    expect_exit(base(WORKER, without="--data-root"), 2,
                ["batchwire-worker: --data-root is required", "BATCHWIRE_DATA_ROOT"])
    expect_exit(base("status", without="--coordinator"), 2,
                ["batchwire status: --coordinator is required"])
    expect_exit(base("health", without="--addr"), 2,
                ["batchwire health: --coordinator is required", "--addr HOST:PORT"])
    expect_exit([CLI], 2, ["Usage: batchwire"])
    expect_exit([CLI, "nosuch"], 2, ["batchwire: unknown command 'nosuch'", "Usage: batchwire"])
    bt.check(not os.path.exists(sd), "no bad invocation created the --state-dir %s" % sd)


def check_env_applied(tmp):
    bt.log("--- valid environment values are applied; flags override them ---")
    sd = os.path.join(tmp, "state-env")
    env = {"BATCHWIRE_LISTEN": "127.0.0.1:0", "BATCHWIRE_STATE_DIR": sd,
           "BATCHWIRE_HEARTBEAT_MS": "250", "BATCHWIRE_DEAD_AFTER": "4"}
    c = bt.Daemon("coordinator-env", [COORD], tmp, env=env)
    c.wait_listening()
    bt.check("state-dir=%s heartbeat=250ms dead-after=4" % sd in c.first_line and
             c.addr.startswith("127.0.0.1:"),
             "coordinator configured only through BATCHWIRE_* uses them: %s" % c.first_line)
    st = bt.status_json(c.addr)
    bt.check(st["heartbeat_interval_ms"] == 250 and st["missed_heartbeats_dead"] == 4,
             "status reports heartbeat 250 ms and dead-after 4 from the environment", st)
    bt.check(c.stop() == 0, "it stops with exit 0 on SIGTERM", c.log_text())
    c = bt.Daemon("coordinator-env-flag", [COORD, "--heartbeat-ms", "300"], tmp, env=env)
    c.wait_listening()
    bt.check("heartbeat=300ms dead-after=4" in c.first_line,
             "--heartbeat-ms 300 overrides BATCHWIRE_HEARTBEAT_MS=250: %s" % c.first_line)
    bt.check(c.stop() == 0, "it stops with exit 0 on SIGTERM", c.log_text())


def check_state_dir_lock(tmp):
    bt.log("--- one coordinator per --state-dir ---")
    sd = os.path.join(tmp, "state-shared")
    c1 = bt.coordinator(tmp, name="coordinator-1", state_dir=sd)
    lock = os.path.join(sd, "LOCK")
    r = expect_exit([COORD, "--listen", "127.0.0.1:0", "--state-dir", sd], 1,
                    ["cannot start err=--state-dir %s is in use by another coordinator" % sd,
                     "pid %d" % c1.pid, lock],
                    what="second coordinator on the same --state-dir")
    bt.check(re.search(r"ERROR +coordinator\[\d+\]: cannot start err=", r.stderr),
             "the refusal is an ERROR log line", r.stderr)
    r = bt.cli("health", "--addr", c1.addr)
    bt.check(r.returncode == 0 and r.stdout.strip() == "SERVING",
             "the first coordinator is still SERVING", r.stdout + r.stderr)
    bt.check(c1.stop() == 0, "the first coordinator exits 0 on SIGTERM", c1.log_text())
    c2 = bt.coordinator(tmp, name="coordinator-2", state_dir=sd)
    bt.ok("after it stopped, a new coordinator takes the same --state-dir (%s)" % c2.addr)
    c2.kill9()
    c3 = bt.coordinator(tmp, name="coordinator-3", state_dir=sd)
    bt.ok("after SIGKILL of that one (stale LOCK file left), another takes it (%s)" % c3.addr)
    expect_exit([COORD, "--listen", "127.0.0.1:0", "--state-dir", sd], 1,
                ["pid %d" % c3.pid, lock], what="and a second one is refused again")
    bt.check(c3.stop() == 0, "it exits 0 on SIGTERM", c3.log_text())


def check_tls_files(tmp):
    bt.log("--- missing / malformed TLS files: exit 1 at start, naming flag and file ---")
    pki = bt.make_pki(tmp)
    expired_crt, expired_key = bt.make_expired(pki)
    d = os.path.join(tmp, "bad-tls")
    os.makedirs(d)
    missing = os.path.join(d, "missing.pem")
    garbage = os.path.join(d, "garbage.pem")
    with open(garbage, "w") as f:
        f.write("this is not PEM\n")
    empty = os.path.join(d, "empty.pem")
    open(empty, "w").close()
    truncated = os.path.join(d, "truncated.pem")
    with open(pki["server_crt"]) as f:
        pem = f.read()
    with open(truncated, "w") as f:
        f.write(pem[: len(pem) // 2])
    data = os.path.join(tmp, "data")
    os.makedirs(data, exist_ok=True)
    n = [0]

    def coord(*args):
        n[0] += 1
        return [COORD, "--listen", "127.0.0.1:0", "--state-dir",
                os.path.join(tmp, "state-tls-%d" % n[0])] + list(args)

    def worker(*args):
        return [WORKER, "--listen", "127.0.0.1:0", "--coordinator", "127.0.0.1:1",
                "--data-root", data, "--id", "w"] + list(args)

    def status(*args):
        return [CLI, "status", "--coordinator", "127.0.0.1:1", "--timeout-ms", "3000"] + list(args)

    crt, key = pki["server_crt"], pki["server_key"]
    cases = [
        (coord("--tls-cert", missing, "--tls-key", key),
         ["--tls-cert %s: cannot open: No such file or directory" % missing]),
        (coord("--tls-cert", garbage, "--tls-key", key),
         ["--tls-cert %s: not a PEM certificate" % garbage]),
        (coord("--tls-cert", truncated, "--tls-key", key),
         ["--tls-cert %s: not a PEM certificate" % truncated]),
        (coord("--tls-cert", empty, "--tls-key", key), ["--tls-cert %s: file is empty" % empty]),
        (coord("--tls-cert", d, "--tls-key", key), ["--tls-cert %s: not a regular file" % d]),
        (coord("--tls-cert", key, "--tls-key", key), ["--tls-cert %s: not a PEM certificate" % key]),
        (coord("--tls-cert", crt, "--tls-key", missing), ["--tls-key %s: cannot open" % missing]),
        (coord("--tls-cert", crt, "--tls-key", garbage),
         ["--tls-key %s: not a PEM private key" % garbage]),
        (coord("--tls-cert", crt, "--tls-key", crt), ["--tls-key %s: not a PEM private key" % crt]),
        (coord("--tls-cert", crt, "--tls-key", pki["client_key"]),
         ["--tls-key %s does not match the certificate in --tls-cert %s" %
          (pki["client_key"], crt)]),
        (coord("--tls-cert", crt), ["--tls-key", "missing"]),
        (coord("--tls-key", key), ["--tls-cert", "missing"]),
        (coord("--tls-client-ca", pki["ca"]), ["--tls-cert", "missing"]),
        (coord("--tls-cert", crt, "--tls-key", key, "--tls-client-ca", garbage),
         ["--tls-client-ca %s: not a PEM certificate" % garbage]),
        (coord("--tls-cert", crt, "--tls-key", key, "--tls-client-ca", missing),
         ["--tls-client-ca %s: cannot open" % missing]),
        (coord("--tls-cert", expired_crt, "--tls-key", expired_key),
         ["--tls-cert %s: certificate is expired" % expired_crt]),
        (worker("--tls-ca", missing), ["--tls-ca %s: cannot open" % missing]),
        (worker("--tls-ca", garbage), ["--tls-ca %s: not a PEM certificate" % garbage]),
        (worker("--tls-ca", pki["ca"], "--tls-cert", pki["worker_crt"]), ["--tls-key", "missing"]),
        (worker("--tls-ca", pki["ca"], "--tls-cert", pki["worker_crt"], "--tls-key", garbage),
         ["--tls-key %s: not a PEM private key" % garbage]),
        (worker("--tls-ca", pki["ca"], "--tls-cert", pki["worker_crt"], "--tls-key",
                pki["client_key"]), ["does not match the certificate in --tls-cert"]),
        (worker("--tls-cert", pki["worker_crt"], "--tls-key", pki["worker_key"],
                "--tls-client-ca", empty), ["--tls-client-ca %s: file is empty" % empty]),
        (worker("--data-root", missing), ["--data-root %s" % missing]),
        (status("--tls-ca", missing), ["batchwire status: --tls-ca %s: cannot open" % missing]),
        (status("--tls-ca", garbage), ["batchwire status: --tls-ca %s: not a PEM certificate" %
                                       garbage]),
        (status("--tls-ca", pki["ca"], "--tls-cert", pki["client_crt"]),
         ["batchwire status: ", "--tls-key", "missing"]),
        (status("--tls-ca", pki["ca"], "--tls-cert", pki["client_crt"], "--tls-key", garbage),
         ["batchwire status: --tls-key %s: not a PEM private key" % garbage]),
        ([CLI, "health", "--addr", "127.0.0.1:1", "--tls-ca", empty],
         ["batchwire health: --tls-ca %s: file is empty" % empty]),
    ]
    for argv, needles in cases:
        r = expect_exit(argv, 1, needles, timeout=15)
        if argv[0] != CLI:
            bt.check(re.search(r"ERROR +(coordinator|worker)\[\d+\]: cannot start err=", r.stderr),
                     "  ... logged as 'ERROR ... cannot start err=...'", r.stderr)


def check_names_and_ranks(tmp):
    bt.log("--- names, ranks and world sizes: say what is wrong and what is allowed ---")
    fetch = [CLI, "fetch", "--coordinator", "127.0.0.1:1", "--dataset", "npy:x.npy",
             "--retry-ms", "0"]
    expect_exit(fetch + ["--job", "j", "--rank", "0", "--world-size", "0"], 1,
                ["world size 0 is not a world size", "at least 1", "WORLD_SIZE"])
    expect_exit(fetch + ["--job", "j", "--rank", "-1", "--world-size", "2"], 1,
                ["rank not given", "neither RANK (torchrun) nor SLURM_PROCID (srun) is set",
                 "0 to world size - 1"])
    expect_exit(fetch + ["--job", "j", "--rank", "2", "--world-size", "2"], 1,
                ["rank 2 (from the options) is not below world size 2", "ranks are 0 to 1"])
    expect_exit(fetch + ["--job", "j", "--world-size", "2"], 1,
                ["rank 5 (from RANK) is not below world size 2"], env={"RANK": "5"})
    expect_exit(fetch + ["--job", "j", "--rank", "0"], 1,
                ["world size 0 (from WORLD_SIZE): a job has at least 1 rank"],
                env={"WORLD_SIZE": "0"})
    # One job-name limit everywhere (core/common/text.h): 255 bytes.
    expect_exit(fetch + ["--job", "j" * 256, "--rank", "0", "--world-size", "1"], 1,
                ["job name must be 1 to 255 bytes (got 256)"])
    expect_exit([CLI, "status", "--coordinator", "127.0.0.1:1", "--job", "a b"], 2,
                ["batchwire status: --job 'a b': character 2 is a space"])
    expect_exit([CLI, "status", "--coordinator", "127.0.0.1:1", "--job", "j" * 256], 2,
                ["--job must be 1 to 255 bytes (got 256)"])
    expect_exit([WORKER, "--coordinator", "127.0.0.1:1", "--data-root", tmp, "--id", "w 1"], 2,
                ["batchwire-worker: --id 'w 1': character 2 is a space"])
    expect_exit([CLI, "gen", "--format", "npy", "--out", os.path.join(tmp, "g"), "--dtype",
                 "float32", "--sample-bytes", "10"], 2,
                ["--sample-bytes 10 is not a multiple of the item size of --dtype float32 "
                 "(4 bytes)"])
    # A shape's dimensions are numbers of at least 1 (strtoull took "-1" as 2^64 - 1 and gen
    # tried to allocate a row of 2^64 - 12 bytes), and one sample fits --sample-bytes' limit.
    gen = [CLI, "gen", "--format", "npy", "--out", os.path.join(tmp, "g")]
    for shape in ("3,-1", "0", "+3", "3,,2"):
        expect_exit(gen + ["--fields", "x:float32:" + shape, "y:int64"], 2,
                    ["--fields 'x:float32:%s': shape '%s': expected D1,D2,... (decimal numbers "
                     "of at least 1" % (shape, shape)])
    expect_exit(gen + ["--dtype", "float32", "--shape", "3,-1"], 2,
                ["--shape '3,-1': expected D1,D2,..."])
    expect_exit(gen + ["--fields", "x:int64:65536,65536"], 2,
                ["shape '65536,65536': one sample would exceed 4294967296 bytes"])


def test(tmp):
    t = time.monotonic()
    check_help()
    check_names_and_ranks(tmp)
    check_bad_values(tmp)
    check_env_applied(tmp)
    check_state_dir_lock(tmp)
    check_tls_files(tmp)
    bt.log("all checks in %.1fs" % (time.monotonic() - t))


if __name__ == "__main__":
    bt.main(test, timeout=90)
