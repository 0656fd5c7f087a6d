"""Offline checks of the Kubernetes deployment in k8s/ and of its image (no cluster runs here).

k8s/base and k8s/overlays/tls are rendered as a user would, `kubectl kustomize` of a copy
with tokens from k8s/gen-tokens.sh and certificates from k8s/overlays/tls/gen-certs.sh, and
every rendered object is checked:

* against the Kubernetes OpenAPI schemas (npm kubernetes-models, tests/k8s/validate.mjs),
  with a strict pass that refuses fields the API does not define;
* structure: selectors match pod labels, Services and probes point at declared ports, every
  mount has a volume, every Secret and claim exists (or is the documented external data
  claim), every flag and BATCHWIRE_* variable given to a batchwire program is one its
  --help lists, $(VAR) references are defined;
* policy: no pod runs as root or may escalate, every root filesystem is read-only, every
  capability is dropped, seccomp RuntimeDefault, no service-account token, requests and
  limits for CPU and memory everywhere, pinned image tags; each daemon has gRPC readiness and
  liveness probes on its --listen port, a metrics port that its Prometheus annotations name,
  a PodDisruptionBudget and a NetworkPolicy that admits its clients on exactly its ports; the
  coordinator is one replica with its --state-dir on a volumeClaimTemplate; workers mount
  --data-root read-only; the trainer is an Indexed Job whose rank is the completion index,
  WORLD_SIZE = completions = parallelism, MASTER_ADDR the index-0 pod's DNS name;
* credentials: the rendered Secrets hold a principals file with admin, worker and trainer
  lines whose tokens are the token files given to each daemon and to the trainer; with TLS,
  a certificate the CA signed that names what clients dial, and trainer pods get the CA but
  no key. A real coordinator and worker started with the rendered arguments, files and
  environment accept them (status with the admin token, the worker registered), refuse a
  call without a token, and answer the readiness probes' commands (with TLS, batchwire
  health over TLS; a plaintext check such as kubelet's gRPC probe fails);
* k8s/Dockerfile, statically: multi-stage, every base pinned to an exact tag or a digest,
  the images end as a non-root USER, runtime stages install no compiler or -dev package, and
  .dockerignore keeps build trees and tokens out of the context.
"""
import base64
import json
import os
import re
import shutil
import subprocess

import yaml

import bwtest as bt

SRC = bt.SOURCE_DIR
K8S = os.path.join(SRC, "k8s")
NODE_DIR = os.path.join(SRC, "tests", "k8s")
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")
EXTERNAL_CLAIMS = {"batchwire-data"}  # the dataset volume the operator provides (deploy.md)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def typed(obj, path, kind):
    cur = obj
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur if isinstance(cur, kind) else None


_help = {}


