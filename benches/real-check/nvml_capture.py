#!/usr/bin/env python3
# Provenance: a copy (unchanged but for these three lines) of the script that measured the real
# H100 on 2026-11-22 (its captures: nvml-sim/tests/data/real-h100/; its figures: BENCHMARKS.md).
# real-check.sh runs it (needs pynvml); it only reads NVML.
"""Ask an NVML library (a real driver or the simulator) a fixed list of questions about every GPU
and write what it answers, with each call's median latency, as JSON.

usage: nvml_capture.py OUT.json   (LD_LIBRARY_PATH decides which libnvidia-ml.so.1 pynvml loads)
"""
import ctypes, json, sys, time
import pynvml as N


def plain(v):
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, (int, float, str)) or v is None:
        return v
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, ctypes.Array):
        return [plain(x) for x in v]
    if type(v).__name__ == "nvmlFriendlyObject":
        return {k: plain(x) for k, x in vars(v).items()}
    if hasattr(v, "_fields_"):
        out = {}
        for f in v._fields_:
            name = f[0]
            try:
                out[name] = plain(getattr(v, name))
            except Exception as e:  # unions, pointers
                out[name] = "<%s>" % type(e).__name__
        return out
    if isinstance(v, ctypes._Pointer) or isinstance(v, ctypes.c_void_p):
        return "<ptr>"
    return repr(v)


