#!/usr/bin/env python3
"""Offline checks of deploy/k8s (no cluster needed): every file parses as YAML, every document has
apiVersion/kind/metadata.name, and the invariants kaas depends on hold:

- the broker StatefulSet mounts ONE ReadWriteMany claim (no volumeClaimTemplates) at the data dir;
- broker.id comes from the pod-index label, advertised.listeners from the headless Service's
  pod DNS names, and every $(VAR) it references is defined earlier in the env list;
- readiness is GET /healthz on the metrics port; the grace period covers a drain (>= 40 s);
- a PodDisruptionBudget with maxUnavailable 1 selects the brokers, and one selects etcd;
- the etcd StatefulSet has 3 members whose --initial-cluster names all of them.

    python3 deploy/k8s/check.py        (needs python3-yaml / PyYAML)
"""
import os
import re
import sys

import yaml

here = os.path.dirname(os.path.abspath(__file__))
errors = []


def check(cond, msg):
    if not cond:
        errors.append(msg)


docs = {}
for name in sorted(os.listdir(here)):
    if not name.endswith(".yaml"):
        continue
    with open(os.path.join(here, name)) as f:
        for d in yaml.safe_load_all(f):
            if d is None:
                continue
            if name == "kustomization.yaml":
                for r in d.get("resources", []):
                    check(os.path.exists(os.path.join(here, r)), f"kustomization lists missing {r}")
                continue
            for k in ("apiVersion", "kind"):
                check(k in d, f"{name}: a document without {k}")
            check("name" in d.get("metadata", {}), f"{name}: a {d.get('kind')} without metadata.name")
            docs[(d["kind"], d["metadata"]["name"])] = d

sts = docs.get(("StatefulSet", "kaas"))
check(sts is not None, "no StatefulSet kaas")
if sts:
    spec = sts["spec"]
    check(spec.get("replicas") == 3, "kaas: replicas != 3")
    check("volumeClaimTemplates" not in spec, "kaas: volumeClaimTemplates would give each broker its own disk")
    pod = spec["template"]["spec"]
    check(pod.get("terminationGracePeriodSeconds", 30) >= 40, "kaas: terminationGracePeriodSeconds < 40 (drain)")
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod.get("volumes", []) if "persistentVolumeClaim" in v]
    check(len(claims) == 1, f"kaas: want one shared claim, have {claims}")
    pvc = docs.get(("PersistentVolumeClaim", claims[0] if claims else ""))
    check(pvc is not None and pvc["spec"]["accessModes"] == ["ReadWriteMany"], "kaas: the shared claim is not ReadWriteMany")
    c = pod["containers"][0]
    env = {}
    for i, e in enumerate(c["env"]):
        for ref in re.findall(r"\$\((\w+)\)", e.get("value", "")):
            check(ref in env, f"kaas: env {e['name']} uses $({ref}) before it is defined")
        env[e["name"]] = e
    check(env.get("KAAS_BROKER_ID", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "metadata.labels['apps.kubernetes.io/pod-index']", "kaas: broker.id not from the pod index")
    adv = env.get("KAAS_ADVERTISED_LISTENERS", {}).get("value", "")
    check(f".{spec['serviceName']}." in adv and "$(POD_NAME)" in adv, f"kaas: advertised.listeners {adv!r} not the pod DNS name")
    hs = docs.get(("Service", spec["serviceName"]))
    check(hs is not None and hs["spec"].get("clusterIP") == "None", "kaas: serviceName is not a headless Service")
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    check(mounts.get("data") == env.get("KAAS_DATA_DIR", {}).get("value"), "kaas: data.dir is not the shared mount")
    check(env.get("KAAS_CLUSTER_ETCD_ENDPOINTS", {}).get("value", "").count("http://") == 3, "kaas: not 3 etcd endpoints")
    rp = c.get("readinessProbe", {}).get("httpGet", {})
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(rp.get("path") == "/healthz" and rp.get("port") in ("metrics", ports.get("metrics")), "kaas: readiness is not /healthz on metrics")
    check(env.get("KAAS_METRICS_ADDR", {}).get("value", "").endswith(f":{ports.get('metrics')}"), "kaas: metrics.addr port != metrics port")

for name in ("kaas", "etcd"):
    pdb = docs.get(("PodDisruptionBudget", name))
    check(pdb is not None and pdb["spec"].get("maxUnavailable") == 1, f"{name}: no PodDisruptionBudget with maxUnavailable 1")
    s = docs.get(("StatefulSet", name))
    if pdb and s:
        check(pdb["spec"]["selector"]["matchLabels"].items() <= s["spec"]["template"]["metadata"]["labels"].items(),
              f"{name}: the PodDisruptionBudget does not select the pods")

etcd = docs.get(("StatefulSet", "etcd"))
check(etcd is not None, "no StatefulSet etcd")
if etcd:
    check(etcd["spec"].get("replicas") == 3, "etcd: replicas != 3")
    args = etcd["spec"]["template"]["spec"]["containers"][0]["args"]
    ic = next((a.split("=", 1)[1] for a in args if a.startswith("--initial-cluster=")), "")
    members = [m.split("=")[0] for m in ic.split(",") if m]
    check(members == ["etcd-0", "etcd-1", "etcd-2"], f"etcd: --initial-cluster names {members}")
    check(docs.get(("Service", etcd["spec"]["serviceName"]), {}).get("spec", {}).get("publishNotReadyAddresses") is True,
          "etcd: the headless Service must publish not-ready addresses (bootstrap)")

if errors:
    print("deploy/k8s check FAILED:\n  " + "\n  ".join(errors))
    sys.exit(1)
print(f"deploy/k8s: {len(docs)} objects OK: " + ", ".join(f"{k}/{n}" for k, n in sorted(docs)))
