"""Worker identity under a hostile worker credential (docs/security.md, "Worker ids"): a worker
principal registers and heartbeats only the ids its principals-file line binds (ids=PATTERN,
else its own name; an admin any id), also with a client certificate instead of a token, and a
binding narrowed on SIGHUP stops the worker's heartbeats until it is bound again;
refusals are PERMISSION_DENIED naming the id, the principal and how to bind it, add nothing
to ListWorkers, and are logged at most once a second. Registrations are capped per principal
(--max-workers-per-principal) and in total (--max-workers): RESOURCE_EXHAUSTED naming the
flag, the table does not grow, and dead ids stop counting once forgotten (--dead-worker-ttl).
Principals and token files that others can write are warned about. Meanwhile a legitimate
job on the same cluster reads every batch exactly as `batchwire plan` says.

Requests are made with python3-grpcio and messages compiled from proto/ by Debian's protoc
(test_auth's raw client), independent of the C code under test.
"""

import os
import re
import signal
import time

import grpc

import bwpy
import bwtest as bt
from test_auth import Client, bpb

S = grpc.StatusCode
REGISTER = "/batchwire.v1.Coordinator/RegisterWorker"
HEARTBEAT = "/batchwire.v1.Coordinator/Heartbeat"
LIST = "/batchwire.v1.Coordinator/ListWorkers"
PER_PRINCIPAL, TOTAL = 5, 24
TTL_S = 4  # --dead-worker-ttl: the fake ids (no heartbeats) leave 3 s + TTL_S after registering
PRINCIPALS = [  # role, name, token, binding
    ("admin", "ops", "ops-token-0123456789abcdef", ""),
    ("trainer", "alice", "alice-token-0123456789abcdef", ""),
    ("worker", "storage", "storage-token-0123456789abcdef", "ids=store-*,spare"),
    ("worker", "solo", "solo-token-0123456789abcdef", ""),
    ("worker", "flood", "flood-token-0123456789abcdef", "ids=flood-*"),
    ("worker", "worker.localhost", "-", ""),  # the test PKI's worker certificate (CN)
]
TOKEN = {name: tok for _r, name, tok, _b in PRINCIPALS}


def listening(d):
    """The daemon's address once it listens (a file-mode warning may come first)."""
    d.addr = d.wait_log(r"listening on (\S+)", timeout=15)[0].group(1)
    return d


def write_principals(path, mode=0o600, rebind=None):
    """The principals file; rebind: {name: binding} instead of PRINCIPALS' own."""
    bt.write_principals(path, [(role, name, tok, (rebind or {}).get(name, binding))
                               for role, name, tok, binding in PRINCIPALS], mode)


def token_file(tmp, name, mode=0o600):
    return bt.secret_file(tmp, "token-" + name, TOKEN[name], mode)


def register(client, wid, incarnation=1):
    """(status code, details) of registering `wid` at a port nothing listens on."""
    return client.code(REGISTER, bpb.RegisterWorkerRequest(
        id=wid, address="127.0.0.1:1", incarnation=incarnation))


def listed(coord):
    c = Client(coord.addr, TOKEN["ops"])
    ids = sorted(w.id for w in c.call(LIST, bpb.ListWorkersRequest()).workers)
    c.close()
    return ids


