#!/usr/bin/env python3
# Provenance: a copy (unchanged but for these three lines) of the script that measured the real
# H100 on 2026-11-22 (its captures: nvml-sim/tests/data/real-h100/; its figures: BENCHMARKS.md).
# real-check.sh's load phase (needs torch): GPU work, no GPU setting changed.
"""GPU work for the checks: 'busy SECONDS GB' runs bf16 matmuls holding GB of memory;
'idle SECONDS GB' holds GB and computes nothing."""
import sys, time, torch
mode, secs, gb = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
hold = torch.empty(int(gb * 2**30), dtype=torch.uint8, device="cuda")
x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
y = torch.randn_like(x)
torch.cuda.synchronize()
print("ready", mode, flush=True)
t = time.time()
while time.time() - t < secs:
    if mode == "busy":
        for _ in range(20):
            z = x @ y
        torch.cuda.synchronize()
    else:
        time.sleep(0.5)
print("done", mode, flush=True)
