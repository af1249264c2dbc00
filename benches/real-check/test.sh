#!/usr/bin/env bash
# Smoke test of the real-hardware check on a machine without a GPU: real-check.sh --quick against
# the simulated NVML (libnvml_sim.so with tests/scenarios/dgx-h100.toml) and a stub nvidia-smi
# (testdata/nvidia-smi, first on PATH, answering for the same scenario). Passes when every value
# agrees with the stub, the agent exits 0 on SIGTERM, nvidia-smi was only asked to read, and
# side_by_side.py flags a planted disagreement. About 25 s after the release build. Called by
# packaging/ci.sh; installs python3 if missing (as root, on a fresh Debian machine).
set -euo pipefail
cd "$(dirname "$0")/../.."
export CARGO_TERM_COLOR=never PYTHONDONTWRITEBYTECODE=1

say() { echo "--- real-check: $*"; }
fail() { echo "real-check test: FAILED: $*" >&2; exit 1; }

if ! command -v python3 >/dev/null 2>&1; then
  say "apt-get install python3"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 >/dev/null
fi

say "static checks (bash -n, python3 compile, shellcheck when installed)"
bash -n benches/real-check/real-check.sh benches/real-check/test.sh
python3 - benches/poll_cost.py benches/real-check/*.py benches/real-check/testdata/nvidia-smi <<'PY'
import sys
for path in sys.argv[1:]:
    compile(open(path).read(), path, "exec")
PY
if command -v shellcheck >/dev/null 2>&1; then
  shellcheck benches/real-check/real-check.sh benches/real-check/test.sh
else
  echo "shellcheck not installed: skipped"
fi

say "cargo build --release --workspace (the agent and libnvml_sim.so)"
cargo build --release --workspace --quiet

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
say "real-check.sh --quick --strict against the simulator and the stub nvidia-smi"
start=$SECONDS
rc=0
PATH="$PWD/benches/real-check/testdata:$PATH" \
  NVML_SIM_SCENARIO="$PWD/tests/scenarios/dgx-h100.toml" \
  NVIDIA_SMI_STUB_LOG="$TMP/nvidia-smi-calls.txt" \
  bash benches/real-check/real-check.sh --quick --strict \
    --agent target/release/gpu-steward --nvml-lib target/release/libnvml_sim.so \
    --out "$TMP/out" > "$TMP/run.txt" 2>&1 || rc=$?
echo "real-check.sh exited $rc after $((SECONDS - start)) s"
if [ "$rc" != 0 ]; then
  cat "$TMP/run.txt"
  fail "real-check.sh --quick --strict exited $rc (1: findings, 2: could not run; output above)"
fi
R=$TMP/out/r
grep -q '^idle side-by-side: [0-9]* agree, 0 disagree, 0 not compared$' "$R/summary.txt" ||
  fail "side by side: $(grep 'side-by-side' "$R/summary.txt" || echo 'no comparison ran')"
grep -q 'gpu-steward, 1s poll, idle: CPU' "$R/summary.txt" || fail "no CPU figure at 1s"
grep -q 'gpu-steward, 100ms poll, idle: CPU' "$R/summary.txt" || fail "no CPU figure at 100ms"
grep -q '^per-poll CPU at 100ms: [0-9.]* ms, [0-9.]* ms per GPU over [0-9]* GPU(s) (target <= 0.7 ms per Hopper GPU: \(PASS\|FAIL\))$' "$R/summary.txt" ||
  fail "no per-poll CPU against the 0.7 ms target at 100ms"
grep -q 'nvml_min .*VmRSS' "$R/summary.txt" || fail "no NVML memory floor"
[ "$(grep -c 'agent exit code on SIGTERM: 0' "$R/summary.txt")" = 2 ] || fail "the agent did not exit 0 twice"
[ -s "$TMP/out/real.tar.gz" ] || fail "no real.tar.gz"
[ -s "$TMP/nvidia-smi-calls.txt" ] || fail "nvidia-smi was never called"
if grep -q '^REFUSED' "$TMP/nvidia-smi-calls.txt"; then
  fail "real-check.sh asked nvidia-smi for more than a read: $(grep '^REFUSED' "$TMP/nvidia-smi-calls.txt")"
fi
grep 'side-by-side' "$R/summary.txt"

say "side_by_side.py flags a disagreement"
sed 's/^\(3, GPU-[^,]*, [^,]*, [^,]*, [^,]*, [^,]*\), \([0-9]*\),/\1, 7,/' "$R/smi-idle-a.csv" > "$TMP/bad.csv"
! cmp -s "$R/smi-idle-a.csv" "$TMP/bad.csv" || fail "could not plant a disagreement in the CSV"
rc=0
python3 benches/real-check/side_by_side.py "$R/metrics-idle.txt" "$TMP/bad.csv" --strict > "$TMP/bad.txt" || rc=$?
[ "$rc" = 1 ] || { cat "$TMP/bad.txt"; fail "side_by_side.py --strict exited $rc on a planted disagreement (want 1)"; }
grep -q '^  GPU 3 utilization, GPU: nvidia-smi 7, gpu-steward 95' "$TMP/bad.txt" ||
  { cat "$TMP/bad.txt"; fail "the planted disagreement is not reported as such"; }
echo "real-check: smoke passed"
