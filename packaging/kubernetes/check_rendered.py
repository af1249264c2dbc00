"""Checks on the rendered manifests that schema validation cannot make: the promises of
docs/install.md (non-root, read-only, no capabilities, probes, GPU-node scheduling) and the
consistency of the Prometheus Operator objects with the Service and the alert rules.

usage: check_rendered.py RENDERED.yaml RULES_OUT.yml [--host-pid] [--non-root]
Writes the PrometheusRule's spec to RULES_OUT.yml for `promtool check rules`, and the config
volume's files (config.toml, config.d/*.toml) under RULES_OUT.yml.config/ for `check-config`."""
import sys

import yaml

docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
by_kind = {}
for d in docs:
    by_kind.setdefault(d["kind"], []).append(d)
errors = []


def need(cond, msg):
    if not cond:
        errors.append(msg)


ds = by_kind["DaemonSet"][0]
pod = ds["spec"]["template"]["spec"]
c = pod["containers"][0]
need(pod.get("nodeSelector", {}).get("nvidia.com/gpu.present") == "true", "nodeSelector on nvidia.com/gpu.present")
need(any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])), "toleration for nvidia.com/gpu")
need(pod.get("automountServiceAccountToken") is False, "pod automountServiceAccountToken: false")
psc, csc = pod.get("securityContext", {}), c.get("securityContext", {})
need(psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", "seccomp RuntimeDefault")
need(csc.get("readOnlyRootFilesystem") is True, "readOnlyRootFilesystem")
need(csc.get("allowPrivilegeEscalation") is False, "allowPrivilegeEscalation: false")
need(csc.get("capabilities", {}).get("drop") == ["ALL"], "drop ALL capabilities")
need(not csc.get("capabilities", {}).get("add"), "no added capabilities")
env = {e["name"]: e for e in c.get("env", [])}
need(env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
     "NODE_NAME from the downward API")
need(c["readinessProbe"]["httpGet"]["path"] == "/health", "readiness probe GET /health")
need(c["livenessProbe"]["httpGet"]["path"] == "/livez", "liveness probe GET /livez")
need(all(k in c.get("resources", {}).get(s, {}) for s in ("requests", "limits") for k in ("memory",)),
     "memory request and limit")
mounts = {m["name"]: m for m in c.get("volumeMounts", [])}
vols = {v["name"]: v for v in pod.get("volumes", [])}
pr = [n for n, v in vols.items() if v.get("hostPath", {}).get("path") == "/var/lib/kubelet/pod-resources"]
need(pr and mounts.get(pr[0], {}).get("readOnly") is True, "pod-resources hostPath mounted read-only")
# Audit log and accounting state outlive the pod: a writable hostPath at /var/lib/gpu-steward.
st = [n for n, v in vols.items() if v.get("hostPath", {}).get("path") == "/var/lib/gpu-steward"]
need(st and vols[st[0]]["hostPath"].get("type") == "DirectoryOrCreate",
     "state hostPath /var/lib/gpu-steward (DirectoryOrCreate)")
need(st and mounts.get(st[0], {}).get("mountPath") == "/var/lib/gpu-steward"
     and not mounts.get(st[0], {}).get("readOnly"), "state hostPath mounted writable at /var/lib/gpu-steward")
need(env.get("STATE_DIRECTORY", {}).get("value") == "/var/lib/gpu-steward",
     "STATE_DIRECTORY=/var/lib/gpu-steward (accounting state)")
need(by_kind["ServiceAccount"][0].get("automountServiceAccountToken") is False, "ServiceAccount without token automount")
# The config that turns the kubelet client on must reach the agent at the path it is told.
args = c.get("args", [])
need(args[:1] == ["run"] and "--config" in args, "args: run --config FILE")
config_path = args[args.index("--config") + 1] if "--config" in args else ""
cfg_vol = [n for n, v in vols.items() if "projected" in v or "configMap" in v]
need(cfg_vol and config_path.startswith(mounts.get(cfg_vol[0], {}).get("mountPath", "//") + "/"),
     "the config ConfigMap is mounted where --config points")
cms = {m["metadata"]["name"]: m for m in by_kind.get("ConfigMap", [])}
# The files the config volume holds: config.toml and the components' config.d/ drop-ins.
files = {}
if cfg_vol:
    v = vols[cfg_vol[0]]
    sources = v["projected"]["sources"] if "projected" in v else [{"configMap": v["configMap"]}]
    for src in sources:
        ref = src.get("configMap", {})
        cm = cms.get(ref.get("name"))
        need(cm is not None, f"the mounted ConfigMap {ref.get('name')} exists")
        if cm is None:
            continue
        items = ref.get("items") or [{"key": k, "path": k} for k in cm["data"]]
        for item in items:
            need(item["key"] in cm["data"], f"ConfigMap {ref.get('name')} has key {item['key']}")
            need(item["path"] not in files, f"two sources write {item['path']}")
            files[item["path"]] = cm["data"].get(item["key"], "")
main = config_path.rsplit("/", 1)[1] if config_path else ""
need(main in files, f"the config volume holds {main}")
if main in files:
    import tomllib

    def merge(base, over):
        for k, val in over.items():
            if isinstance(base.get(k), dict) and isinstance(val, dict):
                merge(base[k], val)
            else:
                base[k] = val
    # The agent's merge (src/config/dropins.rs): config.d/*.toml in name order over the file.
    conf = tomllib.loads(files[main])
    for path in sorted(p for p in files if p.startswith("config.d/") and p.endswith(".toml")):
        merge(conf, tomllib.loads(files[path]))
    # Root exactly when the kubelet client is on (its socket accepts only root), and then
    # without capabilities (checked above); non-root otherwise.
    kubelet = conf.get("kubernetes", {}).get("enabled") is True
    if kubelet:
        need(psc.get("runAsUser") == 0 and psc.get("runAsNonRoot") is False,
             "UID 0 (for the root-only kubelet socket) when [kubernetes] is enabled")
    else:
        need(psc.get("runAsNonRoot") is True and psc.get("runAsUser", 0) != 0,
             "non-root when [kubernetes] is disabled")
    expect_kubelet = not (len(sys.argv) > 3 and "--non-root" in sys.argv[3:])
    need(kubelet == expect_kubelet, f"[kubernetes] enabled = {str(expect_kubelet).lower()}")
    # The device plugin's drop-in and its hostPath mount come together.
    plugin = conf.get("sharing", {}).get("device_plugin", {}).get("enabled") is True
    dp = [n for n, v in vols.items()
          if v.get("hostPath", {}).get("path") == "/var/lib/kubelet/device-plugins"]
    need(plugin == bool(dp), "the device plugin is on exactly when its directory is mounted")
    # The config directory as the agent sees it, for `gpu-steward check-config`.
    import os
    out_dir = sys.argv[2] + ".config"
    for path, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(out_dir, path)), exist_ok=True)
        with open(os.path.join(out_dir, path), "w") as f:
            f.write(text)
