#!/usr/bin/env python3
"""What the per-job GPU reports cost: memory, disk and start time for 10,000 kept reports, and
NVML calls per poll with and without them.

Each run starts the agent on a simulated one-GPU node (a process of this script's user on it,
so that each poll folds a report) with STATE_DIRECTORY holding a jobs.jsonl of N generated
reports, polls for --seconds, and stops it with SIGTERM (which writes the file again). Measured:

- load: from process start to the "job reports read back" log line, minus the same for an
  empty state directory (the reports are read on the reclaim actor's blocking thread);
- memory: VmRSS after the polls, minus the same for an empty state directory; VmHWM (peak,
  which includes the file's bytes while it is parsed);
- disk: the bytes of jobs.jsonl as the agent writes it at shutdown (N kept, at most 10,000);
- NVML calls per poll (the simulator's NVML_SIM_STATS, two snapshots apart; every tier at
  every poll, so that each poll makes the same calls) with [accounting] enabled = false (no
  report is folded) and true, compared function by function.

Shapes: "1gpu" (one GPU, no XID, condition or reclaim step: most jobs) and "8gpu" (eight GPUs,
two XIDs, one condition, one reclaim step).

Usage: cargo build --release --workspace && python3 benches/job_reports.py [--reports 10000]
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone

# Called once per GPU at every poll (the fast tier's power reading).
ANCHOR = "nvmlDeviceGetPowerUsage"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIO = """version = 1
[[gpu]]
model = "H100-SXM5-80GB"
power_w = 300.0
gpu_util_percent = 60
[[gpu.process]]
pid = {pid}
used_memory_mib = 1000
sm_util_percent = 60
"""


def rfc3339(t):
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def report(i, shape, now):
    """One report as the agent serializes it (src/reclaim/jobs/mod.rs)."""
    last = now - timedelta(seconds=i * 30)  # all within the 7 days kept
    first = last - timedelta(hours=2)
    ngpus = 8 if shape == "8gpu" else 1
    gpus = [{
        "index": g, "uuid": f"GPU-{g:08x}-1111-2222-3333-{i:012x}",
        "model": "NVIDIA H100 80GB HBM3", "held_seconds": 7200.0, "busy_seconds": 4320.5,
        "sampled_seconds": 7170.0, "sm_utilization": {"mean": 0.6025, "max": 0.98},
        "memory_used_bytes": {"max": 71_000_000_000}, "energy_joules": 2_160_000.25,
    } for g in range(ngpus)]
    r = {
        "kind": "slurm_job", "id": str(1_000_000 + i), "gpus": gpus,
        "first_seen": rfc3339(first), "last_seen": rfc3339(last),
        "held_seconds": 7200.0 * ngpus, "busy_seconds": 4320.5 * ngpus,
        "sampled_seconds": 7170.0 * ngpus,
        "sm_utilization": {"mean": 0.6025, "max": 0.98},
        "memory_used_bytes": {"max": 71_000_000_000}, "energy_joules": 2_160_000.25 * ngpus,
        "xids": [], "conditions": [], "reclaim_actions": [],
    }
    if shape == "8gpu":
        u = gpus[0]["uuid"]
        r["xids"] = [{"xid": x, "gpu": 0, "uuid": u, "time": rfc3339(first),
                      "last": rfc3339(last), "count": 3} for x in (13, 31)]
        r["conditions"] = [{"condition": "xid_13", "gpu": 0, "uuid": u, "severity": "warn",
                            "since": rfc3339(first), "last": rfc3339(last),
                            "reason": "XID 13 (Graphics Engine Exception) seen 3 time(s) in "
                                      "the last 10m"}]
        r["reclaim_actions"] = [{"time": rfc3339(last), "step": "warn", "action": "log",
                                 "dry_run": True, "gpu": 0, "uuid": u, "pids": [4242]}]
    return json.dumps(r, separators=(",", ":"))


def get(port, path):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    chunks = []
    while True:
        b = s.recv(65536)
        if not b:
            break
        chunks.append(b)
    s.close()
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def metric(body, name):
    m = re.search(rb"^" + name.encode() + rb"(?:\{[^}]*\})? (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def run(args, reports, shape, accounting=True):
    tmp = tempfile.mkdtemp()
    state = os.path.join(tmp, "state")
    os.mkdir(state)
    now = datetime.now(timezone.utc)
    if reports:
        with open(os.path.join(state, "jobs.jsonl"), "w") as f:
            for i in range(reports):
                f.write(report(i, shape, now) + "\n")
    scenario = os.path.join(tmp, "scenario.toml")
    with open(scenario, "w") as f:
        f.write(SCENARIO.format(pid=os.getpid()))
    config = os.path.join(tmp, "config.toml")
    with open(config, "w") as f:
        # Every tier at every poll: each poll makes the same calls, so that the counts compare
        # exactly between runs.
        i = args.interval
        f.write(f"[poller]\ninterval = \"{i}\"\nslow_interval = \"{i}\"\n"
                f"expensive_interval = \"{i}\"\nprofiling_interval = \"{i}\"\n"
                f"[accounting]\nenabled = {'true' if accounting else 'false'}\n")
    stats = os.path.join(tmp, "stats.json")
    exe = os.path.join(ROOT, "target", args.profile, "gpu-steward")
    lib = os.path.join(ROOT, "target", args.profile, "libnvml_sim.so")
    env = dict(os.environ, NVML_SIM_SCENARIO=scenario, NVML_SIM_STATS=stats,
               STATE_DIRECTORY=state, RUST_LOG="info")
    env.pop("GPU_STEWARD_LISTEN", None)
    start = time.monotonic()
    p = subprocess.Popen([exe, "run", "--listen", "127.0.0.1:0", "--interval", args.interval,
                          "--nvml-lib", lib, "--config", config], env=env,
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    port, loaded_ms, kept = None, None, None
    for line in p.stderr:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
        if "job reports read back" in line:
            loaded_ms = (time.monotonic() - start) * 1000
            kept = int(re.search(r"reports=(\d+)", line).group(1))
        if port and (loaded_ms or not accounting):
            break
    # The rest of the log is drained, so that the agent never blocks on a full pipe.
    drain = subprocess.Popen(["cat"], stdin=p.stderr, stdout=subprocess.DEVNULL)
    time.sleep(args.seconds / 2)
    polls_a = metric(get(port, "/metrics")[1], "gpu_steward_polls_total")
    time.sleep(1.2)  # the simulator rewrites its stats at most once a second
    with open(stats) as f:
        calls_a = json.load(f)
    time.sleep(args.seconds / 2)
    polls_b = metric(get(port, "/metrics")[1], "gpu_steward_polls_total")
    time.sleep(1.2)
    with open(stats) as f:
        calls_b = json.load(f)
    status = open(f"/proc/{p.pid}/status").read()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    p.send_signal(signal.SIGTERM)
    code = p.wait(timeout=30)
    drain.wait(timeout=5)
    path = os.path.join(state, "jobs.jsonl")
    size = os.path.getsize(path) if os.path.exists(path) else 0
    lines = sum(1 for _ in open(path)) if size else 0
    if reports:
        assert kept == reports, f"read back {kept} of {reports}: the generator is wrong"
        assert not os.path.exists(path + ".damaged"), "the agent set the file aside"
    # The stats file is written at most once a second, out of step with the polls: the polls
    # between the two snapshots are counted by a call each poll makes once on the one GPU.
    polls = calls_b[ANCHOR] - calls_a.get(ANCHOR, 0)
    assert abs(polls - (polls_b - polls_a)) <= 2, (polls, polls_b - polls_a)
    per_poll = sum(calls_b[k] - calls_a.get(k, 0) for k in calls_b) / polls
    return dict(loaded_ms=loaded_ms, rss=rss, hwm=hwm, size=size, lines=lines, code=code,
                per_poll=per_poll, per_fn={k: (calls_b[k] - calls_a.get(k, 0)) / polls
                                           for k in calls_b})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reports", type=int, default=10_000)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--interval", default="1s")
    ap.add_argument("--profile", default="release")
    args = ap.parse_args()
    off = run(args, 0, "1gpu", accounting=False)
    empty = run(args, 0, "1gpu")
    rows = {shape: run(args, args.reports, shape) for shape in ("1gpu", "8gpu")}
    print("| run | reports read back | load (start to read back, minus empty) | VmRSS (minus empty) "
          "| VmHWM | jobs.jsonl written at shutdown | NVML calls per poll |")
    print("|---|---|---|---|---|---|---|")
    print(f"| [accounting] enabled = false | - | - | {off['rss']:.1f} MiB | {off['hwm']:.1f} MiB "
          f"| - | {off['per_poll']:g} |")
    print(f"| enabled, empty state directory | 0 | ({empty['loaded_ms']:.0f} ms to the line) | "
          f"{empty['rss']:.1f} MiB | {empty['hwm']:.1f} MiB | {empty['size']} bytes, "
          f"{empty['lines']} report(s) | {empty['per_poll']:g} |")
    for shape, r in rows.items():
        print(f"| enabled, {args.reports} reports, {shape} | {args.reports} | "
              f"{r['loaded_ms'] - empty['loaded_ms']:.0f} ms | {r['rss']:.1f} MiB "
              f"(+{r['rss'] - empty['rss']:.1f} MiB) | {r['hwm']:.1f} MiB | "
              f"{r['size']:,} bytes ({r['size'] / max(r['lines'], 1):.0f} per report), "
              f"{r['lines']} reports | {r['per_poll']:g} |")
    print("\nNVML calls per poll that differ from [accounting] enabled = false, per function:")
    for label, r in [("empty", empty)] + list(rows.items()):
        keys = set(r["per_fn"]) | set(off["per_fn"])
        diff = {k: (r["per_fn"].get(k, 0), off["per_fn"].get(k, 0)) for k in keys}
        diff = {k: v for k, v in diff.items() if abs(v[0] - v[1]) > 0.01}
        print(f"- {label}: " + (", ".join(f"`{k}` {a:g} vs {b:g}"
                                          for k, (a, b) in sorted(diff.items())) or "none"))


if __name__ == "__main__":
    sys.exit(main())
