"""Check packaging/kubernetes/*.yaml: valid against the Kubernetes schemas (kubernetes-validate,
offline: it ships the schemas), and consistent with the systemd unit and the agent's settings.

usage: k8s_manifests.py MANIFEST_DIR UNIT CONFIG_EXAMPLE AGENT_BIN

Prints one `ok ...` line per check; exits 1 with one line per problem.
"""
import glob
import os
import re
import subprocess
import sys
import tempfile

import kubernetes_validate
import yaml

# The oldest Kubernetes with the BPF / PERFMON capabilities in common runtimes, and the newest
# schema kubernetes-validate ships.
VERSIONS = ["1.28.0", kubernetes_validate.utils.latest_version()]
HOST_PATHS = ["/dev/shm/comminsight", "/var/log/comminsight", "/var/lib/comminsight"]
CONFIG_PATH = "/etc/comminsight/agent.toml"
PORT = 9464

manifest_dir, unit_path, example_path, agent_bin = sys.argv[1:5]
problems = []


def check(cond, what):
    if cond:
        print(f"ok {what}")
    else:
        problems.append(what)


docs = []
for path in sorted(glob.glob(os.path.join(manifest_dir, "*.yaml"))):
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if doc is not None:
                docs.append((os.path.basename(path), doc))
check(docs, f"{manifest_dir} holds manifests")

for name, doc in docs:
    for v in VERSIONS:
        try:
            kubernetes_validate.validate(doc, v, strict=True)
            print(f"ok {name} {doc['kind']} validates against Kubernetes {v} (strict)")
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            problems.append(f"{name}: {doc['kind']} invalid for Kubernetes {v} at {path}: {e.message}")
        except kubernetes_validate.utils.SchemaNotFoundError as e:
            problems.append(f"{name}: no schema for {doc.get('kind')} ({e}); a typo in apiVersion/kind?")

by_kind = {}
for _, doc in docs:
    by_kind.setdefault(doc["kind"], []).append(doc)
for kind in ["Namespace", "ServiceAccount", "ConfigMap", "DaemonSet"]:
    check(len(by_kind.get(kind, [])) == 1, f"exactly one {kind}")
if problems and not by_kind.get("DaemonSet"):
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)

ns = by_kind["Namespace"][0]["metadata"]["name"]
for _, doc in docs:
    if doc["kind"] != "Namespace":
        check(doc["metadata"].get("namespace") == ns, f"{doc['kind']} is in namespace {ns}")

ds = by_kind["DaemonSet"][0]
pod = ds["spec"]["template"]["spec"]
(c,) = pod["containers"]
check(pod.get("hostPID") is True, "hostPID: true")
check(pod.get("serviceAccountName") == by_kind["ServiceAccount"][0]["metadata"]["name"],
      "the pod runs as the ServiceAccount")

# Capabilities: exactly the unit's bounding set, everything else dropped.
with open(unit_path) as f:
    unit = f.read()
bounding = re.search(r"^CapabilityBoundingSet=(.*)$", unit, re.M).group(1).split()
want_caps = sorted(b.removeprefix("CAP_") for b in bounding)
sc = c.get("securityContext", {})
caps = sc.get("capabilities", {})
check(sorted(caps.get("add", [])) == want_caps,
      f"capabilities add {sorted(caps.get('add', []))} == the unit's CapabilityBoundingSet {want_caps}")
check(caps.get("drop") == ["ALL"], "capabilities drop ALL")
check(sc.get("privileged") is not True and sc.get("allowPrivilegeEscalation") is False,
      "not privileged, no privilege escalation")

# Host paths: the directories the job pods mount too, at the same path in the container.
volumes = {v["name"]: v for v in pod.get("volumes", [])}
mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
for p in HOST_PATHS:
    name = mounts.get(p)
    host = volumes.get(name, {}).get("hostPath", {}).get("path")
    check(host == p, f"{p} is a hostPath volume mounted at {p} (got {host!r})")

# Memory: the unit's MemoryMax (systemd M = MiB) is the container's limit.
unit_mem = re.search(r"^MemoryMax=(\d+)M$", unit, re.M).group(1)
limit = c.get("resources", {}).get("limits", {}).get("memory")
check(limit == f"{unit_mem}Mi", f"memory limit {limit} == the unit's MemoryMax={unit_mem}M")
check("memory" in c.get("resources", {}).get("requests", {}), "a memory request")

# Environment: the host name from the node; every COMMINSIGHT_* variable is an agent setting.
env = {e["name"]: e for e in c.get("env", [])}
host = env.get("COMMINSIGHT_AGENT_HOST_NAME", {})
check(host.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
      "COMMINSIGHT_AGENT_HOST_NAME comes from spec.nodeName")
with open(example_path) as f:
    documented = set(re.findall(r"^# env: (COMMINSIGHT_\w+)$", f.read(), re.M))
for name in env:
    if name.startswith("COMMINSIGHT_"):
        check(name in documented,
              f"{name} is a documented setting (a `# env:` line of agent/config.example.toml)")
listen = env.get("COMMINSIGHT_HTTP_LISTEN", {}).get("value", "")
check(listen == f"0.0.0.0:{PORT}", f"COMMINSIGHT_HTTP_LISTEN={listen!r} serves beyond loopback on {PORT}")

# Probes on the health endpoints, at the port the agent listens on.
ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
for probe, path in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")]:
    get = c.get(probe, {}).get("httpGet", {})
    port = get.get("port")
    port = ports.get(port, port)
    check(get.get("path") == path and port == PORT, f"{probe} GET {path} on port {PORT} (got {get})")

# The configuration: mounted at the unit's path, passed to `run`, and accepted by the agent.
check(c.get("args") == ["run", "--config", CONFIG_PATH], f"args run --config {CONFIG_PATH}")
cfg_dir = os.path.dirname(CONFIG_PATH)
cm_name = volumes.get(mounts.get(cfg_dir), {}).get("configMap", {}).get("name")
cm = by_kind["ConfigMap"][0]
check(cm_name == cm["metadata"]["name"], f"the ConfigMap is mounted at {cfg_dir}")
toml_text = cm["data"].get("agent.toml", "")
with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
    f.write(toml_text)
    f.flush()
    clean_env = {k: v for k, v in os.environ.items() if not k.startswith("COMMINSIGHT_")}
    r = subprocess.run([agent_bin, "config", "check", f.name], capture_output=True, text=True,
                       env=clean_env)
    check(r.returncode == 0 and not r.stderr.strip(),
          f"`comminsight-agent config check` accepts the ConfigMap's agent.toml: {r.stderr.strip()}")

if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
