#!/usr/bin/env bash
# Real-hardware check of gpu-steward on a node with NVIDIA GPUs: the agent against the node's own
# driver, its values SIDE BY SIDE with nvidia-smi per GPU, per-process memory under load, poll
# cost, CPU and RSS at 1 s and 100 ms polls, scrape rate, the NVML memory floor, and the tutorial
# exporter for comparison. See docs/real-hardware.md.
#
# READ-ONLY on the GPU: it never changes MIG mode, compute mode, clocks, power limits,
# persistence or time-slicing, and never resets a GPU; nvidia-smi is only asked --query-*, -q
# and -L. The load phase (torch, --quick skips it) runs GPU work on GPU 0 for 75 s, and only when
# GPU 0 runs no other compute process and has 26 GiB free.
#
# usage: real-check.sh [--agent PATH] [--nvml-lib PATH] [--config FILE] [--out DIR] [--quick]
#                      [--no-load] [--strict]
#   --agent PATH     gpu-steward to run (default: ./gpu-steward beside this script, else
#                    target/release/gpu-steward of the checkout it sits in, else PATH)
#   --nvml-lib PATH  NVML library for the agent and the NVML helpers (default: the system's
#                    libnvidia-ml.so.1); nvidia-smi always uses the system driver
#   --config FILE    agent config (default: one with only [metrics] profile = "full", so that
#                    every value is compared and /etc/gpu-steward/config.toml of an
#                    installed package does not change what is measured)
#   --out DIR        results (default $OUT, else ./real-check-out): DIR/r and DIR/real.tar.gz
#   --quick          short windows; skips the torch load, the NVML capture, wrk and the
#                    tutorial exporter
#   --no-load        skips the torch load phase only
#   --strict         exit 1 when a value disagrees with nvidia-smi or the agent exits non-zero
# Exit codes: 0 done (findings are in the output), 1 findings with --strict, 2 the check could not
# run (no agent, no NVML library, the agent did not start).
#
# Started from the script of the real H100 run in BENCHMARKS.md; the helper scripts beside it
# are copies of that run's scripts (see their headers) plus agent_meter.py
# and side_by_side.py. Optional: nvidia-smi, python3 modules pynvml / prometheus_client / torch,
# wrk (here or on PATH, with its libraries in lib/), gcc; each missing one skips its part, loudly.
set -euo pipefail
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

D=$(cd "$(dirname "$0")" && pwd)
AGENT="" NVML_LIB="" CONFIG="" QUICK=0 LOAD=1 STRICT=0
OUT_DIR=${OUT:-$PWD/real-check-out}

die() { echo "real-check: $*" >&2; exit 2; }
usage() { sed -n '/^# usage:/,/^# Exit codes/p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --agent) [ $# -ge 2 ] || die "--agent needs a PATH"; AGENT=$2; shift 2 ;;
    --nvml-lib) [ $# -ge 2 ] || die "--nvml-lib needs a PATH"; NVML_LIB=$2; shift 2 ;;
    --config) [ $# -ge 2 ] || die "--config needs a FILE"; CONFIG=$2; shift 2 ;;
    --out) [ $# -ge 2 ] || die "--out needs a DIR"; OUT_DIR=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --no-load) LOAD=0; shift ;;
    --strict) STRICT=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown option '$1'" ;;
  esac
done

# ---------- what to run ----------
if [ -z "$AGENT" ]; then
  for c in "$D/gpu-steward" "$D/../../target/release/gpu-steward"; do
    if [ -x "$c" ]; then AGENT=$c; break; fi
  done
  [ -n "$AGENT" ] || AGENT=$(command -v gpu-steward || true)
  [ -n "$AGENT" ] || die "no gpu-steward: copy the binary next to this script, build the checkout \
(cargo build --release --workspace) or pass --agent PATH"
fi
[ -x "$AGENT" ] || die "--agent '$AGENT' is not an executable file"
AGENT=$(cd "$(dirname "$AGENT")" && pwd)/$(basename "$AGENT")
if [ -z "$NVML_LIB" ]; then
  NVML_LIB=$(ldconfig -p 2>/dev/null | awk '/libnvidia-ml\.so\.1 / {print $NF; exit}' || true)
  if [ -z "$NVML_LIB" ]; then
    for c in /usr/local/nvidia/lib64/libnvidia-ml.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 \
             /usr/lib64/libnvidia-ml.so.1 /usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1; do
      if [ -e "$c" ]; then NVML_LIB=$c; break; fi
    done
  fi
  [ -n "$NVML_LIB" ] || die "no libnvidia-ml.so.1 (is the NVIDIA driver installed?); pass --nvml-lib PATH"
