#!/usr/bin/env bash
# CI for everything users install: alert rules (promtool), Kubernetes manifests (kubectl
# kustomize + schema validation), the .deb (build, lintian, install, demo, purge), and the
# real-hardware check (benches/real-check, run --quick against the simulator). Called by
# .ci/run as `bash packaging/ci.sh`; each script installs what it needs on a fresh Debian machine
# as root (apt-get, pip into a venv, cargo install cargo-deb). The end-to-end test with a real
# Prometheus (tests/e2e_prometheus.rs) runs with `cargo test --workspace`, not here.
set -euo pipefail
cd "$(dirname "$0")/.."

run() {
  local start=$SECONDS
  echo "=== $1"
  bash "$1"
  echo "=== $1: passed in $((SECONDS - start)) s"
}
run alerts/test.sh
run packaging/kubernetes/test.sh
run packaging/deb/test.sh
run benches/real-check/test.sh
echo "packaging: all passed"
