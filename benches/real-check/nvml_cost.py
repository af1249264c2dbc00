#!/usr/bin/env python3
# Provenance: a copy (unchanged but for these three lines) of the script that measured the real
# H100 on 2026-11-22 (its captures: nvml-sim/tests/data/real-h100/; its figures: BENCHMARKS.md).
# real-check.sh runs it (needs pynvml); it only reads NVML.
"""What each NVML call the agent makes per poll costs on this machine: wall time and the
process's CPU time, median of REPS calls. usage: nvml_cost.py OUT.json [REPS]"""
import json, sys, time
import pynvml as N
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 20
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
calls = {
    "UtilizationRates": lambda: N.nvmlDeviceGetUtilizationRates(h),
    "MemoryInfo_v2": lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2),
    "BAR1MemoryInfo": lambda: N.nvmlDeviceGetBAR1MemoryInfo(h),
    "Temperature": lambda: N.nvmlDeviceGetTemperature(h, 0),
    "FieldValues_82_230": lambda: N.nvmlDeviceGetFieldValues(h, [82, 230]),
    "PowerUsage": lambda: N.nvmlDeviceGetPowerUsage(h),
    "PowerManagementLimit": lambda: N.nvmlDeviceGetPowerManagementLimit(h),
    "EnforcedPowerLimit": lambda: N.nvmlDeviceGetEnforcedPowerLimit(h),
    "TotalEnergyConsumption": lambda: N.nvmlDeviceGetTotalEnergyConsumption(h),
    "ClockInfo_SM": lambda: N.nvmlDeviceGetClockInfo(h, 1),
    "ClockInfo_MEM": lambda: N.nvmlDeviceGetClockInfo(h, 2),
    "CurrentClocksThrottleReasons": lambda: N.nvmlDeviceGetCurrentClocksThrottleReasons(h),
    "PcieThroughput_TX": lambda: N.nvmlDeviceGetPcieThroughput(h, 0),
    "PcieReplayCounter": lambda: N.nvmlDeviceGetPcieReplayCounter(h),
    "CurrPcieLinkGeneration": lambda: N.nvmlDeviceGetCurrPcieLinkGeneration(h),
    "CurrPcieLinkWidth": lambda: N.nvmlDeviceGetCurrPcieLinkWidth(h),
    "EncoderUtilization": lambda: N.nvmlDeviceGetEncoderUtilization(h),
    "DecoderUtilization": lambda: N.nvmlDeviceGetDecoderUtilization(h),
    "EccMode": lambda: N.nvmlDeviceGetEccMode(h),
    "TotalEccErrors": lambda: N.nvmlDeviceGetTotalEccErrors(h, 0, 0),
    "RemappedRows": lambda: N.nvmlDeviceGetRemappedRows(h),
    "MigMode": lambda: N.nvmlDeviceGetMigMode(h),
    "ComputeRunningProcesses": lambda: N.nvmlDeviceGetComputeRunningProcesses(h),
    "GraphicsRunningProcesses": lambda: N.nvmlDeviceGetGraphicsRunningProcesses(h),
    "ProcessUtilization": lambda: N.nvmlDeviceGetProcessUtilization(h, 0),
    "NumFans": lambda: N.nvmlDeviceGetNumFans(h),
    "HandleByIndex": lambda: N.nvmlDeviceGetHandleByIndex(0),
    "DeviceGetCount": lambda: N.nvmlDeviceGetCount(),
}
out = {}
for name, f in calls.items():
    walls, cpus, res = [], [], None
    for _ in range(REPS):
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            f(); res = "ok"
        except N.NVMLError as e:
            res = type(e).__name__
        walls.append(time.perf_counter() - w0); cpus.append(time.process_time() - c0)
    walls.sort(); cpus.sort()
    out[name] = {"result": res, "wall_us": round(walls[REPS // 2] * 1e6, 1), "cpu_us": round(cpus[REPS // 2] * 1e6, 1),
                 "wall_max_us": round(walls[-1] * 1e6, 1)}
# GPM: one sample pair and metrics get
try:
    s1, s2 = N.nvmlGpmSampleAlloc(), N.nvmlGpmSampleAlloc()
    walls, cpus = [], []
    for _ in range(REPS):
        c0, w0 = time.process_time(), time.perf_counter()
        N.nvmlGpmSampleGet(h, s2)
        walls.append(time.perf_counter() - w0); cpus.append(time.process_time() - c0)
    walls.sort(); cpus.sort()
    out["GpmSampleGet"] = {"result": "ok", "wall_us": round(walls[REPS // 2] * 1e6, 1), "cpu_us": round(cpus[REPS // 2] * 1e6, 1)}
except Exception as e:
    out["GpmSampleGet"] = {"result": repr(e)}
# MIG profile table and placements (read-only; MIG mode is not changed)
mig = {}
for p in range(0, 15):
    try:
        info = N.nvmlDeviceGetGpuInstanceProfileInfo(h, p)
        row = {f[0]: getattr(info, f[0]) for f in info._fields_ if not f[0].startswith("name")}
        try:
            iv = N.nvmlDeviceGetGpuInstanceProfileInfoV(h, p)
            row["name"] = iv.name.decode() if isinstance(iv.name, bytes) else str(iv.name)
        except Exception as e:
            row["name_err"] = repr(e)
        try:
            import ctypes
            arr = (N.c_nvmlGpuInstancePlacement_t * 16)()
            cnt = ctypes.c_uint(16)
            N.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, ctypes.byref(cnt))
            row["placements"] = [(arr[i].start, arr[i].size) for i in range(cnt.value)]
        except Exception as e:
            row["placements_err"] = repr(e)
        mig[p] = row
    except N.NVMLError as e:
        mig[p] = type(e).__name__
out["mig_profiles"] = mig
json.dump(out, open(sys.argv[1], "w"), indent=1)
for k, v in out.items():
    if k != "mig_profiles":
        print("%-30s %-22s wall %9s us  cpu %9s us" % (k, v.get("result"), v.get("wall_us"), v.get("cpu_us")))
for p, r in mig.items():
    print("mig", p, r)