def bindings(coord):
    bt.log("===== a worker token registers only the ids bound to it =====")
    before = listed(coord)
    storage = Client(coord.addr, TOKEN["storage"])
    code, details = register(storage, "evil")
    bt.check(code == S.PERMISSION_DENIED and "worker id 'evil'" in details and
             "'storage'" in details and "ids=store-*,spare" in details and
             "--auth-tokens" in details,
             "storage (ids=store-*,spare) registering 'evil' -> PERMISSION_DENIED naming the id, "
             "the principal and its binding", "%s: %s" % (code.name, details))
    bt.check(listed(coord) == before, "nothing was added to ListWorkers", listed(coord))
    for wid in ("store-", "store-x.y", "spare"):
        code, details = register(storage, wid)
        bt.check(code == S.OK, "storage registers '%s' (its ids= match it)" % wid, details)
    for wid in ("store", "Store-1", "xstore-1", "spare2", "sparE", "st0re-1"):
        code, details = register(storage, wid)
        bt.check(code == S.PERMISSION_DENIED and "worker id '%s'" % wid in details,
                 "storage registering '%s' -> PERMISSION_DENIED (no pattern matches)" % wid,
                 "%s: %s" % (code.name, details))
    code, details = storage.code(HEARTBEAT, bpb.HeartbeatRequest(id="evil", incarnation=1))
    bt.check(code == S.OK, "a heartbeat for an unknown id changes nothing", details)
    storage.close()
    bt.check("evil" not in listed(coord), "'evil' is still not listed")

    solo = Client(coord.addr, TOKEN["solo"])
    code, details = register(solo, "solo-2")
    bt.check(code == S.PERMISSION_DENIED and "add ids=PATTERN to principal 'solo'" in details,
             "solo (no ids=) registering 'solo-2' -> PERMISSION_DENIED saying how to bind it",
             "%s: %s" % (code.name, details))
    code, details = register(solo, "solo")
    bt.check(code == S.OK, "solo registers 'solo', its own name", details)
    code, details = solo.code(HEARTBEAT, bpb.HeartbeatRequest(id="store-1", incarnation=1))
    bt.check(code == S.PERMISSION_DENIED,
             "solo heartbeating the live store-1 -> PERMISSION_DENIED", details)
    code, details = register(solo, "store-1", incarnation=77)
    bt.check(code == S.PERMISSION_DENIED, "solo registering the live store-1 -> PERMISSION_DENIED",
             details)
    solo.close()

    alice = Client(coord.addr, TOKEN["alice"])
    code, details = register(alice, "alice")
    bt.check(code == S.PERMISSION_DENIED, "a trainer registering a worker -> PERMISSION_DENIED",
             details)
    alice.close()
    ops = Client(coord.addr, TOKEN["ops"])
    code, details = register(ops, "any-id-at-all")
    bt.check(code == S.OK, "an admin registers any id", details)
    ops.close()
    c = Client(coord.addr, TOKEN["ops"])
    w = [x for x in c.call(LIST, bpb.ListWorkersRequest()).workers if x.id == "store-1"]
    c.close()
    bt.check(len(w) == 1 and w[0].address != "127.0.0.1:1" and
             w[0].state == bpb.WORKER_STATE_ALIVE,
             "the real store-1 keeps its address and stays alive", w)
    text = open(coord.log_path).read()
    bt.check(re.search(r"worker=evil address=\S+ peer=\S+ principal=storage registration refused "
                       r"code=BW_PERMISSION_DENIED not_logged_before=\d+ err=", text),
             "the coordinator logs the refusal with the id, the peer and the principal")


def caps(coord):
    bt.log("===== registration caps: %d per principal, %d in all =====" % (PER_PRINCIPAL, TOTAL))
    flood = Client(coord.addr, TOKEN["flood"])
    codes = {}
    details = {}
    t0 = time.monotonic()
    for i in range(300):
        code, d = register(flood, "flood-%d" % i)
        codes[code] = codes.get(code, 0) + 1
        details.setdefault(code, d)
    t = time.monotonic() - t0
    ex = details.get(S.RESOURCE_EXHAUSTED, "")
    bt.check(codes.get(S.OK) == PER_PRINCIPAL and
             codes.get(S.RESOURCE_EXHAUSTED) == 300 - PER_PRINCIPAL and
             "--max-workers-per-principal %d" % PER_PRINCIPAL in ex and "'flood'" in ex,
             "300 registrations by one worker principal in %.1f s: %d accepted, the rest "
             "RESOURCE_EXHAUSTED naming --max-workers-per-principal" % (t, PER_PRINCIPAL),
             "%s %s" % (codes, ex))
    ids = listed(coord)
    bt.check(sum(i.startswith("flood-") for i in ids) == PER_PRINCIPAL,
             "ListWorkers holds %d flood ids, not 300" % PER_PRINCIPAL, ids)
    time.sleep(1.1)  # one more refusal a second later is logged with the count left out
    code, d = register(flood, "flood-300")
    flood.close()
    coord.wait_log(r"principal=flood registration refused code=BW_TOO_BIG "
                   r"not_logged_before=[1-9]\d* err=worker id 'flood-300'")
    lines = len(re.findall(r"principal=flood registration refused",
                           open(coord.log_path).read()))
    bt.check(code == S.RESOURCE_EXHAUSTED and lines <= int(t) + 3,
             "the %d refusals are logged at most once a second (%d lines, with how many were "
             "left out)" % (300 - PER_PRINCIPAL + 1, lines))

    ops = Client(coord.addr, TOKEN["ops"])
    n = len(listed(coord))
    accepted = 0
    for i in range(TOTAL + 10):
        code, d = register(ops, "admin-%d" % i)
        accepted += code == S.OK
        if code != S.OK:
            break
    bt.check(code == S.RESOURCE_EXHAUSTED and "--max-workers %d" % TOTAL in d and
             len(listed(coord)) == TOTAL,
             "an admin has no per-principal quota but the table stops at --max-workers (%d): "
             "RESOURCE_EXHAUSTED naming it (%d accepted after %d)" % (TOTAL, accepted, n),
             "%s: %s" % (code.name, d))
    storage = Client(coord.addr, TOKEN["storage"])
    code, d = register(storage, "store-new")
    storage.close()
    bt.check(code == S.RESOURCE_EXHAUSTED and "--max-workers" in d,
             "a bound id is refused too while the table is full", d)
    bt.check(len(listed(coord)) == TOTAL, "the table holds %d ids" % TOTAL)
    ops.close()


