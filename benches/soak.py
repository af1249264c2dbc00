#!/usr/bin/env python3
"""Fault soak: the agent against a scenario rewritten at random, scraped all the while.

Every 200 ms the scenario changes at random: GPUs lost and back, NVML errors and NOT_SUPPORTED
on random functions, calls that hang for a while on one GPU (`delay_ms`), processes coming and
going, XID bursts, GPUs added and removed, and now and then a malformed file. Every 100 ms
`/livez`, `/readyz`, `/metrics` and `/health` are fetched. It fails (exit 1) when the agent
exits, `/livez` is not 200, a response is malformed, `/metrics` and `/health` disagree on the
GPU count for longer than a few polls, or resident memory keeps growing (the last quarter of the
run more than 10 % above the first quarter's maximum).

Usage: cargo build --release --workspace && python3 benches/soak.py [--seconds 180] [--seed N]
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUNCTIONS = [
    "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature", "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetEccMode", "nvmlDeviceGetRemappedRows", "nvmlGpmSampleGet", "nvmlDeviceGetUUID",
    "nvmlDeviceGetFieldValues", "nvmlDeviceGetPcieThroughput",
]
MODELS = ["H100-SXM5-80GB", "H200-SXM-141GB", "A100-SXM4-80GB", "L4", "T4"]


def gpu(rng, i, event_ids):
    lines = ["[[gpu]]", f'model = "{rng.choice(MODELS)}"', f'pci_bus_id = "00000000:{0x10 + i:02X}:00.0"']
    if rng.random() < 0.1:
        lines.append("lost = true")
    if rng.random() < 0.3:
        lines.append(f'errors = {{ {rng.choice(FUNCTIONS)} = "{rng.choice(["UNKNOWN", "TIMEOUT", "NOT_SUPPORTED"])}" }}')
    if rng.random() < 0.2:
        lines.append(f'unsupported = ["{rng.choice(FUNCTIONS)}"]')
    if rng.random() < 0.05:
        lines.append(f"delay_ms = {{ {rng.choice(FUNCTIONS)} = {rng.choice([300, 2000, 7000])} }}")
    lines.append(f"gpu_util_percent = {rng.randint(0, 100)}")
    lines.append(f"temperature_c = {rng.randint(30, 95)}")
    for _ in range(rng.randint(0, 3)):
        lines += ["[[gpu.process]]", f"pid = {rng.randint(1000, 60000)}",
                  f"used_memory_mib = {rng.randint(1, 4000)}", f"sm_util_percent = {rng.randint(0, 100)}"]
    for _ in range(rng.choice([0, 0, 0, 1, 3])):
        event_ids[i] = event_ids.get(i, 0) + 1
        lines += ["[[gpu.event]]", f"id = {event_ids[i]}", f"xid = {rng.choice([13, 31, 43, 48, 79, 94, 999])}"]
    return "\n".join(lines)


def scenario(rng, event_ids):
    if rng.random() < 0.03:
        return "version = 1\n[[gpu]]\nmodel = \"no such model\"\n"  # malformed: kept out
    n = rng.randint(1, 10)
    return "version = 1\n" + "\n".join(gpu(rng, i, event_ids) for i in range(n)) + "\n"


def fetch(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def metric(body, name):
    m = re.search(rb"^" + name.encode() + rb" (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=180)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--profile", default="release")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    exe = os.path.join(ROOT, "target", args.profile, "gpu-steward")
    lib = os.path.join(ROOT, "target", args.profile, "libnvml_sim.so")
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "scenario.toml")
    event_ids = {}
    open(path, "w").write(scenario(rng, event_ids).replace("no such model", "H100-SXM5-80GB"))
    env = dict(os.environ, NVML_SIM_SCENARIO=path, RUST_LOG="info")
    log = open(os.path.join(tmp, "agent.log"), "w")
    p = subprocess.Popen([exe, "run", "--listen", "127.0.0.1:0", "--interval", "100ms", "--nvml-lib", lib,
                          "--config", "/dev/null"], env=env, stderr=log)
    port = None
    for _ in range(200):
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", open(log.name).read())
        if m:
            port = int(m.group(1))
            break
        time.sleep(0.05)
    if port is None:
        p.kill()
        sys.exit("soak: the agent did not start")
    failures, rss, rewrites, scrapes, disagree_since = [], [], 0, 0, None
    start = time.monotonic()
    next_rewrite = start
    try:
        while time.monotonic() - start < args.seconds and not failures:
            now = time.monotonic()
            if now >= next_rewrite:
                tmpf = path + ".tmp"
                open(tmpf, "w").write(scenario(rng, event_ids))
                os.rename(tmpf, path)
                rewrites += 1
                next_rewrite = now + 0.2
            if p.poll() is not None:
                failures.append(f"the agent exited with {p.returncode}")
                break
            status, _ = fetch(port, "/livez")
            if status != 200:
                failures.append(f"/livez answered {status}")
            status, body = fetch(port, "/metrics")
            health_status, health = fetch(port, "/health")
            scrapes += 1
            if status != 200 or health_status not in (200, 503):
                failures.append(f"/metrics {status}, /health {health_status}")
                break
            try:
                h = json.loads(health)
            except ValueError:
                failures.append("/health is not JSON")
                break
            count = metric(body, "gpu_steward_gpus")
            if count is not None and h["agent"].get("gpuCount") != int(count):
                disagree_since = disagree_since or now
                if now - disagree_since > 1.0:
                    failures.append(f"/metrics says {count} GPUs, /health {h['agent'].get('gpuCount')}")
            else:
                disagree_since = None
            with open(f"/proc/{p.pid}/status") as f:
                rss.append(int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)))
            time.sleep(0.1)
    finally:
        p.send_signal(signal.SIGTERM)
        try:
            code = p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            code = "killed after 10 s"
    if code != 0 and not failures:
        failures.append(f"SIGTERM: exit {code}")
    q = max(1, len(rss) // 4)
    first, last = max(rss[:q] or [0]), max(rss[-q:] or [0])
    if first and last > first * 1.10:
        failures.append(f"memory grew: {first / 1024:.1f} MiB in the first quarter, {last / 1024:.1f} MiB in the last")
    print(f"soak: seed {args.seed}, {args.seconds} s, {rewrites} rewrites, {scrapes} scrape rounds, "
          f"RSS {first / 1024:.1f} -> {last / 1024:.1f} MiB (max of the first and last quarters)")
    for f in failures:
        print(f"soak: FAILED: {f}")
    print(f"soak: the agent's log is {log.name}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