def help_of(program):
    if program not in _help:
        out = subprocess.run([os.path.join(bt.BIN_DIR, program), "--help"], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        flags = set(re.findall(r"^  (--[a-z0-9-]+)", out.stdout, re.M))
        envs = set(re.findall(r"\[env (BATCHWIRE_[A-Z0-9_]+)\]", out.stdout))
        _help[program] = (flags, envs)
    return _help[program]


def flag(args, name):
    for i, a in enumerate(args[:-1]):
        if a == name:
            return args[i + 1]
    return None


def quantity(q):
    """A Kubernetes quantity as a float (cpu in cores, memory in bytes)."""
    m = re.fullmatch(r"([0-9.]+)(m|k|Ki|M|Mi|G|Gi|T|Ti)?", str(q))
    if not m:
        return None
    scale = {None: 1, "m": 1e-3, "k": 1e3, "Ki": 2**10, "M": 1e6, "Mi": 2**20, "G": 1e9,
             "Gi": 2**30, "T": 1e12, "Ti": 2**40}[m.group(2)]
    return float(m.group(1)) * scale


# ---------------------------------------------------------------------------- rendering

def prepare(tmpdir):
    """A copy of k8s/ with tokens (k8s/gen-tokens.sh) and certificates for the namespace
    "test" (k8s/overlays/tls/gen-certs.sh), as a user makes them."""
    copy = os.path.join(tmpdir, "k8s")
    shutil.copytree(K8S, copy, ignore=shutil.ignore_patterns("auth", "certs"))
    r = bt.run(["bash", os.path.join(copy, "gen-tokens.sh")], timeout=30)
    bt.check(r.returncode == 0, "k8s/gen-tokens.sh wrote the tokens", r.stderr)
    auth = os.path.join(copy, "base", "auth")
    bt.check(oct(os.stat(auth).st_mode & 0o777) == "0o700" and
             all(os.stat(os.path.join(auth, f)).st_mode & 0o077 == 0 for f in os.listdir(auth)),
             "the token files are readable by their owner only")
    r = bt.run(["bash", os.path.join(copy, "overlays", "tls", "gen-certs.sh"), "test"],
               timeout=60)
    bt.check(r.returncode == 0, "k8s/overlays/tls/gen-certs.sh wrote the certificates",
             r.stderr)
    return copy


def render(tmpdir, copy, target):
    kubectl = shutil.which("kubectl")
    if not kubectl:
        raise bt.TestFailure("kubectl is needed to render k8s/ (kustomize): scripts/lib.sh "
                             "installs Debian's kubernetes-client when no kubectl is there")
    r = bt.run([kubectl, "kustomize", os.path.join(copy, target)], timeout=60)
    bt.check(r.returncode == 0, "kubectl kustomize k8s/%s renders (%s)" % (
        target, bt.run([kubectl, "version", "--client"]).stdout.strip().splitlines()[0]),
        r.stderr)
    path = os.path.join(tmpdir, target.replace("/", "-") + ".yaml")
    with open(path, "w") as f:
        f.write(r.stdout)
    docs = [d for d in yaml.safe_load_all(r.stdout) if d is not None]
    return path, docs


def validate_schemas(path, docs):
    script = os.path.join(NODE_DIR, "validate.mjs")
    if not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "kubernetes-models")):
        raise bt.TestFailure("tests/k8s/node_modules is missing: run `npm ci --prefix "
                             "tests/k8s` (scripts/test does)")
    node = shutil.which("node") or shutil.which("nodejs")
    r = bt.run([node, script, path], timeout=120)
    bt.check(r.returncode == 0, "the schema validator ran", r.stderr)
    results = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    check(len(results) == len(docs), "validated all %d rendered objects" % len(docs))
    for res in results:
        check(not res["errors"], "%s/%s: valid against the Kubernetes OpenAPI schema%s" %
              (res["kind"], res["name"], "" if not res["errors"] else
               ": " + "; ".join(res["errors"])))


# ---------------------------------------------------------------------------- checks

def name_of(doc):
    return "%s/%s" % (doc.get("kind"), typed(doc, "metadata.name", str))


def pod_spec(doc):
    return typed(doc, "spec.template.spec", dict) or {}


def containers(doc):
    spec = pod_spec(doc)
    return (spec.get("initContainers") or []) + (spec.get("containers") or [])


def selects(selector, labels):
    """A label selector (matchLabels/matchExpressions, or a Service's plain map)."""
    if selector is None:
        return False
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        return bool(selector) and all(labels.get(k) == v for k, v in selector.items())
    ok = all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
    for e in selector.get("matchExpressions") or []:
        if e["operator"] == "In":
            ok = ok and labels.get(e["key"]) in e["values"]
        elif e["operator"] == "NotIn":
            ok = ok and labels.get(e["key"]) not in e["values"]
        elif e["operator"] == "Exists":
            ok = ok and e["key"] in labels
        elif e["operator"] == "DoesNotExist":
            ok = ok and e["key"] not in labels
    return ok