fi
[ -f "$NVML_LIB" ] || die "--nvml-lib '$NVML_LIB' is not a file"
NVML_LIB=$(cd "$(dirname "$NVML_LIB")" && pwd)/$(basename "$NVML_LIB")
[ -z "$CONFIG" ] || [ -f "$CONFIG" ] || die "--config '$CONFIG' does not exist"

R=$OUT_DIR/r
rm -rf "$R"
mkdir -p "$R"
TMP=$(mktemp -d)
# pynvml and nvml_min load "libnvidia-ml.so.1": this folder makes that name the chosen library.
mkdir -p "$TMP/nvml"
ln -s "$NVML_LIB" "$TMP/nvml/libnvidia-ml.so.1"
NVML_PATH="$TMP/nvml${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -z "$CONFIG" ]; then
  CONFIG=$R/empty-config.toml
  # The full metrics profile: the side-by-side compares every value the agent reads with
  # nvidia-smi, and the lean default serves each value once (native copies left out).
  printf '%s\n' "# real-check.sh: built-in defaults but the full metrics profile; flags set listen," \
    "# interval and the NVML library" "[metrics]" 'profile = "full"' > "$CONFIG"
fi
if [ "$QUICK" = 1 ]; then
  WARM=2 IDLE_S=4 LOAD=0 FAST_WARM=1 FAST_S=3 FLOOR_S=2  # a smoke run: rough figures
else
  WARM=4 IDLE_S=30 FAST_WARM=5 FAST_S=20 FLOOR_S=5
fi

# ---------- children: every process started here is stopped on the way out ----------
PIDS=()
FINDINGS=0
forget() {  # PID: no longer ours to stop (reaped; its number may be reused)
  local p keep=()
  for p in ${PIDS[@]+"${PIDS[@]}"}; do [ "$p" = "$1" ] || keep+=("$p"); done
  PIDS=(${keep[@]+"${keep[@]}"})
}
stop_pid() {  # PID: SIGTERM, up to 10 s, then SIGKILL; returns its exit code
  local pid=$1 rc=0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "real-check: pid $pid ignored SIGTERM for 10 s; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || rc=$?
  forget "$pid"
  return "$rc"
}
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  set +e
  for p in ${PIDS[@]+"${PIDS[@]}"}; do stop_pid "$p"; done
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'echo "real-check: interrupted" >&2; exit 130' INT TERM

T0=$(date +%s)
say() { echo "== $* (+$(( $(date +%s) - T0 )) s)"; }
note() { echo "$*" | tee -a "$R/summary.txt"; }
skip() { note "-- skipped: $*"; }
meter() { python3 "$D/agent_meter.py" "$@"; }
nvml_py() { LD_LIBRARY_PATH=$NVML_PATH python3 "$@"; }
has_py() { python3 -c "import $1" >/dev/null 2>&1; }

AGENT_PID="" PORT=""
start_agent() {  # INTERVAL LOGFILE
  # The readiness waiter starts first (python's start-up must not count as the agent's), then
  # the agent; they meet through files in $hs (agent_meter.py wait_port).
  local hs=$TMP/start-$1 m started
  rm -rf "$hs"
  mkdir -p "$hs"
  : > "$2"
  meter port --log "$2" --ready --handshake "$hs" --timeout 30 > "$hs/out" &
  m=$!
  PIDS+=("$m")
  for _ in $(seq 1 1000); do
    if [ -e "$hs/up" ] || ! kill -0 "$m" 2>/dev/null; then break; fi
    sleep 0.01
  done
  date +%s.%N > "$hs/since"
  "$AGENT" run --config "$CONFIG" --listen 127.0.0.1:0 --interval "$1" --nvml-lib "$NVML_LIB" \
    --log-format json --log-level "info,gpu_steward=debug" > "$2" 2>&1 &
  AGENT_PID=$!
  PIDS+=("$AGENT_PID")
  echo "$AGENT_PID" > "$hs/pid"
  if ! wait "$m"; then
    forget "$m"
    tail -n 20 "$2" >&2
    die "the agent did not start or never became ready (its log above, in $2)"
  fi
  forget "$m"
  started=$(cat "$hs/out")
  PORT=${started% *}
  note "agent $1: pid $AGENT_PID, port $PORT, /readyz 200 ${started#* } s after start"
}
stop_agent() {
  local rc=0
  stop_pid "$AGENT_PID" || rc=$?
  note "agent exit code on SIGTERM: $rc"
  if [ "$rc" != 0 ]; then FINDINGS=$((FINDINGS + 1)); fi
}

