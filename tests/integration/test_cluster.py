"""Cluster membership end to end, three times: plaintext, TLS, mutual TLS.

A coordinator (heartbeat 200 ms, dead after 3 missed) and two workers on random loopback
ports; `batchwire status` sees both alive; SIGKILL one, it is marked dead within the
configured time; restart it with the same id, it is alive again with restarts+1; SIGTERM
everything: exit 0 and a "stopped" line. TLS adds negative checks (no CA, wrong CA, wrong
server name); mutual TLS adds workers and CLI calls without / with a wrongly signed client
certificate, which must be refused.
"""

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bwtest as bt  # noqa: E402

HEARTBEAT_MS = 200
DEAD_AFTER = 3
DEAD_MS = HEARTBEAT_MS * DEAD_AFTER
# Slack on top of heartbeat*dead_after for a loaded machine (process scheduling, CLI start).
MARGIN_S = 2.0


def modes(pki):
    """(coordinator args, worker args, CLI args) per mode."""
    server = ["--tls-cert", pki["server_crt"], "--tls-key", pki["server_key"]]
    worker_tls = ["--tls-ca", pki["ca"], "--tls-cert", pki["worker_crt"],
                  "--tls-key", pki["worker_key"]]
    return {
        "plaintext": ([], [], []),
        "tls": (server, worker_tls, ["--tls-ca", pki["ca"]]),
        "mtls": (server + ["--tls-client-ca", pki["ca"]],
                 worker_tls + ["--tls-client-ca", pki["ca"]],
                 ["--tls-ca", pki["ca"], "--tls-cert", pki["client_crt"],
                  "--tls-key", pki["client_key"]]),
    }


def expect_cli_fails(args, msg, addr, must_contain=None):
    t = time.monotonic()
    r = bt.cli(*args)
    el = time.monotonic() - t
    bt.check(r.returncode == 1, "%s: exit 1 (got %d in %.2fs)" % (msg, r.returncode, el),
             "stdout:\n%s\nstderr:\n%s" % (r.stdout, r.stderr))
    bt.check(r.stdout.strip() == "", "%s: nothing on stdout" % msg, r.stdout)
    # gRPC core may print its own "E... Handshake failed" lines first; ours is the
    # "batchwire COMMAND: ..." line.
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("batchwire %s: " % args[0])]
    bt.check(len(ours) == 1 and addr in ours[0],
             "%s: one message naming the address: %s" % (msg, ours[0][:200] if ours else None),
             r.stderr)
    if must_contain:
        bt.check_in(must_contain, r.stderr, "%s: message" % msg)
    return r