def check_pod_policy(doc):
    n = name_of(doc)
    spec = pod_spec(doc)
    psc = spec.get("securityContext") or {}
    check(spec.get("automountServiceAccountToken") is False,
          "%s: no service-account token mounted" % n)
    check(not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")),
          "%s: no host namespaces" % n)
    check(typed(psc, "seccompProfile.type", str) == "RuntimeDefault", "%s: seccomp RuntimeDefault" % n)
    for c in containers(doc):
        cn = "%s/%s" % (n, c["name"])
        sc = c.get("securityContext") or {}
        user = sc.get("runAsUser", psc.get("runAsUser"))
        check(sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True and
              isinstance(user, int) and user > 0, "%s: runs as non-root (uid %s)" % (cn, user))
        check(sc.get("allowPrivilegeEscalation") is False and not sc.get("privileged"),
              "%s: no privilege escalation" % cn)
        check(sc.get("readOnlyRootFilesystem") is True, "%s: read-only root filesystem" % cn)
        caps = sc.get("capabilities") or {}
        check("ALL" in (caps.get("drop") or []) and not caps.get("add"),
              "%s: every capability dropped, none added" % cn)
        res = c.get("resources") or {}
        for kind in ("cpu", "memory"):
            req = quantity((res.get("requests") or {}).get(kind))
            lim = quantity((res.get("limits") or {}).get(kind))
            check(req is not None and lim is not None and req <= lim,
                  "%s: %s request %s <= limit %s" % (cn, kind, (res.get("requests") or {}).get(kind),
                                                     (res.get("limits") or {}).get(kind)))
        image = c.get("image", "")
        tag = image.rsplit("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2]
        check(("@sha256:" in image or tag) and tag != "latest",
              "%s: image %s is pinned (tag or digest, not latest)" % (cn, image))


def check_workload(doc, by_kind):
    n = name_of(doc)
    selector = typed(doc, "spec.selector", dict)
    labels = typed(doc, "spec.template.metadata.labels", dict) or {}
    if doc["kind"] != "Job":
        check(selects(selector, labels), "%s: selector matches the pod labels" % n)
    spec = pod_spec(doc)
    ports = {p["name"]: p["containerPort"] for c in spec.get("containers", [])
             for p in c.get("ports", [])}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    claim_templates = {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])}
    secrets = {typed(d, "metadata.name", str) for d in by_kind.get("Secret", [])}
    claims = {typed(d, "metadata.name", str) for d in by_kind.get("PersistentVolumeClaim", [])}
    for v in volumes.values():
        if "secret" in v:
            check(v["secret"]["secretName"] in secrets,
                  "%s: volume %s's Secret %s is rendered" % (n, v["name"], v["secret"]["secretName"]))
        if "persistentVolumeClaim" in v:
            cl = v["persistentVolumeClaim"]["claimName"]
            check(cl in claims or cl in EXTERNAL_CLAIMS,
                  "%s: volume %s's claim %s is rendered or the documented data claim" %
                  (n, v["name"], cl))
    check_pod_policy(doc)
    for c in spec.get("containers", []):
        cn = "%s/%s" % (n, c["name"])
        cmd = c.get("command") or []
        args = c.get("args") or []
        env = {e["name"]: e for e in c.get("env", [])}
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        for m in mounts.values():
            check(m["name"] in volumes or m["name"] in claim_templates,
                  "%s: mount %s has a volume" % (cn, m["name"]))
        for e in env.values():
            check(("value" in e) != ("valueFrom" in e),
                  "%s: env %s has exactly one of value/valueFrom" % (cn, e["name"]))
        for a in args:
            for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
                check(var in env, "%s: $(%s) is defined in env" % (cn, var))
        program = os.path.basename(cmd[0]) if cmd else ""
        if not program.startswith("batchwire"):
            continue
        check(cmd[0] == "/usr/local/bin/" + program and len(cmd) == 1,
              "%s: runs %s from the image" % (cn, program))
        flags, envs = help_of(program)
        for a in args:
            if a.startswith("--"):
                check(a.split("=")[0] in flags, "%s: %s accepts %s" % (cn, program, a))
        for e in env:
            if e.startswith("BATCHWIRE_"):
                check(e in envs, "%s: %s reads %s" % (cn, program, e))
        # Files the daemon is told to read lie in mounted volumes.
        for f in ("--auth-tokens", "--token-file", "--grant-key", "--tls-cert", "--tls-key",
                  "--tls-ca", "--tls-client-ca"):
            path = flag(args, f)
            if path:
                check(any(path.startswith(mp.rstrip("/") + "/") for mp in mounts),
                      "%s: %s %s is in a mounted volume" % (cn, f, path))
        # Files named by environment variables (BATCHWIRE_TLS_CERT...) are mounted too.
        for e in env.values():
            if re.search(r"_(CERT|KEY|CA|FILE|TOKENS)$", e["name"]) and "value" in e:
                check(any(e["value"].startswith(mp.rstrip("/") + "/") for mp in mounts),
                      "%s: %s=%s is in a mounted volume" % (cn, e["name"], e["value"]))
        listen = flag(args, "--listen")
        lport = int(listen.rsplit(":", 1)[1]) if listen else None
        check(lport in ports.values(), "%s: --listen %s is a declared container port" % (cn, listen))
        tls = "BATCHWIRE_TLS_CERT" in env or "--tls-cert" in args
        for probe in ("readinessProbe", "livenessProbe"):
            pr = c.get(probe) or {}
            if not tls:  # Kubernetes' own gRPC probe (plaintext)
                check(typed(pr, "grpc.port", int) == lport,
                      "%s: %s is the gRPC health check on the --listen port %s" %
                      (cn, probe, lport))
                continue
            # A TLS listener: kubelet's gRPC probe cannot speak TLS, so batchwire health does.
            cmd_ = typed(pr, "exec.command", list) or []
            check("grpc" not in pr and cmd_[:4] == ["/usr/local/bin/batchwire", "health", "--addr",
                                                  "127.0.0.1:%d" % lport] and
                  any(flag(cmd_, "--tls-ca") == (mp.rstrip("/") + "/ca.crt") for mp in mounts),
                  "%s: %s is the gRPC health check over TLS on the --listen port %s" %
                  (cn, probe, lport))
        metrics = flag(args, "--metrics-listen")
        mport = int(metrics.rsplit(":", 1)[1]) if metrics else None
        ann = typed(doc, "spec.template.metadata.annotations", dict) or {}
        check(mport is not None and ports.get("metrics") == mport and
              ann.get("prometheus.io/port") == str(mport) and
              ann.get("prometheus.io/scrape") == "true" and
              ann.get("prometheus.io/scheme", "http") == ("https" if tls else "http"),
              "%s: metrics on port %s, declared and annotated for Prometheus (%s: with TLS the "
              "endpoint is HTTPS)" % (cn, mport, ann.get("prometheus.io/scheme", "http")))
        if program == "batchwire-coordinator":
            check(doc["kind"] == "StatefulSet" and doc["spec"].get("replicas") == 1,
                  "%s: the coordinator is a StatefulSet of exactly one replica" % n)
            state = flag(args, "--state-dir")
            m = mounts.get(state)
            check(m is not None and m["name"] in claim_templates,
                  "%s: --state-dir %s is on a volumeClaimTemplate" % (cn, state))
        if program == "batchwire-worker":
            root = flag(args, "--data-root")
            m = mounts.get(root)
            check(m is not None and m.get("readOnly") is True,
                  "%s: --data-root %s is mounted read-only" % (cn, root))
    return labels, ports


