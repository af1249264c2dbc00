#!/usr/bin/env python3
"""The NVML floor of the read tiers: what the NVML calls of each tier cost per second on the
8×H100 node (`tests/scenarios/dgx-h100.toml`) at given tier intervals, priced by the cost table
(`nvml-sim/costs/h100-driver-580.json`, real H100/H200 figures). Arithmetic, not a measurement:
it prints the floor no agent can go under with those tiers; `benches/poll_cost.py` measures the
agent against it.

The calls per GPU and run of each tier are those the simulator counted (`NVML_SIM_STATS`) on the
8×H100 node, release build, 1 s poll, 30 s window, 2026-11-26 (divided by GPUs and runs).

Usage: python3 benches/tier_floor.py [--poll 5] [--profiling 5] [--slow 10] [--expensive 30]
       [--gpus 8] [--cost FILE]
"""
import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_COST = os.path.join(ROOT, "nvml-sim", "costs", "h100-driver-580.json")

# Calls per GPU and run of the tier (src/gpu/reader.rs READS on an H100 without NVLink).
TIERS = {
    "fast": {
        "nvmlDeviceGetHandleByIndex_v2": 1, "nvmlDeviceGetClockInfo": 4,
        "nvmlDeviceGetUtilizationRates": 1, "nvmlDeviceGetTemperature": 1,
        "nvmlDeviceGetPowerUsage": 1, "nvmlDeviceGetMemoryInfo_v2": 1,
        "nvmlDeviceGetFieldValues": 1, "nvmlDeviceGetEnforcedPowerLimit": 1,
        "nvmlDeviceGetEncoderUtilization": 1, "nvmlDeviceGetDecoderUtilization": 1,
        "nvmlDeviceGetCurrentClocksThrottleReasons": 1, "nvmlDeviceGetCurrPcieLinkGeneration": 1,
        "nvmlDeviceGetComputeRunningProcesses_v3": 1.75,
        "nvmlDeviceGetGraphicsRunningProcesses_v3": 1,
    },
    "profiling": {"nvmlGpmSampleGet": 1, "nvmlGpmMetricsGet": 1},
    "slow": {
        "nvmlDeviceGetPowerManagementLimit": 1, "nvmlDeviceGetPcieReplayCounter": 1,
        "nvmlDeviceGetMigMode": 1, "nvmlDeviceGetEccMode": 1, "nvmlDeviceGetBAR1MemoryInfo": 1,
        "nvmlDeviceGetCurrPcieLinkWidth": 1, "nvmlDeviceGetComputeMode": 1,
        "nvmlDeviceGetTotalEccErrors": 4, "nvmlDeviceGetRemappedRows": 1,
    },
    "expensive": {
        "nvmlDeviceGetTotalEnergyConsumption": 1, "nvmlDeviceGetProcessUtilization": 1,
    },
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--poll", type=float, default=5.0)
    ap.add_argument("--profiling", type=float, default=5.0)
    ap.add_argument("--slow", type=float, default=10.0)
    ap.add_argument("--expensive", type=float, default=30.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--cost", default=DEFAULT_COST)
    a = ap.parse_args()
    with open(a.cost) as f:
        table = json.load(f)["functions"]

    def us(fn):
        c = table[fn]
        return c["cpu_us"] if c.get("cpu_us") is not None else c["wall_us"]

    every = {"fast": a.poll, "profiling": max(a.profiling, a.poll),
             "slow": max(a.slow, a.poll), "expensive": max(a.expensive, a.poll)}
    total = 0.0
    for tier, calls in TIERS.items():
        per_run = sum(n * us(fn) for fn, n in calls.items()) * a.gpus / 1000.0
        per_s = per_run / every[tier]
        total += per_s
        print(f"{tier:10} every {every[tier]:g} s: {per_run:6.2f} ms a run for {a.gpus} GPUs, "
              f"{per_s:5.2f} ms/s = {per_s / 10:.3f} % of a core")
    print(f"{'all':10} {total:5.2f} ms/s = {total / 10:.3f} % of a core")


if __name__ == "__main__":
    main()
