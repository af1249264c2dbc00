#!/usr/bin/env bash
# Lints the alert rules and runs their unit tests with promtool; also checks that every rule has
# a firing and a non-firing test and a section in docs/runbook.md. Run as root on a fresh Debian
# machine: it installs promtool (Debian package 'prometheus') if missing.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v promtool >/dev/null 2>&1; then
  echo "--- alerts: installing prometheus (for promtool)"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends prometheus
fi

echo "--- alerts: promtool check rules"
promtool check rules alerts/*.rules.yml
echo "--- alerts: promtool test rules"
promtool test rules alerts/tests/*.yml

echo "--- alerts: every rule is tested both ways and has a runbook section"
missing=0
for rules in alerts/gpu-steward.rules.yml alerts/gpu-steward-operations.rules.yml \
    alerts/gpu-steward-nvlink.rules.yml; do
for alert in $(sed -n 's/^ *- alert: *//p' "$rules"); do
  # A test is "not firing" when its exp_alerts is [], "firing" otherwise; look at the line that
  # follows each `alertname:` line of this alert.
  quiet=$(grep -h -A1 "alertname: $alert\$" alerts/tests/*.yml | grep -c 'exp_alerts: \[\]' || true)
  firing=$(grep -h -A1 "alertname: $alert\$" alerts/tests/*.yml | grep -c 'exp_alerts:$' || true)
  anchor=$(echo "$alert" | tr '[:upper:]' '[:lower:]')
  if [ "$quiet" -eq 0 ] || [ "$firing" -eq 0 ]; then
    echo "  $alert: $firing firing and $quiet non-firing tests; need at least one of each"; missing=1
  fi
  if ! grep -q "^## $alert\$" docs/runbook.md; then
    echo "  $alert: no '## $alert' section in docs/runbook.md"; missing=1
  fi
  if ! grep -q "runbook: \"docs/runbook.md#$anchor\"" "$rules"; then
    echo "  $alert: its runbook annotation is not docs/runbook.md#$anchor"; missing=1
  fi
done
done
[ "$missing" -eq 0 ] || { echo "alerts: FAILED"; exit 1; }
echo "alerts: OK"