def check_services(by_kind, pods):
    for svc in by_kind.get("Service", []):
        n = name_of(svc)
        sel = svc["spec"].get("selector") or {}
        matches = [p for p, (labels, _) in pods.items() if selects(sel, labels)]
        check(len(matches) >= 1, "%s: selector matches a workload" % n)
        for port in svc["spec"].get("ports", []):
            t = port.get("targetPort")
            check(all(t in pods[p][1] or t in pods[p][1].values() for p in matches),
                  "%s: targetPort %s is a container port of %s" % (n, t, matches))
    for sts in by_kind.get("StatefulSet", []):
        svc = sts["spec"].get("serviceName")
        check(any(typed(s, "metadata.name", str) == svc and s["spec"].get("clusterIP") == "None"
                  for s in by_kind.get("Service", [])),
              "%s: serviceName %s is a headless Service" % (name_of(sts), svc))


def check_disruption_and_network(by_kind, pods):
    pdbs = by_kind.get("PodDisruptionBudget", [])
    pols = by_kind.get("NetworkPolicy", [])
    for p, (labels, ports) in pods.items():
        check(any(selects(pol["spec"]["podSelector"], labels) for pol in pols),
              "%s: a NetworkPolicy selects its pods" % p)
        if p.startswith("Job/"):
            continue
        check(any(selects(b["spec"]["selector"], labels) for b in pdbs),
              "%s: a PodDisruptionBudget covers it" % p)
        # Every port the daemon serves is admitted from someone, and nothing else is.
        allowed = set()
        for pol in pols:
            if selects(pol["spec"]["podSelector"], labels):
                for rule in pol["spec"].get("ingress", []):
                    check(bool(rule.get("from")), "%s: %s admits named peers only" %
                          (p, name_of(pol)))
                    for port in rule.get("ports", []):
                        allowed.add(port["port"])
        check(allowed == set(ports.values()),
              "%s: its NetworkPolicy admits exactly its ports %s (%s)" %
              (p, sorted(ports.values()), sorted(allowed)))