def forgotten(coord):
    bt.log("===== dead ids stop counting once forgotten (--dead-worker-ttl %d) =====" % TTL_S)
    # The fake ids never heartbeat: dead after 3 x 1000 ms, forgotten TTL_S s later.
    bt.poll(lambda: not any(i.startswith(("flood-", "admin-")) for i in listed(coord)), 30,
            interval=0.2, what="the dead fake ids forgotten")
    ids = listed(coord)
    bt.check("store-1" in ids, "the live store-1 is still listed", ids)
    flood = Client(coord.addr, TOKEN["flood"])
    code, d = register(flood, "flood-again")
    bt.check(code == S.OK, "flood may register again once its dead ids are forgotten", d)
    flood.close()
    bt.check(re.search(r"worker=flood-\d+ address=127.0.0.1:1 forgotten: dead for more than "
                       r"--dead-worker-ttl", open(coord.log_path).read()),
             "the coordinator logs each forgotten id")


def certificate(tmp):
    bt.log("===== the same binding for a client certificate's CN =====")
    pki = bt.make_pki(tmp)
    path = os.path.join(tmp, "tls-principals")
    write_principals(path)
    coord = bt.coordinator(tmp, name="tls-coordinator", args=[
        "--auth-tokens", path, "--tls-cert", pki["server_crt"], "--tls-key", pki["server_key"],
        "--tls-client-ca", pki["ca"]])
    root = open(pki["ca"], "rb").read()
    creds = grpc.ssl_channel_credentials(root, open(pki["worker_key"], "rb").read(),
                                         open(pki["worker_crt"], "rb").read())
    c = Client(coord.addr, None, creds)
    code, details = register(c, "worker.localhost")
    bt.check(code == S.OK, "CN worker.localhost registers the id worker.localhost", details)
    code, details = register(c, "rogue")
    bt.check(code == S.PERMISSION_DENIED and "'worker.localhost'" in details and
             "worker id 'rogue'" in details,
             "and is refused 'rogue' (PERMISSION_DENIED naming id and principal)", details)
    c.close()
    # The admin's token over a certificate that names no principal (batchwire-cli).
    admin = Client(coord.addr, TOKEN["ops"], grpc.ssl_channel_credentials(
        root, open(pki["client_key"], "rb").read(), open(pki["client_crt"], "rb").read()))
    ids = sorted(w.id for w in admin.call(LIST, bpb.ListWorkersRequest()).workers)
    admin.close()
    bt.check(ids == ["worker.localhost"], "only worker.localhost is listed", ids)
    bt.check(coord.stop() == 0, "the TLS coordinator stops cleanly")


def file_modes(tmp, coord):
    bt.log("===== credentials files that others can write =====")
    text = open(coord.log_path).read()
    bt.check(re.search(r"the --auth-tokens file can be written by its group.*mode=620", text),
             "a group-writable principals file is warned about at start")
    bt.check(re.search(r"the --grant-key file can be written by its group.*mode=660", text),
             "and a group-writable grant key")
    path = coord.auth_path
    os.chmod(path, 0o602)
    coord.send(signal.SIGHUP)
    coord.wait_log(r"the --auth-tokens file can be written by every user.*mode=602")
    bt.ok("an other-writable one on SIGHUP too")
    os.chmod(path, 0o600)
    fetch = ("fetch", "--coordinator", coord.addr, "--dataset", bwpy.NPY, "--rank", 0,
             "--world-size", 1, "--batch-size", 50, "--quiet")
    r = bt.cli(*fetch, "--job", "f1", "--token-file", token_file(tmp, "alice", 0o666))
    bt.check(r.returncode == 0 and "--token-file file can be written by every user" in r.stderr,
             "the client library (batchwire fetch) warns about a token file every user can write",
             r.stderr)
    r = bt.cli(*fetch, "--job", "f2", "--token-file", token_file(tmp, "alice"))
    bt.check(r.returncode == 0 and "can be written" not in r.stderr,
             "and not about one only its owner can write", r.stderr)