def scenario(tmp, mode, pki):
    bt.log("===== scenario: %s =====" % mode)
    cargs, wargs, cli_tls = modes(pki)[mode]
    coord = bt.coordinator(tmp, name="coordinator-" + mode,
                           args=["--heartbeat-ms", HEARTBEAT_MS, "--dead-after", DEAD_AFTER,
                                 "--shutdown-grace-ms", 2000] + cargs)
    caddr = coord.addr
    bt.check(caddr.startswith("127.0.0.1:") and not caddr.endswith(":0"),
             "coordinator listens on a random loopback port %s" % caddr, coord.first_line)
    want = {"plaintext": "(plaintext)", "tls": "(TLS)",
            "mtls": "(TLS, client certificates required)"}[mode]
    bt.check_in(want, coord.first_line, "coordinator's first log line states the transport")
    bt.check_in("heartbeat=%dms dead-after=%d" % (HEARTBEAT_MS, DEAD_AFTER), coord.first_line,
                "coordinator's first log line states the liveness settings")

    alpha = bt.worker(tmp, caddr, "alpha", args=wargs)
    beta = bt.worker(tmp, caddr, "beta", args=wargs)
    stoppable = [alpha]
    want_w = {"plaintext": "(plaintext)", "tls": "(TLS)",
              "mtls": "(TLS, client certificates required)"}[mode]
    for w in (alpha, beta):
        bt.check_in(want_w, w.first_line, "%s's first log line states its transport" % w.name)

    # ---- both alive ----
    def both_alive():
        st = bt.status_json(caddr, cli_tls)
        ws = bt.workers_by_id(st)
        if set(ws) == {"alpha", "beta"} and all(w["state"] == "alive" for w in ws.values()):
            return st
        return None
    st = bt.poll(both_alive, 10, what="two live workers in status --json")
    ws = bt.workers_by_id(st)
    bt.ok("status --json lists alpha and beta, both alive")
    bt.check(ws["alpha"]["address"] == alpha.addr and ws["beta"]["address"] == beta.addr,
             "worker addresses are the workers' bound addresses (%s, %s)" %
             (alpha.addr, beta.addr), st)
    bt.check(all(w["restarts"] == 0 for w in ws.values()), "restarts are 0", st)
    bt.check(all(re.fullmatch(r"[0-9a-f]{16}", w["incarnation"]) for w in ws.values()) and
             ws["alpha"]["incarnation"] != ws["beta"]["incarnation"],
             "incarnations are distinct 16-hex-digit ids", st)
    bt.check(st["heartbeat_interval_ms"] == HEARTBEAT_MS and
             st["missed_heartbeats_dead"] == DEAD_AFTER,
             "status reports heartbeat_interval_ms=%d missed_heartbeats_dead=%d" %
             (HEARTBEAT_MS, DEAD_AFTER), st)
    bt.check(st["coordinator"]["pid"] == coord.pid and st["coordinator"]["address"] == caddr,
             "status reports the coordinator's pid %d and address" % coord.pid, st)
    bt.check(all(w["version"] == st["coordinator"]["version"] for w in ws.values()),
             "workers report the same version as the coordinator (%s)" %
             st["coordinator"]["version"], st)
    bt.check(all(0 <= w["seconds_since_heartbeat"] <= DEAD_MS / 1000.0 for w in ws.values()),
             "live workers heartbeated within %d ms" % DEAD_MS, st)
    for wid in ("alpha", "beta"):
        coord.wait_log(r"worker=%s address=\S+ peer=\S+ registered\n" % wid)
    bt.ok("coordinator logged 'worker=alpha ... registered' and 'worker=beta ... registered'")
    alpha.wait_log(r"worker=alpha registered with coordinator %s" % re.escape(caddr))
    bt.ok("alpha logged its registration")

    # ---- the table ----
    r = bt.cli("status", "--coordinator", caddr, *cli_tls)
    bt.check(r.returncode == 0, "status (table) exits 0", r.stderr)
    bt.check_in("workers: 2 alive, 0 dead", r.stdout, "table summary")
    rows = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines()
            if ln.split() and ln.split()[0] in ("alpha", "beta")}
    daddr = {w["id"]: w["data_address"] for w in bt.status_json(caddr, cli_tls)["workers"]}
    bt.check(bool(daddr["alpha"]) and bool(daddr["beta"]),
             "%s workers offer a data channel (data_address %r)" % (mode, daddr["alpha"]))
    bt.check(set(rows) == {"alpha", "beta"} and rows["alpha"][1] == alpha.addr and
             rows["alpha"][2] == (daddr["alpha"] or "-") and
             rows["alpha"][3] == "alive" and rows["beta"][3] == "alive",
             "table has rows 'alpha <addr> <data channel> alive' and 'beta <addr> <data channel> "
             "alive'", r.stdout)

    # ---- health of every daemon over the same transport ----
    for d in (coord, alpha, beta):
        r = bt.cli("health", "--addr", d.addr, "--timeout-ms", 5000, *cli_tls)
        bt.check(r.returncode == 0 and r.stdout.strip() == "SERVING",
                 "health --addr %s (%s) prints SERVING" % (d.addr, d.name), r.stdout + r.stderr)

    # ---- transport-specific refusals ----
    if mode == "plaintext":
        expect_cli_fails(["status", "--coordinator", caddr, "--tls-ca", pki["ca"],
                          "--timeout-ms", 5000],
                         "status with --tls-ca against a plaintext coordinator", caddr)
    if mode == "tls":
        expect_cli_fails(["status", "--coordinator", caddr, "--timeout-ms", 5000],
                         "status without --tls-ca against a TLS coordinator", caddr)
        expect_cli_fails(["status", "--coordinator", caddr, "--tls-ca", pki["rogue_ca"],
                          "--timeout-ms", 5000],
                         "status with an unrelated CA", caddr)
        expect_cli_fails(["status", "--coordinator", caddr, "--tls-ca", pki["ca"],
                          "--tls-server-name", "wrong.example", "--timeout-ms", 5000],
                         "status with --tls-server-name wrong.example", caddr,
                         must_contain="wrong.example")
        r = bt.cli("status", "--coordinator", caddr, "--tls-ca", pki["ca"],
                   "--tls-server-name", "localhost")
        bt.check(r.returncode == 0, "status with --tls-server-name localhost (the SAN) exits 0",
                 r.stderr)
        expect_cli_fails(["health", "--addr", alpha.addr, "--timeout-ms", 5000],
                         "plaintext health against a TLS worker", alpha.addr)
    refused = []
    if mode == "mtls":
        nocert = bt.worker(tmp, caddr, "nocert", args=["--tls-ca", pki["ca"]])
        rogue = bt.worker(tmp, caddr, "rogue", args=["--tls-ca", pki["ca"], "--tls-cert",
                                                     pki["rogue_crt"], "--tls-key",
                                                     pki["rogue_key"]])
        refused = [nocert, rogue]
        stoppable += refused
        for w in refused:
            m = w.wait_log(r"worker=%s registration failed \(will retry\) err=([^\n]*)" %
                           w.name[len("worker-"):])
            bt.ok("%s logged the failed registration: %s" % (w.name, m[0].group(1)[:120]))
            bt.check(w.running(), "%s keeps running and retrying" % w.name, w.log_text())
        base = ["--tls-ca", pki["ca"], "--timeout-ms", 5000]
        expect_cli_fails(["status", "--coordinator", caddr] + base,
                         "status without a client certificate", caddr)
        expect_cli_fails(["status", "--coordinator", caddr, "--tls-cert", pki["rogue_crt"],
                          "--tls-key", pki["rogue_key"]] + base,
                         "status with a client certificate from an unrelated CA", caddr)
        expect_cli_fails(["health", "--addr", alpha.addr] + base,
                         "health of an mTLS worker without a client certificate", alpha.addr)

    # ---- SIGKILL beta: marked dead in time, alpha stays alive ----
    old_inc = bt.workers_by_id(bt.status_json(caddr, cli_tls))["beta"]["incarnation"]
    t0 = time.monotonic()
    beta.kill9()
    polls = [0]

    def beta_dead():
        polls[0] += 1
        ws = bt.workers_by_id(bt.status_json(caddr, cli_tls))
        if ws["alpha"]["state"] != "alive":
            raise bt.TestFailure("alpha went %s while only beta was killed: %r" %
                                 (ws["alpha"]["state"], ws))
        return ws if ws["beta"]["state"] == "dead" else None
    ws = bt.poll(beta_dead, DEAD_MS / 1000.0 + MARGIN_S + 5, what="beta dead")
    elapsed = time.monotonic() - t0
    bt.check(elapsed <= DEAD_MS / 1000.0 + MARGIN_S,
             "beta marked dead %.2fs after SIGKILL (bound %d ms x %d + %.1fs margin = %.1fs; "
             "%d polls; alpha alive throughout)" %
             (elapsed, HEARTBEAT_MS, DEAD_AFTER, MARGIN_S, DEAD_MS / 1000.0 + MARGIN_S, polls[0]))
    bt.check(ws["beta"]["seconds_since_heartbeat"] * 1000 >= DEAD_MS,
             "dead beta's seconds_since_heartbeat %.3f >= %d ms" %
             (ws["beta"]["seconds_since_heartbeat"], DEAD_MS), ws)
    m = coord.wait_log(r"worker=beta address=\S+ marked dead: no heartbeat for (\d+) ms")
    ms = int(m[0].group(1))
    bt.check(DEAD_MS < ms <= DEAD_MS + MARGIN_S * 1000,
             "coordinator logged 'worker=beta ... marked dead: no heartbeat for %d ms'" % ms)
    r = bt.cli("status", "--coordinator", caddr, *cli_tls)
    bt.check(r.returncode == 0 and "workers: 1 alive, 1 dead" in r.stdout and
             re.search(r"^beta\s+\S+\s+\S+\s+dead\s", r.stdout, re.M) and
             re.search(r"^alpha\s+\S+\s+\S+\s+alive\s", r.stdout, re.M),
             "table shows '1 alive, 1 dead', beta dead and alpha alive", r.stdout + r.stderr)

    # ---- restart beta with the same id ----
    beta2 = bt.worker(tmp, caddr, "beta", args=wargs)
    stoppable.append(beta2)

    def beta_back():
        ws = bt.workers_by_id(bt.status_json(caddr, cli_tls))
        return ws if ws["beta"]["state"] == "alive" else None
    ws = bt.poll(beta_back, 10, what="restarted beta alive")
    b = ws["beta"]
    bt.check(b["restarts"] == 1 and b["incarnation"] != old_inc and b["address"] == beta2.addr,
             "restarted beta is alive with restarts=1, a new incarnation and its new address %s"
             % beta2.addr, b)
    bt.check(ws["alpha"]["restarts"] == 0 and ws["alpha"]["state"] == "alive",
             "alpha still alive with restarts=0", ws)
    coord.wait_log(r"worker=beta address=%s peer=\S+ registered again \(new process; alive again\)"
                   % re.escape(beta2.addr))
    bt.ok("coordinator logged 'worker=beta ... registered again (new process; alive again)'")

    if mode == "plaintext":
        # A second process asking for a live id is refused (exit 1) and alpha keeps it
        # (docs/operating.md, "Worker ids").
        dup = bt.worker(tmp, caddr, "alpha", args=wargs)
        rc = dup.wait(30)
        bt.check(rc == 1 and re.search(r"worker=alpha cannot start err=.*worker id 'alpha' is "
                                       r"held by a live worker at %s" % re.escape(alpha.addr),
                                       dup.log_text()),
                 "a second alpha without --takeover is refused (exit %s)" % rc, dup.log_text())
        ws = bt.workers_by_id(bt.status_json(caddr, cli_tls))
        bt.check(alpha.running() and ws["alpha"]["address"] == alpha.addr and
                 ws["alpha"]["state"] == "alive" and ws["alpha"]["restarts"] == 0,
                 "the first alpha keeps its id", ws)
        # With --takeover the old one must exit 1 and say why.
        alpha2 = bt.worker(tmp, caddr, "alpha", args=wargs + ["--takeover"])
        stoppable.append(alpha2)
        rc = alpha.wait(10)
        bt.check(rc == 1, "the first alpha exits 1 after a second process took over its id "
                 "(got %s)" % rc, alpha.log_text())
        alpha.wait_log(r"ERROR +worker\[%d\]: worker=alpha stopping err=.*worker id 'alpha' is now "
                       r"held by another process at %s" % (alpha.pid, re.escape(alpha2.addr)))
        bt.ok("the first alpha logged why it stopped")
        stoppable.remove(alpha)
        ws = bt.workers_by_id(bt.status_json(caddr, cli_tls))
        bt.check(ws["alpha"]["address"] == alpha2.addr and ws["alpha"]["state"] == "alive" and
                 ws["alpha"]["restarts"] == 1,
                 "status shows the new alpha (restarts=1, its address)", ws)

    # ---- refused workers never appeared ----
    if refused:
        # By now they have been retrying for at least the kill/restart steps above.
        for w in refused:
            bt.check(w.running() and "registered with coordinator" not in w.log_text(),
                     "%s is still running and never registered" % w.name, w.log_text())
        ws = bt.workers_by_id(bt.status_json(caddr, cli_tls))
        bt.check("nocert" not in ws and "rogue" not in ws and set(ws) == {"alpha", "beta"},
                 "workers without / with a wrongly signed client certificate never appear in "
                 "status (ids: %s)" % sorted(ws), ws)
        bt.check(not re.search(r"worker=(nocert|rogue)", coord.log_text()),
                 "coordinator never logged nocert or rogue")

    # ---- SIGTERM everything ----
    for d in stoppable + [coord]:
        t = time.monotonic()
        rc = d.stop(timeout=15)
        bt.check(rc == 0, "%s exits 0 on SIGTERM (%.2fs)" % (d.name, time.monotonic() - t),
                 d.log_text())
        text = d.log_text()
        ours = [ln for ln in text.splitlines()
                if re.match(r"\S+ (ERROR|WARN|INFO|DEBUG) +\w+\[%d\]: " % d.pid, ln)]
        bt.check(any(ln.endswith("]: received SIGTERM; shutting down") for ln in ours) and
                 ours and ours[-1].endswith("]: stopped"),
                 "%s logged 'received SIGTERM; shutting down' and, last, 'stopped'" % d.name,
                 text)


def test(tmp):
    pki = bt.make_pki(tmp)
    times = {}
    for mode in ("plaintext", "tls", "mtls"):
        t = time.monotonic()
        scenario(tmp, mode, pki)
        times[mode] = time.monotonic() - t
    bt.log("scenario times: " + ", ".join("%s %.1fs" % kv for kv in times.items()))


if __name__ == "__main__":
    bt.main(test, timeout=90)