# ---------- tools ----------
HAVE_SMI=0 HAVE_PYNVML=0 HAVE_PROM=0 HAVE_TORCH=0 WRK="" HAVE_GCC=0
command -v nvidia-smi >/dev/null 2>&1 && HAVE_SMI=1
nvml_py -c "import pynvml; pynvml.nvmlInit()" >/dev/null 2>&1 && HAVE_PYNVML=1
has_py prometheus_client && HAVE_PROM=1
command -v gcc >/dev/null 2>&1 && HAVE_GCC=1
if [ -x "$D/wrk" ]; then WRK=$D/wrk; else WRK=$(command -v wrk || true); fi
if [ "$LOAD" = 1 ] && python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    >/dev/null 2>&1; then HAVE_TORCH=1; fi

say "env"
note "agent: $AGENT ($("$AGENT" --version 2>&1 || echo 'no --version'))"
note "nvml library: $NVML_LIB"
note "results: $R"
{
  date -u +%FT%TZ; uname -a; head -2 /etc/os-release 2>/dev/null; nproc
  grep -m1 'model name' /proc/cpuinfo; python3 --version
  [ "$HAVE_SMI" = 1 ] && nvidia-smi -L
  ldconfig -p 2>/dev/null | grep -i nvidia-ml
  ldd "$AGENT"
} > "$R/env.txt" 2>&1 || true
[ "$HAVE_SMI" = 1 ] || skip "nvidia-smi not found: no side-by-side comparison"
[ "$HAVE_PYNVML" = 1 ] || skip "python3 cannot import pynvml (nvidia-ml-py) or init NVML: no NVML capture, no per-call cost, no tutorial exporter"
[ "$HAVE_PROM" = 1 ] || skip "python3 cannot import prometheus_client: no tutorial exporter"
if [ "$QUICK" = 1 ]; then skip "--quick: no torch load phase, NVML capture, wrk or tutorial exporter"
elif [ "$LOAD" = 0 ]; then skip "--no-load: no torch load phase"
elif [ "$HAVE_TORCH" = 0 ]; then skip "torch with CUDA not importable: no load phase (no per-process series under load)"; fi
[ -n "$WRK" ] || [ "$QUICK" = 1 ] || skip "wrk not found (here or on PATH): no scrape throughput"
[ "$HAVE_GCC" = 1 ] || skip "gcc not found: no NVML memory floor (nvml_min.c)"

if [ "$HAVE_SMI" = 1 ]; then
  nvidia-smi -q > "$R/smi-q.txt" 2>&1 || note "nvidia-smi -q failed (see $R/smi-q.txt)"
fi