def narrowed(coord):
    bt.log("===== a binding narrowed on SIGHUP stops the worker's heartbeats =====")

    def state():
        c = Client(coord.addr, TOKEN["ops"])
        w = [x for x in c.call(LIST, bpb.ListWorkersRequest()).workers if x.id == "store-1"]
        c.close()
        return w[0].state if w else None

    write_principals(coord.auth_path, rebind={"storage": "ids=other-*"})
    coord.send(signal.SIGHUP)
    coord.wait_log(r"worker=store-1 address=\S+ peer=- principal=storage heartbeat refused "
                   r"code=BW_PERMISSION_DENIED .*ids=other-\* do not match it", timeout=10)
    bt.poll(lambda: state() == bpb.WORKER_STATE_DEAD, 15, interval=0.2,
            what="store-1 marked dead")
    bt.ok("store-1's heartbeats are refused (logged) and it is marked dead")
    write_principals(coord.auth_path)
    coord.send(signal.SIGHUP)
    bt.poll(lambda: state() == bpb.WORKER_STATE_ALIVE, 15, interval=0.2,
            what="store-1 alive again")
    bt.ok("bound again, its next heartbeat makes it alive")


def legitimate_job(tmp, coord, arr, batch):
    bt.log("===== a legitimate job on the same cluster =====")
    batchwire = bwpy.import_batchwire()
    want = bwpy.plan("--mode", "torch", "--num-samples", len(arr), "--world-size", 1,
                     "--batch-size", batch, "--epoch", 0)[0]
    got = []
    with batchwire.Loader(coordinator=coord.addr, job="legit", dataset=bwpy.NPY,
                          batch_size=batch, rank=0, world_size=1, job_epochs=1,
                          token_file=token_file(tmp, "alice")) as loader:
        for b in loader:
            got.append((b.indices.tolist(), b.numpy().copy()))
    bt.check(len(got) == len(want) and all(
        g == w["indices"] and x.tobytes() == arr[g].tobytes()
        for (g, x), w in zip(got, want)),
        "alice's job read all %d batches exactly as batchwire plan says, samples equal to the "
        "file's" % len(want), "%d batches, %d planned" % (len(got), len(want)))


def test(tmp):
    os.chmod(bt.grant_key(tmp), 0o660)  # the daemons' --grant-key (bwtest adds it)
    principals = os.path.join(tmp, "principals")
    write_principals(principals, 0o620)
    root = os.path.join(tmp, "data")
    os.makedirs(root)
    arr = bwpy.gen_npy(root, "ds", 200, (3, 5))
    coord = listening(bt.coordinator(tmp, wait=False, args=[
        "--auth-tokens", principals,
        "--heartbeat-ms", "1000", "--dead-after", "3", "--dead-worker-ttl", str(TTL_S),
        "--max-workers-per-principal", str(PER_PRINCIPAL), "--max-workers", str(TOTAL)]))
    coord.auth_path = principals
    worker = listening(bt.worker(tmp, coord.addr, "store-1", data_root=root, wait=False, args=[
        "--auth-tokens", principals, "--token-file", token_file(tmp, "storage", 0o660)]))
    worker.wait_log(r"registered with coordinator")
    bt.check(re.search(r"the --token-file file can be written by its group.*mode=660",
                       worker.log_text()), "the worker warns about its group-writable token file")

    bindings(coord)
    caps(coord)
    forgotten(coord)
    file_modes(tmp, coord)
    narrowed(coord)
    legitimate_job(tmp, coord, arr, 8)
    os.chmod(bt.grant_key(tmp), 0o600)
    bt.check(worker.running() and coord.running(), "both daemons are still up")
    bt.check(worker.stop() == 0 and coord.stop() == 0, "and stop cleanly")
    certificate(tmp)


if __name__ == "__main__":
    bwpy.maybe_reexec_under_asan()
    bt.main(test, timeout=240)