def call(f, reps=5):
    times = []
    res = None
    for _ in range(reps):
        t = time.perf_counter()
        try:
            r = f()
            res = {"ok": plain(r)}
        except N.NVMLError as e:
            res = {"err": type(e).__name__, "code": getattr(e, "value", None)}
        except Exception as e:
            res = {"exc": "%s: %s" % (type(e).__name__, e)}
        times.append(time.perf_counter() - t)
    times.sort()
    res["us"] = round(times[len(times) // 2] * 1e6, 1)
    return res


def device_questions(h):
    q = {}
    q["GetName"] = lambda: N.nvmlDeviceGetName(h)
    q["GetUUID"] = lambda: N.nvmlDeviceGetUUID(h)
    q["GetSerial"] = lambda: N.nvmlDeviceGetSerial(h)
    q["GetPciInfo"] = lambda: N.nvmlDeviceGetPciInfo(h)
    q["GetIndex"] = lambda: N.nvmlDeviceGetIndex(h)
    q["GetMinorNumber"] = lambda: N.nvmlDeviceGetMinorNumber(h)
    q["GetBrand"] = lambda: N.nvmlDeviceGetBrand(h)
    q["GetArchitecture"] = lambda: N.nvmlDeviceGetArchitecture(h)
    q["GetCudaComputeCapability"] = lambda: N.nvmlDeviceGetCudaComputeCapability(h)
    q["GetMemoryInfo_v1"] = lambda: N.nvmlDeviceGetMemoryInfo(h)
    q["GetMemoryInfo_v2"] = lambda: N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    q["GetBAR1MemoryInfo"] = lambda: N.nvmlDeviceGetBAR1MemoryInfo(h)
    q["GetUtilizationRates"] = lambda: N.nvmlDeviceGetUtilizationRates(h)
    q["GetEncoderUtilization"] = lambda: N.nvmlDeviceGetEncoderUtilization(h)
    q["GetDecoderUtilization"] = lambda: N.nvmlDeviceGetDecoderUtilization(h)
    q["GetTemperature_GPU"] = lambda: N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)
    for t in range(0, 8):
        q["GetTemperatureThreshold_%d" % t] = (lambda t=t: N.nvmlDeviceGetTemperatureThreshold(h, t))
    q["GetPowerUsage"] = lambda: N.nvmlDeviceGetPowerUsage(h)
    q["GetPowerManagementLimit"] = lambda: N.nvmlDeviceGetPowerManagementLimit(h)
    q["GetPowerManagementDefaultLimit"] = lambda: N.nvmlDeviceGetPowerManagementDefaultLimit(h)
    q["GetPowerManagementLimitConstraints"] = lambda: N.nvmlDeviceGetPowerManagementLimitConstraints(h)
    q["GetEnforcedPowerLimit"] = lambda: N.nvmlDeviceGetEnforcedPowerLimit(h)
    q["GetPowerManagementMode"] = lambda: N.nvmlDeviceGetPowerManagementMode(h)
    q["GetPowerState"] = lambda: N.nvmlDeviceGetPowerState(h)
    q["GetPerformanceState"] = lambda: N.nvmlDeviceGetPerformanceState(h)
    q["GetTotalEnergyConsumption"] = lambda: N.nvmlDeviceGetTotalEnergyConsumption(h)
    for c in range(0, 4):
        q["GetClockInfo_%d" % c] = (lambda c=c: N.nvmlDeviceGetClockInfo(h, c))
        q["GetMaxClockInfo_%d" % c] = (lambda c=c: N.nvmlDeviceGetMaxClockInfo(h, c))
        q["GetApplicationsClock_%d" % c] = (lambda c=c: N.nvmlDeviceGetApplicationsClock(h, c))
        q["GetDefaultApplicationsClock_%d" % c] = (lambda c=c: N.nvmlDeviceGetDefaultApplicationsClock(h, c))
        for cid in range(0, 3):
            q["GetClock_%d_%d" % (c, cid)] = (lambda c=c, cid=cid: N.nvmlDeviceGetClock(h, c, cid))
    q["GetSupportedMemoryClocks"] = lambda: N.nvmlDeviceGetSupportedMemoryClocks(h)
    q["GetFanSpeed"] = lambda: N.nvmlDeviceGetFanSpeed(h)
    q["GetFanSpeed_v2_0"] = lambda: N.nvmlDeviceGetFanSpeed_v2(h, 0)
    q["GetNumFans"] = lambda: N.nvmlDeviceGetNumFans(h)
    q["GetPcieReplayCounter"] = lambda: N.nvmlDeviceGetPcieReplayCounter(h)
    q["GetCurrPcieLinkGeneration"] = lambda: N.nvmlDeviceGetCurrPcieLinkGeneration(h)
    q["GetCurrPcieLinkWidth"] = lambda: N.nvmlDeviceGetCurrPcieLinkWidth(h)
    q["GetMaxPcieLinkGeneration"] = lambda: N.nvmlDeviceGetMaxPcieLinkGeneration(h)
    q["GetMaxPcieLinkWidth"] = lambda: N.nvmlDeviceGetMaxPcieLinkWidth(h)
    q["GetGpuMaxPcieLinkGeneration"] = lambda: N.nvmlDeviceGetGpuMaxPcieLinkGeneration(h)
    q["GetPcieLinkMaxSpeed"] = lambda: N.nvmlDeviceGetPcieLinkMaxSpeed(h)
    q["GetPcieSpeed"] = lambda: N.nvmlDeviceGetPcieSpeed(h)
    q["GetPcieThroughput_TX"] = lambda: N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_TX_BYTES)
    q["GetPcieThroughput_RX"] = lambda: N.nvmlDeviceGetPcieThroughput(h, N.NVML_PCIE_UTIL_RX_BYTES)
    q["GetCurrentClocksThrottleReasons"] = lambda: N.nvmlDeviceGetCurrentClocksThrottleReasons(h)
    q["GetSupportedClocksThrottleReasons"] = lambda: N.nvmlDeviceGetSupportedClocksThrottleReasons(h)
    q["GetEccMode"] = lambda: N.nvmlDeviceGetEccMode(h)
    for et in (0, 1):
        for ct in (0, 1):
            q["GetTotalEccErrors_%d_%d" % (et, ct)] = (lambda et=et, ct=ct: N.nvmlDeviceGetTotalEccErrors(h, et, ct))
            for loc in range(0, 8):
                q["GetMemoryErrorCounter_%d_%d_%d" % (et, ct, loc)] = (
                    lambda et=et, ct=ct, loc=loc: N.nvmlDeviceGetMemoryErrorCounter(h, et, ct, loc))
    q["GetRetiredPages_SBE"] = lambda: N.nvmlDeviceGetRetiredPages(h, 0)
    q["GetRetiredPages_DBE"] = lambda: N.nvmlDeviceGetRetiredPages(h, 1)
    q["GetRetiredPagesPendingStatus"] = lambda: N.nvmlDeviceGetRetiredPagesPendingStatus(h)
    q["GetRemappedRows"] = lambda: N.nvmlDeviceGetRemappedRows(h)
    q["GetRowRemapperHistogram"] = lambda: N.nvmlDeviceGetRowRemapperHistogram(h)
    q["GetMigMode"] = lambda: N.nvmlDeviceGetMigMode(h)
    q["GetMaxMigDeviceCount"] = lambda: N.nvmlDeviceGetMaxMigDeviceCount(h)
    q["IsMigDeviceHandle"] = lambda: N.nvmlDeviceIsMigDeviceHandle(h)
    q["GetComputeMode"] = lambda: N.nvmlDeviceGetComputeMode(h)
    q["GetPersistenceMode"] = lambda: N.nvmlDeviceGetPersistenceMode(h)
    q["GetVirtualizationMode"] = lambda: N.nvmlDeviceGetVirtualizationMode(h)
    q["GetDisplayMode"] = lambda: N.nvmlDeviceGetDisplayMode(h)
    q["GetComputeRunningProcesses"] = lambda: N.nvmlDeviceGetComputeRunningProcesses(h)
    q["GetGraphicsRunningProcesses"] = lambda: N.nvmlDeviceGetGraphicsRunningProcesses(h)
    q["GetProcessUtilization_0"] = lambda: N.nvmlDeviceGetProcessUtilization(h, 0)
    q["GetSupportedEventTypes"] = lambda: N.nvmlDeviceGetSupportedEventTypes(h)
    q["GetBoardId"] = lambda: N.nvmlDeviceGetBoardId(h)
    q["GetBoardPartNumber"] = lambda: N.nvmlDeviceGetBoardPartNumber(h)
    q["GetInforomImageVersion"] = lambda: N.nvmlDeviceGetInforomImageVersion(h)
    q["GetVbiosVersion"] = lambda: N.nvmlDeviceGetVbiosVersion(h)
    q["GetNvLinkState_0"] = lambda: N.nvmlDeviceGetNvLinkState(h, 0)
    q["GpmQueryDeviceSupport"] = lambda: N.nvmlGpmQueryDeviceSupport(h)
    fields = [82, 230, 155, 156, 157, 158, 159, 160, 161, 162, 163, 164, 165, 166]
    q["GetFieldValues"] = lambda: [
        {"fieldId": f.fieldId, "nvmlReturn": f.nvmlReturn, "valueType": f.valueType,
         "ull": f.value.ullVal, "ui": f.value.uiVal}
        for f in N.nvmlDeviceGetFieldValues(h, fields)]
    for p in range(0, 15):
        q["GetGpuInstanceProfileInfo_%d" % p] = (lambda p=p: N.nvmlDeviceGetGpuInstanceProfileInfo(h, p))
    return q