# ---------- nvidia-smi queries (read-only) ----------
SMI_WANT=index,uuid,name,pci.bus_id,driver_version,serial,utilization.gpu,utilization.memory,\
memory.total,memory.reserved,memory.used,memory.free,temperature.gpu,temperature.memory,power.draw,\
power.limit,enforced.power.limit,power.default_limit,clocks.sm,clocks.mem,clocks.gr,clocks.video,\
clocks.max.sm,clocks.max.mem,pcie.link.gen.current,pcie.link.width.current,pcie.link.gen.max,\
pcie.link.width.max,clocks_event_reasons.active,ecc.errors.corrected.volatile.total,\
ecc.errors.uncorrected.volatile.total,fan.speed
SMI_FIELDS=$SMI_WANT
smi_fields() {  # drops the fields this driver's nvidia-smi does not know, saying which
  if nvidia-smi --query-gpu="$SMI_WANT" --format=csv,nounits > /dev/null 2>&1; then return 0; fi
  local f ok=()
  for f in ${SMI_WANT//,/ }; do
    if nvidia-smi --query-gpu="$f" --format=csv,noheader > /dev/null 2>&1; then
      ok+=("$f")
    elif [ "$f" = clocks_event_reasons.active ] && \
         nvidia-smi --query-gpu=clocks_throttle_reasons.active --format=csv,noheader > /dev/null 2>&1; then
      ok+=(clocks_throttle_reasons.active)
    else
      note "nvidia-smi here has no field '$f': not compared"
    fi
  done
  SMI_FIELDS=$(IFS=,; echo "${ok[*]}")
}
smi_sample() {  # NAME: writes smi-NAME.csv and apps-NAME.csv
  nvidia-smi --query-gpu="$SMI_FIELDS" --format=csv,nounits > "$R/smi-$1.csv" 2>&1 ||
    note "nvidia-smi --query-gpu failed: $(head -c 300 "$R/smi-$1.csv")"
  nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,nounits \
    > "$R/apps-$1.csv" 2>&1 || note "nvidia-smi --query-compute-apps failed: $(head -c 300 "$R/apps-$1.csv")"
}
side_by_side() {  # NAME: nvidia-smi, a completed poll's /metrics, nvidia-smi again; compared
  smi_sample "$1-a"
  meter wait-poll --port "$PORT" --out "$R/metrics-$1.txt" || die "no poll completed (agent at port $PORT)"
  smi_sample "$1-b"
  local rc=0
  python3 "$D/side_by_side.py" "$R/metrics-$1.txt" "$R/smi-$1-a.csv" "$R/smi-$1-b.csv" \
    --apps "$R/apps-$1-a.csv" --apps "$R/apps-$1-b.csv" --json "$R/side-by-side-$1.json" --strict \
    | tee "$R/side-by-side-$1.txt" || rc=$?
  case "$rc" in
    0) ;;
    1) FINDINGS=$((FINDINGS + 1)) ;;
    *) note "side_by_side.py could not compare ($1): exit code $rc" ;;
  esac
  grep '^side-by-side:' "$R/side-by-side-$1.txt" | sed "s/^/$1 /" >> "$R/summary.txt" || true
}
[ "$HAVE_SMI" = 1 ] && smi_fields

# ---------- NVML capture (pynvml; full mode) ----------
if [ "$QUICK" = 0 ] && [ "$HAVE_PYNVML" = 1 ]; then
  say "NVML capture and per-call cost (pynvml)"
  nvml_py "$D/nvml_capture.py" "$R/capture-idle.json" > "$R/capture.log" 2>&1 ||
    note "nvml_capture.py failed (see $R/capture.log)"
  tail -n 1 "$R/capture.log"
  nvml_py "$D/nvml_cost.py" "$R/nvml-cost.json" > "$R/nvml-cost.txt" 2>&1 ||
    note "nvml_cost.py failed (see $R/nvml-cost.txt)"
  grep -E 'PcieThroughput|TotalEnergy|ProcessUtilization|GpmSampleGet' "$R/nvml-cost.txt" || true
fi

# ---------- the agent at 1 s, idle ----------
say "agent at 1s"
start_agent 1s "$R/agent-1s.log"
sleep "$WARM"
meter get --port "$PORT" --out-prefix "$R/idle-" /metrics /health /health/gpus /readyz /api/v1/events \
  | sed 's/^/idle /' | tee -a "$R/summary.txt"
grep -E '^gpu_steward_(nvml_errors_total|poll_source_success)' "$R/idle-metrics.txt" \
  | grep -vE 'poll_source_success\{[^}]*\} 1$' | sed 's/^/  /' | tee -a "$R/summary.txt" || true

if [ "$HAVE_SMI" = 1 ]; then
  say "side by side with nvidia-smi, idle"
  side_by_side idle
fi

SEED_PID=""
if [ "$QUICK" = 0 ] && [ "$HAVE_PYNVML" = 1 ] && [ "$HAVE_PROM" = 1 ]; then
  SEED_PORT=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
  LD_LIBRARY_PATH=$NVML_PATH python3 "$D/seed_exporter.py" "$SEED_PORT" 1 > "$R/seed.log" 2>&1 &
  SEED_PID=$!
  PIDS+=("$SEED_PID")
  sleep 3
  kill -0 "$SEED_PID" 2>/dev/null || { note "the tutorial exporter exited (see $R/seed.log)"; SEED_PID=""; }
fi

