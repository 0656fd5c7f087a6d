"""Offline checks of the Kubernetes manifests in k8s/ (no cluster runs on these machines).

Every document parses; required fields are present with the right types; selectors match the
pod labels; probes and Services point at declared container ports; the coordinator runs one
replica with the Recreate strategy; and -- the check that catches real mistakes -- every
flag in a container's args and every BATCHWIRE_* variable in its env is one the program's
own --help lists.
"""
import os
import re
import subprocess
import sys

import yaml

SRC = os.environ.get("BW_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ["BW_BIN_DIR"]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def help_of(program):
    out = subprocess.run([os.path.join(BIN, program), "--help"], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    flags = set(re.findall(r"^  (--[a-z0-9-]+)", out.stdout, re.M))
    envs = set(re.findall(r"\[env (BATCHWIRE_[A-Z0-9_]+)\]", out.stdout))
    return flags, envs


def typed(obj, path, kind):
    cur = obj
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur if isinstance(cur, kind) else None


def container_ports(pod_spec):
    ports = {}
    for c in pod_spec.get("containers", []):
        for p in c.get("ports", []):
            ports[p["name"]] = p["containerPort"]
    return ports


def check_workload(doc, name):
    spec = typed(doc, "spec", dict)
    check(spec is not None, f"{name}: has spec")
    selector = typed(doc, "spec.selector.matchLabels", dict) or {}
    labels = typed(doc, "spec.template.metadata.labels", dict) or {}
    check(selector and all(labels.get(k) == v for k, v in selector.items()),
          f"{name}: selector {selector} matches the pod labels")
    pod = typed(doc, "spec.template.spec", dict) or {}
    containers = pod.get("containers") or []
    check(len(containers) >= 1, f"{name}: has containers")
    ports = container_ports(pod)
    volumes = {v["name"] for v in pod.get("volumes", [])}
    for c in containers:
        check(isinstance(c.get("image"), str) and c["image"], f"{name}/{c.get('name')}: image")
        cmd = c.get("command") or []
        check(len(cmd) == 1 and cmd[0].startswith("/usr/local/bin/batchwire"),
              f"{name}/{c['name']}: runs a batchwire program")
        program = os.path.basename(cmd[0])
        flags, envs = help_of(program)
        args = c.get("args") or []
        check(all(isinstance(a, str) for a in args), f"{name}/{c['name']}: args are strings")
        for a in args:
            if a.startswith("--"):
                check(a.split("=")[0] in flags, f"{name}/{c['name']}: {program} accepts {a}")
        for e in c.get("env", []):
            check(isinstance(e.get("name"), str), f"{name}/{c['name']}: env entry has a name")
            if e["name"].startswith("BATCHWIRE_"):
                check(e["name"] in envs, f"{name}/{c['name']}: {program} reads {e['name']}")
            check(("value" in e) != ("valueFrom" in e),
                  f"{name}/{c['name']}: env {e['name']} has exactly one of value/valueFrom")
        # args referencing $(VAR) must use variables the container defines
        defined = {e["name"] for e in c.get("env", [])}
        for a in args:
            for var in re.findall(r"\$\(([A-Z_]+)\)", a):
                check(var in defined, f"{name}/{c['name']}: $({var}) is defined in env")
        for probe in ("readinessProbe", "livenessProbe"):
            port = typed(c, f"{probe}.grpc.port", int)
            check(port in ports.values(), f"{name}/{c['name']}: {probe} uses declared port {port}")
        listen = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--listen"]
        for value in listen:
            check(int(value.rsplit(":", 1)[1]) in ports.values(),
                  f"{name}/{c['name']}: --listen {value} is a declared container port")
        for m in c.get("volumeMounts", []):
            check(m["name"] in volumes, f"{name}/{c['name']}: mount {m['name']} has a volume")
    return labels, ports


def main():
    docs = []
    for fname in sorted(os.listdir(os.path.join(SRC, "k8s"))):
        if fname.endswith(".yaml"):
            with open(os.path.join(SRC, "k8s", fname)) as f:
                for doc in yaml.safe_load_all(f):
                    if doc is not None:
                        docs.append((fname, doc))
    check(len(docs) >= 5, f"found {len(docs)} manifests")
    pods = {}
    services = []
    for fname, doc in docs:
        name = f"{fname}:{doc.get('kind')}/{typed(doc, 'metadata.name', str)}"
        check(isinstance(doc.get("apiVersion"), str) and isinstance(doc.get("kind"), str),
              f"{name}: apiVersion and kind")
        check(typed(doc, "metadata.name", str) is not None, f"{name}: metadata.name")
        kind = doc["kind"]
        if kind in ("Deployment", "StatefulSet"):
            pods[name] = check_workload(doc, name)
        if kind == "Deployment" and "coordinator" in doc["metadata"]["name"]:
            check(doc["spec"].get("replicas") == 1, f"{name}: exactly one replica")
            check(typed(doc, "spec.strategy.type", str) == "Recreate", f"{name}: Recreate")
        if kind == "StatefulSet":
            svc = doc["spec"].get("serviceName")
            check(any(d["kind"] == "Service" and d["metadata"]["name"] == svc
                      and d["spec"].get("clusterIP") == "None" for _, d in docs),
                  f"{name}: serviceName {svc} is a headless Service")
        if kind == "Service":
            services.append((name, doc))
        if kind == "PersistentVolumeClaim":
            check(typed(doc, "spec.resources.requests.storage", str) is not None,
                  f"{name}: storage request")
    for name, svc in services:
        sel = svc["spec"].get("selector") or {}
        matches = [p for p, (labels, _) in pods.items()
                   if all(labels.get(k) == v for k, v in sel.items())]
        check(len(matches) >= 1, f"{name}: selector matches a workload")
        for port in svc["spec"].get("ports", []):
            target = port.get("targetPort")
            check(all(target in ports or target in ports.values()
                      for p, (_, ports) in pods.items() if p in matches),
                  f"{name}: targetPort {target} is a container port")
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("all manifest checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