def check_trainer(by_kind, pods):
    jobs = by_kind.get("Job", [])
    check(len(jobs) == 1, "one trainer Job")
    for job in jobs:
        n = name_of(job)
        spec = job["spec"]
        c = spec["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in c.get("env", [])}
        world = int(env.get("WORLD_SIZE", {}).get("value", "0"))
        check(spec.get("completionMode") == "Indexed", "%s: an Indexed Job" % n)
        check(world > 0 and spec.get("completions") == world and spec.get("parallelism") == world,
              "%s: WORLD_SIZE %d = completions = parallelism" % (n, world))
        check(typed(env.get("RANK", {}), "valueFrom.fieldRef.fieldPath", str) ==
              "metadata.annotations['batch.kubernetes.io/job-completion-index']",
              "%s: RANK is the pod's completion index" % n)
        sub = spec["template"]["spec"].get("subdomain")
        check(env.get("MASTER_ADDR", {}).get("value") == "%s-0.%s" % (job["metadata"]["name"], sub),
              "%s: MASTER_ADDR is the index-0 pod's DNS name" % n)
        labels = spec["template"]["metadata"]["labels"]
        check(any(typed(s, "metadata.name", str) == sub and s["spec"].get("clusterIP") == "None"
                  and selects(s["spec"].get("selector"), labels)
                  for s in by_kind.get("Service", [])),
              "%s: subdomain %s is a headless Service over the trainer pods" % (n, sub))
        coord = env.get("BATCHWIRE_COORDINATOR", {}).get("value", "")
        host, _, port = coord.partition(":")
        check(any(typed(s, "metadata.name", str) == host and
                  any(p["port"] == int(port or 0) for p in s["spec"]["ports"])
                  for s in by_kind.get("Service", [])),
              "%s: BATCHWIRE_COORDINATOR %s is the coordinator Service's port" % (n, coord))
        tok = env.get("BATCHWIRE_TOKEN_FILE", {}).get("value", "")
        check(any(tok.startswith(m["mountPath"].rstrip("/") + "/") for m in c["volumeMounts"]),
              "%s: BATCHWIRE_TOKEN_FILE %s is in a mounted Secret" % (n, tok))
        check(os.path.exists(os.path.join(SRC, "examples", os.path.basename(c["command"][-1]))),
              "%s: runs an example that exists (%s)" % (n, c["command"][-1]))


# ---------------------------------------------------------------------------- credentials

def secret_files(doc):
    return {k: base64.b64decode(re.sub(r"\s", "", v)).decode() for k, v in doc["data"].items()}


def check_credentials(tmpdir, by_kind):
    secrets = {typed(d, "metadata.name", str): d for d in by_kind.get("Secret", [])}
    daemon = next((secret_files(d) for n, d in secrets.items()
                   if n.startswith("batchwire-daemon-auth")), None)
    trainer = next((secret_files(d) for n, d in secrets.items()
                    if n.startswith("batchwire-trainer-auth")), None)
    bt.check(daemon is not None and trainer is not None, "the daemon and trainer Secrets exist")
    lines = [ln.split() for ln in daemon["tokens"].splitlines()
             if ln.strip() and not ln.startswith("#")]
    roles = {ln[0]: ln[2] for ln in lines}
    check(sorted(roles) == ["admin", "trainer", "worker"] and
          all(re.fullmatch(r"[0-9a-f]{64}", t) for t in roles.values()),
          "the principals file has admin, worker and trainer lines with 256-bit tokens")
    binding = {ln[0]: ln[3:] for ln in lines}
    sts = [typed(d, "metadata.name", str) for d in by_kind.get("StatefulSet", [])]
    check(binding == {"admin": [], "trainer": [], "worker": ["ids=batchwire-worker-*"]} and
          "batchwire-worker" in sts,
          "the worker principal is bound to the StatefulSet's pod names (ids=batchwire-worker-*)"
          " %s" % binding)
    check(daemon["worker.token"].strip() == roles.get("worker") and
          daemon["admin.token"].strip() == roles.get("admin") and
          trainer["token"].strip() == roles.get("trainer"),
          "each token file holds its principal's token from the principals file")
    return daemon, trainer


def check_tls(tmpdir, by_kind):
    """The TLS overlay's Secrets: a certificate the CA signed, naming what clients dial; the
    trainer pods get the CA only, never the key."""
    secrets = {typed(d, "metadata.name", str): d for d in by_kind.get("Secret", [])}
    tls = next((secret_files(d) for n, d in secrets.items() if re.match(r"batchwire-tls-\w+$", n)
                and "tls.key" in d["data"]), None)
    ca = next(((n, secret_files(d)) for n, d in secrets.items()
               if n.startswith("batchwire-tls-ca")), None)
    bt.check(tls is not None and ca is not None and sorted(ca[1]) == ["ca.crt"] and
             ca[1]["ca.crt"] == tls["ca.crt"],
             "the TLS Secrets: certificate, key and CA for the daemons; the CA alone for trainers")
    d = os.path.join(tmpdir, "tls-check")
    os.makedirs(d)
    for k, v in tls.items():
        with open(os.path.join(d, k), "w") as f:
            f.write(v)
    r = bt.run(["openssl", "verify", "-CAfile", os.path.join(d, "ca.crt"),
                os.path.join(d, "tls.crt")])
    check(r.returncode == 0, "tls.crt is signed by ca.crt")
    r = bt.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                os.path.join(d, "tls.crt")])
    for name in ("batchwire-coordinator", "*.batchwire-worker.test.svc", "batchwire-worker"):
        check("DNS:%s," % name in r.stdout + ",",
              "the certificate names %s (%s)" % (name, r.stdout.strip().splitlines()[-1]))
    # Trainers and the coordinator verify a worker against the address the placement gives
    # (docs/security.md, "Worker certificates"): the host each pod advertises must match.
    for sts in by_kind.get("StatefulSet", []):
        for c in pod_spec(sts).get("containers", []):
            adv = flag(c.get("args", []), "--advertise")
            if not adv:
                continue
            host = re.sub(r"\$\((\w+)\)", lambda m: {"POD_NAME": sts["metadata"]["name"] + "-0",
                                                     "POD_NAMESPACE": "test"}[m.group(1)],
                          adv).rsplit(":", 1)[0]
            r = bt.run(["openssl", "x509", "-noout", "-checkhost", host, "-in",
                        os.path.join(d, "tls.crt")])
            check("does match certificate" in r.stdout,
                  "%s: the certificate names the address its pods advertise (%s): %s" %
                  (name_of(sts), host, r.stdout.strip()))
    for job in by_kind.get("Job", []):
        vols = [v.get("secret", {}).get("secretName", "") for v in pod_spec(job).get("volumes", [])]
        check(not any(re.match(r"batchwire-tls-(?!ca)", v) for v in vols) and
              any(v == ca[0] for v in vols),
              "%s: mounts the CA Secret, not the daemons' key" % name_of(job))
    return tls