def main():
    out = {"system": {}, "devices": []}
    t = time.perf_counter()
    N.nvmlInit()
    out["init_s"] = round(time.perf_counter() - t, 4)
    s = out["system"]
    s["GetDriverVersion"] = call(N.nvmlSystemGetDriverVersion)
    s["GetNVMLVersion"] = call(N.nvmlSystemGetNVMLVersion)
    s["GetCudaDriverVersion"] = call(N.nvmlSystemGetCudaDriverVersion)
    s["GetCudaDriverVersion_v2"] = call(N.nvmlSystemGetCudaDriverVersion_v2)
    s["DeviceGetCount"] = call(N.nvmlDeviceGetCount)
    s["GetHandleByIndex_99"] = call(lambda: N.nvmlDeviceGetHandleByIndex(99))
    s["GetHandleByUUID_bogus"] = call(lambda: N.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000"))
    n = N.nvmlDeviceGetCount()
    for i in range(n):
        h = N.nvmlDeviceGetHandleByIndex(i)
        d = {k: call(f) for k, f in device_questions(h).items()}
        uuid = N.nvmlDeviceGetUUID(h)
        d["GetHandleByUUID_roundtrip"] = call(lambda: N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByUUID(uuid)))
        bus = N.nvmlDeviceGetPciInfo(h).busId
        d["GetHandleByPciBusId_roundtrip"] = call(lambda: N.nvmlDeviceGetIndex(N.nvmlDeviceGetHandleByPciBusId(bus)))
        # events: register XIDs and wait briefly; a healthy GPU times out
        def ev():
            es = N.nvmlEventSetCreate()
            try:
                N.nvmlDeviceRegisterEvents(h, N.nvmlEventTypeXidCriticalError, es)
                try:
                    N.nvmlEventSetWait_v2(es, 10)
                    return "event"
                except N.NVMLError_Timeout:
                    return "timeout"
            finally:
                N.nvmlEventSetFree(es)
        d["XidEventWait"] = call(ev, reps=1)
        out["devices"].append(d)
    N.nvmlShutdown()
    json.dump(out, open(sys.argv[1], "w"), indent=1, sort_keys=True)
    print("captured %d devices, %d questions each" % (n, len(out["devices"][0]) if n else 0))


main()
