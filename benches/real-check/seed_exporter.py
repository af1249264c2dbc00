#!/usr/bin/env python3
# Provenance: a copy (unchanged but for these three lines) of the script that measured the real
# H100 on 2026-11-22 (its captures: nvml-sim/tests/data/real-h100/; its figures: BENCHMARKS.md).
# real-check.sh runs it for comparison; it only reads NVML.
"""The seeds' GPUMonitor (pynvml + prometheus_client), run as an exporter for comparison.
usage: seed_exporter.py PORT INTERVAL_S"""
import sys, time
import pynvml
from prometheus_client import Gauge, start_http_server


class GPUMonitor:
    def __init__(self):
        pynvml.nvmlInit()
        self.gpu_util = Gauge('gpu_utilization', 'GPU Utilization', ['gpu_id'])
        self.gpu_mem = Gauge('gpu_memory_used', 'GPU Memory Used', ['gpu_id'])
        self.gpu_temp = Gauge('gpu_temperature', 'GPU Temperature', ['gpu_id'])
        self.gpu_power = Gauge('gpu_power_draw', 'GPU Power Draw', ['gpu_id'])

    def collect_metrics(self):
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            self.gpu_util.labels(gpu_id=str(i)).set(pynvml.nvmlDeviceGetUtilizationRates(h).gpu)
            self.gpu_mem.labels(gpu_id=str(i)).set(pynvml.nvmlDeviceGetMemoryInfo(h).used)
            self.gpu_temp.labels(gpu_id=str(i)).set(pynvml.nvmlDeviceGetTemperature(h, 0))
            self.gpu_power.labels(gpu_id=str(i)).set(pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0)


if __name__ == "__main__":
    start_http_server(int(sys.argv[1]), addr="127.0.0.1")
    m = GPUMonitor()
    while True:
        m.collect_metrics()
        time.sleep(float(sys.argv[2]))