def run_rendered_daemons(tmpdir, by_kind, daemon_files, tls_files=None):
    """Starts a coordinator and a worker with the rendered arguments and environment (paths
    of mounted volumes moved under tmpdir, addresses onto loopback), then runs what an
    operator and the probes run against them."""
    what = "TLS" if tls_files else "plaintext"
    mnt = os.path.join(tmpdir, "mnt-" + what)
    dirs = {"/etc/batchwire/auth": os.path.join(mnt, "auth"),
            "/etc/batchwire/tls": os.path.join(mnt, "tls"),
            "/data": os.path.join(mnt, "data"),
            "/var/lib/batchwire": os.path.join(mnt, "state")}
    for d in dirs.values():
        os.makedirs(d)
    for sub, files in (("auth", daemon_files), ("tls", tls_files or {})):
        for k, v in files.items():
            with open(os.path.join(mnt, sub, k), "w") as f:
                f.write(v)
            os.chmod(os.path.join(mnt, sub, k), 0o440)  # as Kubernetes mounts them

    def local(text, env):
        text = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], text)
        for path, here in dirs.items():
            text = re.sub(r"^%s(?=/|$)" % re.escape(path), here, text)
        return re.sub(r"^0\.0\.0\.0:\d+$", "127.0.0.1:0", text)

    def container(program):
        for doc in by_kind.get("StatefulSet", []):
            for c in pod_spec(doc).get("containers", []):
                if c.get("command") == ["/usr/local/bin/" + program]:
                    return c
        raise bt.TestFailure("no container runs " + program)

    def argv_env(program):
        c = container(program)
        env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
        env.update(POD_NAME="batchwire-worker-0", POD_NAMESPACE="test")
        args = [local(a, env) for a in c["args"]]
        return args, {k: local(v, env) for k, v in env.items() if k.startswith("BATCHWIRE_")}

    def probe(program, addr):
        """The container's readiness probe as it runs there (TLS: batchwire health)."""
        c = container(program)
        cmd = typed(c, "readinessProbe.exec.command", list)
        if cmd is None:  # kubelet's gRPC probe: the plaintext health check
            return [bt.CLI, "health", "--addr", addr]
        cmd = [local(a, {}) for a in cmd]
        cmd[0] = bt.CLI
        cmd[cmd.index("--addr") + 1] = addr
        return cmd

    args, env = argv_env("batchwire-coordinator")
    coord = bt.Daemon("coordinator", [bt.COORDINATOR] + args, tmpdir, env=env)
    # In JSON (BATCHWIRE_LOG_FORMAT) and after the file-mode warning that group-readable
    # token files get (Kubernetes mounts Secrets 0440 with fsGroup).
    addr = coord.wait_log(r'listening on ([^\s"]+)')[0].group(1)
    coord.wait_log(r"auth: on")
    args, env = argv_env("batchwire-worker")
    args[args.index("--coordinator") + 1] = addr
    i = args.index("--advertise")  # the pod's DNS name: here, what it binds
    del args[i:i + 2]
    tls_client = []
    if tls_files:
        # In the cluster the worker dials the name the certificate carries; here an address.
        env["BATCHWIRE_TLS_SERVER_NAME"] = "batchwire-coordinator"
        tls_client = ["--tls-ca", os.path.join(dirs["/etc/batchwire/tls"], "ca.crt"),
                      "--tls-server-name", "batchwire-coordinator"]
    worker = bt.Daemon("worker", [bt.WORKER] + args, tmpdir, env=env)
    waddr = worker.wait_log(r'listening on ([^\s"]+)')[0].group(1)
    worker.wait_log(r"registered with coordinator")
    bt.ok("%s: a coordinator and a worker run with the rendered arguments and files" % what)
    admin = ["--token-file", os.path.join(dirs["/etc/batchwire/auth"], "admin.token")]
    r = bt.cli("status", "--coordinator", addr, "--json", *(admin + tls_client))
    st = json.loads(r.stdout) if r.returncode == 0 else {}
    check(st.get("coordinator", {}).get("auth") == "on" and
          [w["id"] for w in st.get("workers", [])] == ["batchwire-worker-0"],
          "%s: status with the admin token: auth on, the worker registered under its pod name"
          % what)
    r = bt.cli("status", "--coordinator", addr, *tls_client)
    check(r.returncode != 0 and "UNAUTHENTICATED" in (r.stdout + r.stderr).upper(),
          "%s: status without a token is refused (%s)" %
          (what, (r.stderr.strip().splitlines() or [""])[-1]))
    for program, a in (("batchwire-coordinator", addr), ("batchwire-worker", waddr)):
        r = bt.run(probe(program, a), timeout=30)
        check(r.returncode == 0 and "SERVING" in r.stdout,
              "%s: %s's readiness probe command answers SERVING" % (what, program))
    if tls_files:
        r = bt.cli("health", "--addr", addr, "--timeout-ms", 2000)
        check(r.returncode != 0, "TLS: a plaintext gRPC health check (kubelet's) fails: why "
              "the probes run batchwire health")
    worker.stop()
    coord.stop()


