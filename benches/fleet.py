#!/usr/bin/env python3
"""What a fleet of gpu-steward nodes costs Prometheus, per GPU, for each profile and name set,
beside the same node served as dcgm-exporter's default page would be.

For each setting: N simulated 8×H100 nodes (the dgx-h100 scenario, each its own `gpu-steward
run` on its own port, no cost model: NVML answers at once), scraped by one real Prometheus
(`/usr/bin/prometheus`, Debian package `prometheus`) every --scrape seconds for --minutes.
Then, from Prometheus itself:

- series/GPU: `count({job="fleet"})` / GPUs (the fleet's series in the head, `up` and the
  scrape_* series Prometheus adds per target included), and those with a `gpu` label and no
  `pid` label (the budget's count);
- samples/s/GPU: `sum(scrape_samples_scraped{job="fleet"})` / scrape interval / GPUs;
- Prometheus RSS: its own `process_resident_memory_bytes` at the end, and the head's
  `prometheus_tsdb_head_chunks`.

The dcgm-exporter row serves, from a file, the page dcgm-exporter 4.8's default-counters.csv
gives for this node (23 fields: NVLink and the vGPU licence have no source on the simulated
node; labels gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION), with
the values of gpu-steward's own lean page for the same node, so that both compress alike.

Settings run one after the other, never at once, so each has the machine to itself.

Usage: cargo build --workspace && python3 benches/fleet.py [--nodes 50] [--minutes 5]
       [--scrape 15] [--only lean-4.8,dcgm-exporter] [--release] [--json OUT]
"""
import argparse
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {
    "lean-4.8": '[metrics]\nprofile = "lean"\ndcgm_names = "4.8"\n',
    "lean-4.9": '[metrics]\nprofile = "lean"\ndcgm_names = "4.9"\n',
    "lean-both": '[metrics]\nprofile = "lean"\ndcgm_names = "both"\n',
    "full-4.8": '[metrics]\nprofile = "full"\ndcgm_names = "4.8"\n',
    "dcgm-exporter": None,
}
# dcgm-exporter 4.8's default-counters.csv, the fields this node has a source for.
DCGM_DEFAULT = [
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait(what, f, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        try:
            v = f()
            if v:
                return v
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit(f"timed out waiting for {what}")


def start_agent(binary, sim, scenario, config, workdir, i):
    port = free_port()
    cfg = os.path.join(workdir, f"agent{i}.toml")
    with open(cfg, "w") as f:
        f.write(config)
    env = dict(os.environ, NVML_SIM_SCENARIO=scenario, NODE_NAME=f"node-{i}")
    env.pop("NVML_SIM_COST", None)
    p = subprocess.Popen(
        [binary, "run", "--listen", f"127.0.0.1:{port}", "--nvml-lib", sim, "--config", cfg],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p, port


def dcgm_exporter_page(lean_page, node):
    """dcgm-exporter's default page for the node, from the values of a lean 4.8 page."""
    out = []
    for name in DCGM_DEFAULT:
        lines = [l for l in lean_page.splitlines() if l.startswith(name + "{") and "GPU_I_ID" not in l]
        kind = "counter" if name.endswith(("_CONSUMPTION", "_COUNTER", "_ROWS")) else "gauge"
        out.append(f"# HELP {name} {name}.\n# TYPE {name} {kind}")
        for l in lines:
            out.append(re.sub(r'Hostname="[^"]*"', f'Hostname="{node}"', l))
    return "\n".join(out) + "\n"


def serve_files(pages):
    """One loopback HTTP server per page, in threads of this process; returns the ports."""
    ports = []
    for body in pages:
        data = body.encode()

        class H(http.server.BaseHTTPRequestHandler):
            payload = data

            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(self.payload)))
                self.end_headers()
                self.wfile.write(self.payload)

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        ports.append(srv.server_address[1])
    return ports


def query(prom, q):
    r = json.loads(get(f"http://127.0.0.1:{prom}/api/v1/query?query=" + urllib.parse.quote(q)))
    res = r["data"]["result"]
    return float(res[0]["value"][1]) if res else float("nan")


def run_setting(name, args, binary, sim, scenario):
    work = tempfile.mkdtemp(prefix=f"fleet-{name}-")
    procs = []
    try:
        if SETTINGS[name] is None:
            # One lean 4.8 agent gives the values; the pages are static files afterwards.
            p, port = start_agent(binary, sim, scenario, SETTINGS["lean-4.8"], work, 0)
            procs.append(p)
            page = wait("a page with GPM", lambda: (lambda t: t if "DCGM_FI_PROF_GR_ENGINE_ACTIVE{" in t else None)(
                get(f"http://127.0.0.1:{port}/metrics")))
            p.terminate()
            p.wait()
            procs.clear()
            ports = serve_files([dcgm_exporter_page(page, f"node-{i}") for i in range(args.nodes)])
        else:
            ports = []
            for i in range(args.nodes):
                p, port = start_agent(binary, sim, scenario, SETTINGS[name], work, i)
                procs.append(p)
                ports.append(port)
            for port in ports:
                wait("agent readiness", lambda: get(f"http://127.0.0.1:{port}/readyz") is not None)
        prom = free_port()
        targets = ", ".join(f'"127.0.0.1:{p}"' for p in ports)
        with open(os.path.join(work, "prometheus.yml"), "w") as f:
            f.write(f"global:\n  scrape_interval: {args.scrape}s\n"
                    f"scrape_configs:\n"
                    f"  - job_name: fleet\n    static_configs:\n      - targets: [{targets}]\n"
                    f"  - job_name: prometheus\n    static_configs:\n      - targets: [\"127.0.0.1:{prom}\"]\n")
        pp = subprocess.Popen(
            [args.prometheus, f"--config.file={work}/prometheus.yml",
             f"--storage.tsdb.path={work}/data", f"--web.listen-address=127.0.0.1:{prom}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(pp)
        wait("prometheus", lambda: get(f"http://127.0.0.1:{prom}/-/ready"))
        time.sleep(args.minutes * 60)
        gpus = args.nodes * 8
        series = query(prom, 'count({job="fleet"})')
        gpu_series = query(prom, 'count({job="fleet", gpu!="", pid=""})')
        samples = query(prom, 'sum(scrape_samples_scraped{job="fleet"})')
        rss = query(prom, 'process_resident_memory_bytes{job="prometheus"}')
        chunks = query(prom, "prometheus_tsdb_head_chunks")
        return {
            "setting": name, "nodes": args.nodes, "gpus": gpus,
            "series_per_gpu": series / gpus,
            "gpu_series_per_gpu": gpu_series / gpus,
            "samples_per_s_per_gpu": samples / args.scrape / gpus,
            "prometheus_rss_mib": rss / 2**20,
            "head_chunks": chunks,
        }
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--scrape", type=int, default=15)
    ap.add_argument("--only", default=",".join(SETTINGS))
    ap.add_argument("--release", action="store_true", help="use target/release (default: debug)")
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    ap.add_argument("--json")
    args = ap.parse_args()
    profile = "release" if args.release else "debug"
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    binary = os.path.join(target, profile, "gpu-steward")
    sim = os.path.join(target, profile, "libnvml_sim.so")
    for f in (binary, sim, args.prometheus):
        if not os.path.exists(f):
            sys.exit(f"missing {f}: cargo build --workspace{' --release' if args.release else ''}")
    scenario = os.path.join(ROOT, "tests", "scenarios", "dgx-h100.toml")
    rows = []
    for name in args.only.split(","):
        print(f"--- {name}: {args.nodes} nodes, {args.minutes} min, scrape every {args.scrape}s",
              file=sys.stderr)
        rows.append(run_setting(name, args, binary, sim, scenario))
    print("| setting | series/GPU, all | series/GPU with a gpu label | samples/s/GPU | "
          "Prometheus RSS (MiB) | head chunks |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['setting']} | {r['series_per_gpu']:.2f} | {r['gpu_series_per_gpu']:.2f} | "
              f"{r['samples_per_s_per_gpu']:.3f} | {r['prometheus_rss_mib']:.0f} | "
              f"{r['head_chunks']:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "build": profile, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