# hostPID only where the host-processes component asks for it.
expect_host_pid = "--host-pid" in sys.argv[3:]
need(bool(pod.get("hostPID")) == expect_host_pid, f"hostPID {'set' if expect_host_pid else 'absent'}")

svc = by_kind["Service"][0]
ports = {p["name"]: p for p in svc["spec"]["ports"]}
need(ports.get("metrics", {}).get("port") == 9400, "Service port 'metrics' 9400")

for sm in by_kind.get("ServiceMonitor", []):
    sel = sm["spec"]["selector"]["matchLabels"]
    labels = svc["metadata"]["labels"]
    need(all(labels.get(k) == v for k, v in sel.items()), "ServiceMonitor selector matches the Service")
    need(all(e["port"] in ports for e in sm["spec"]["endpoints"]), "ServiceMonitor port names exist on the Service")
    need(sm["metadata"].get("namespace") == svc["metadata"]["namespace"], "ServiceMonitor in the Service's namespace")
    # The agent's pod/namespace/container labels (kubelet attribution) must not become
    # exported_pod, ...: Prometheus keeps them only with honorLabels.
    need(all(e.get("honorLabels") is True for e in sm["spec"]["endpoints"]),
         "ServiceMonitor endpoints with honorLabels: true (pod/namespace/container attribution)")

rules = by_kind.get("PrometheusRule", [])
if rules:
    with open(sys.argv[2], "w") as f:
        yaml.safe_dump({"groups": rules[0]["spec"]["groups"]}, f)

if errors:
    print("rendered manifests miss: " + "; ".join(errors))
    sys.exit(1)
print(f"checked {len(docs)} objects: " + ", ".join(sorted(by_kind)))