say "cost at 1s, idle (${IDLE_S} s)"
if [ -n "$SEED_PID" ]; then
  meter measure --pid "$SEED_PID" --seconds "$IDLE_S" --label "tutorial exporter, 1s, idle" \
    --json "$R/cost-seed-1s.json" > "$R/cost-seed-1s.txt" 2>&1 &
  SEED_METER=$!
  PIDS+=("$SEED_METER")
fi
meter measure --pid "$AGENT_PID" --port "$PORT" --log "$R/agent-1s.log" --seconds "$IDLE_S" \
  --interval 1s --label "gpu-steward, 1s poll, idle" --json "$R/cost-1s.json" | tee -a "$R/summary.txt" ||
  die "measuring the agent at 1s failed (above)"
if [ -n "$SEED_PID" ]; then
  wait "$SEED_METER" || note "measuring the tutorial exporter failed"
  forget "$SEED_METER"
  tee -a "$R/summary.txt" < "$R/cost-seed-1s.txt"
fi

# ---------- load (torch, full mode) ----------
if [ "$QUICK" = 0 ] && [ "$LOAD" = 1 ] && [ "$HAVE_TORCH" = 1 ]; then
  say "load on GPU 0"
  busy_apps=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader -i 0 2>/dev/null | grep -c . || true)
  free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits -i 0 2>/dev/null | head -1 || true)
  free_mib=${free_mib%%.*}
  if [ "${busy_apps:-0}" != 0 ]; then
    skip "load: GPU 0 already runs $busy_apps compute process(es); this check does not disturb them"
  elif ! [[ "$free_mib" =~ ^[0-9]+$ ]]; then
    skip "load: cannot read GPU 0's free memory from nvidia-smi ('$free_mib')"
  elif [ "$free_mib" -lt 26624 ]; then
    skip "load: GPU 0 has $free_mib MiB free, the load needs 26 GiB"
  else
    export CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0
    python3 "$D/load.py" busy 75 20 > "$R/load-busy.log" 2>&1 &
    L1=$!; PIDS+=("$L1")
    python3 "$D/load.py" idle 75 4 > "$R/load-idle.log" 2>&1 &
    L2=$!; PIDS+=("$L2")
    unset CUDA_DEVICE_ORDER CUDA_VISIBLE_DEVICES
    for _ in $(seq 1 120); do
      grep -q ready "$R/load-busy.log" && grep -q ready "$R/load-idle.log" && break; sleep 0.5
    done
    if grep -q ready "$R/load-busy.log" && grep -q ready "$R/load-idle.log"; then
      note "load: busy pid $L1 (bf16 matmul, 20 GB), idle pid $L2 (holds 4 GB)"
      sleep 8
      if [ "$HAVE_PYNVML" = 1 ]; then
        nvml_py "$D/nvml_capture.py" "$R/capture-load.json" >> "$R/capture.log" 2>&1 ||
          note "nvml_capture.py under load failed (see $R/capture.log)"
      fi
      meter measure --pid "$AGENT_PID" --port "$PORT" --log "$R/agent-1s.log" --seconds 15 \
        --interval 1s --label "gpu-steward, 1s poll, under load" --json "$R/cost-1s-load.json" \
        > "$R/cost-1s-load.txt" 2>&1 &
      LOAD_METER=$!
      PIDS+=("$LOAD_METER")
      say "side by side with nvidia-smi, under load"
      side_by_side load
      meter get --port "$PORT" --out-prefix "$R/load-" /health/gpus > /dev/null
      wait "$LOAD_METER" || note "measuring under load failed"
      forget "$LOAD_METER"
      tee -a "$R/summary.txt" < "$R/cost-1s-load.txt"
    else
      note "load: torch did not get ready in 60 s (see $R/load-*.log)"
    fi
    if [ -n "$WRK" ]; then
      say "scrape throughput (wrk, 5 s each)"
      for u in "http://127.0.0.1:$PORT/metrics" ${SEED_PID:+"http://127.0.0.1:$SEED_PORT/metrics"}; do
        echo "$u" >> "$R/wrk.txt"
        LD_LIBRARY_PATH=$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$WRK" -t2 -c16 -d5s "$u" >> "$R/wrk.txt" 2>&1 ||
          note "wrk failed on $u (see $R/wrk.txt)"
      done
      grep -E 'http|Requests/sec|Latency' "$R/wrk.txt" | tee -a "$R/summary.txt" || true
    fi
    stop_pid "$L1" || true
    stop_pid "$L2" || true
    sleep 6
    meter get --port "$PORT" --out-prefix "$R/after-load-" /metrics > /dev/null
  fi