# ---------------------------------------------------------------------------- the image

def check_dockerfile():
    path = os.path.join(K8S, "Dockerfile")
    with open(path) as f:
        text = re.sub(r"\\\n", " ", f.read())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    stages = []  # [name, base, [instructions]]
    for ln in lines:
        word, _, rest = ln.partition(" ")
        if word.upper() == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest.strip(), re.I)
            check(m is not None, "Dockerfile: FROM %s parses" % rest)
            stages.append([m.group(2), m.group(1), []])
        elif stages:
            stages[-1][2].append((word.upper(), rest))
    names = {s[0] for s in stages}
    check(len(stages) >= 2, "Dockerfile: multi-stage (%d stages)" % len(stages))
    for name, base, _ in stages:
        if base in names:
            continue
        repo, _, tag = base.split("@")[0].rpartition(":") if ":" in base.split("@")[0] else (base, "", "")
        check("@sha256:" in base or (tag and tag != "latest" and re.search(r"\d", tag)),
              "Dockerfile: stage %s's base %s is pinned (exact tag or digest)" % (name, base))
    built_from = {rest.split("=", 1)[1].split()[0] for _, _, ins in stages for w, rest in ins
                  if w == "COPY" and rest.startswith("--from=")}
    finals = [s for s in stages if s[0] not in built_from]
    check({s[0] for s in finals} == {"daemons", "trainer"},
          "Dockerfile: the final images are the daemons and trainer targets")
    for name, _, ins in finals:
        users = [rest.split(":")[0] for w, rest in ins if w == "USER"]
        check(users and users[-1] not in ("root", "0") and
              (not users[-1].isdigit() or int(users[-1]) > 0),
              "Dockerfile: %s runs as a non-root USER (%s)" % (name, users[-1] if users else None))
        installs = " ".join(rest for w, rest in ins if w == "RUN")
        pkgs = re.findall(r"apt-get install ([^&;]*)", installs)
        pkgs = [p for group in pkgs for p in group.split() if not p.startswith("-")]
        check(pkgs and not [p for p in pkgs if p.endswith("-dev") or p in
                            ("gcc", "g++", "make", "cmake", "ninja-build", "clang")],
              "Dockerfile: %s installs runtime packages only (%s)" % (name, " ".join(pkgs)))
    trainer = next(ins for n, _, ins in stages if n == "trainer")
    check(any(w == "COPY" and "/opt/site" in rest and "dist-packages" in rest for w, rest in trainer),
          "Dockerfile: the trainer image has the Python package installed")
    with open(os.path.join(SRC, ".dockerignore")) as f:
        ignored = set(f.read().split())
    check({".git", "build", "build-*", "k8s/base/auth", "k8s/overlays/tls/certs"} <= ignored,
          ".dockerignore keeps git, build trees, tokens and keys out of the build context")


def check_target(tmpdir, copy, target):
    """Renders k8s/TARGET and runs every check on it."""
    path, docs = render(tmpdir, copy, target)
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
    kinds = sorted(by_kind)
    check({"StatefulSet", "Job", "Service", "Secret", "NetworkPolicy", "PodDisruptionBudget",
           "PersistentVolumeClaim"} <= set(kinds), "%s: rendered kinds: %s" %
          (target, ", ".join(kinds)))
    validate_schemas(path, docs)
    pods = {}
    for d in docs:
        check(isinstance(typed(d, "metadata.name", str), str), "%s: metadata.name" % name_of(d))
        if d.get("kind") in WORKLOADS:
            pods[name_of(d)] = check_workload(d, by_kind)
    check_services(by_kind, pods)
    check_disruption_and_network(by_kind, pods)
    check_trainer(by_kind, pods)
    daemon_files, _ = check_credentials(tmpdir, by_kind)
    tls_files = check_tls(tmpdir, by_kind) if target == "overlays/tls" else None
    run_rendered_daemons(tmpdir, by_kind, daemon_files, tls_files)


def test(tmpdir):
    copy = prepare(tmpdir)
    for target in ("base", "overlays/tls"):
        check_target(tmpdir, copy, target)
    check_dockerfile()
    if failures:
        raise bt.TestFailure("%d check(s) failed:\n  %s" % (len(failures), "\n  ".join(failures)))
    bt.ok("every manifest check passed")


if __name__ == "__main__":
    bt.main(test, timeout=240)