elif [ -n "$WRK" ] && [ "$QUICK" = 0 ]; then
  say "scrape throughput (wrk, 5 s)"
  LD_LIBRARY_PATH=$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$WRK" -t2 -c16 -d5s "http://127.0.0.1:$PORT/metrics" \
    > "$R/wrk.txt" 2>&1 || note "wrk failed (see $R/wrk.txt)"
  grep -E 'Requests/sec|Latency' "$R/wrk.txt" | tee -a "$R/summary.txt" || true
fi
if [ -n "$SEED_PID" ]; then stop_pid "$SEED_PID" || true; fi
stop_agent

# ---------- the agent at 100 ms ----------
say "agent at 100ms (${FAST_S} s)"
start_agent 100ms "$R/agent-100ms.log"
sleep "$FAST_WARM"
meter measure --pid "$AGENT_PID" --port "$PORT" --log "$R/agent-100ms.log" --seconds "$FAST_S" \
  --interval 100ms --label "gpu-steward, 100ms poll, idle" --json "$R/cost-100ms.json" | tee -a "$R/summary.txt" ||
  die "measuring the agent at 100ms failed (above)"
meter get --port "$PORT" --out-prefix "$R/100ms-" /metrics > /dev/null
stop_agent
# Issue [18/22]: at most 0.7 ms of CPU per poll per Hopper GPU at a 100 ms poll (GPM on its own
# 5 s window; it was 2.7-2.9 ms with nvmlGpmMetricsGet at every poll). Also at 1 s, for the record.
GPUS=1
if [ "$HAVE_SMI" = 1 ]; then
  n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  if [ "${n:-0}" -gt 0 ] 2>/dev/null; then GPUS=$n; fi
fi
python3 - "$R/cost-100ms.json" "$R/cost-1s.json" "$GPUS" <<'PY' | tee -a "$R/summary.txt"
import json, sys
gpus = max(1, int(sys.argv[3] or 1))
for path, what in ((sys.argv[1], "100ms"), (sys.argv[2], "1s")):
    try:
        ms = json.load(open(path)).get("cpu_per_poll_ms")
    except (OSError, ValueError):
        ms = None
    if ms is None:
        print(f"per-poll CPU at {what}: not measured")
        continue
    per_gpu = ms / gpus
    verdict = ("" if what != "100ms" else
               f" (target <= 0.7 ms per Hopper GPU: {'PASS' if per_gpu <= 0.7 else 'FAIL'})")
    print(f"per-poll CPU at {what}: {ms:.3f} ms, {per_gpu:.3f} ms per GPU over {gpus} GPU(s){verdict}")
PY

# ---------- the NVML memory floor ----------
if [ "$HAVE_GCC" = 1 ]; then
  say "NVML memory floor (nvml_min.c, ${FLOOR_S} s)"
  if gcc -O2 -o "$TMP/nvml_min" "$D/nvml_min.c" -ldl 2> "$R/nvml_min-build.txt"; then
    if LD_LIBRARY_PATH=$NVML_PATH "$TMP/nvml_min" "$FLOOR_S" > "$R/nvml_min.txt" 2>&1; then
      note "nvml_min (loads NVML, reads 4 fields per GPU per second): $(awk '/^Vm(RSS|HWM):/ {printf "%s%s %.1f MiB", sep, $1, $2 / 1024; sep = ", "}' "$R/nvml_min.txt")"
    else
      note "nvml_min failed: $(tail -n 2 "$R/nvml_min.txt")"
    fi
  else
    note "gcc could not build nvml_min.c (see $R/nvml_min-build.txt)"
  fi
fi

say "summary"
cat "$R/summary.txt"
tar czf "$OUT_DIR/real.tar.gz" -C "$OUT_DIR" r
echo "results: $R, packed as $OUT_DIR/real.tar.gz"
if [ "$FINDINGS" -gt 0 ]; then
  echo "real-check: $FINDINGS finding(s): values that disagree with nvidia-smi, or an agent that exited non-zero (above)"
  [ "$STRICT" = 1 ] && exit 1
fi
exit 0
