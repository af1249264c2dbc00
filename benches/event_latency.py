#!/usr/bin/env python3
"""How long an XID takes from the NVML event to what the cluster sees: `/health/gpus` turning
503, the device plugin's ListAndWatch stream sending the GPU `Unhealthy`, a remediation route
taking the alert (its audit record, written and fsynced before the hook runs), and the route's
hook running (`/bin/sh` writing the time). Against the simulated NVML, at a 5 s and a 60 s poll interval.

Each trial starts a fresh agent (one H100, the device plugin on, a rule `gpu_steward_gpu_health
== 2` routed to a hook that writes the time it ran), waits until it is ready and ListAndWatch
has sent the healthy list, then rewrites the scenario with XID 48 (a failing XID). The event's
time is the one the agent stamped when nvmlEventSetWait returned it (the `observed` entry of
`/api/v1/events`, in ms); each latency is measured from it. The simulator's own delay between the
rewrite and the event (its waits poll the file every 250 ms) is reported apart: it is not the
agent's.

ListAndWatch is read over a hand-written HTTP/2 connection (no gRPC package needed); the
kubelet is a listening socket that never answers (the plugin serves its socket before it
registers, and keeps retrying the registration).

Usage: cargo build --workspace && python3 benches/event_latency.py [--trials 40] [--bin B]
"""
import argparse
import json
import os
import socket
import struct
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEBUG = os.path.join(ROOT, "target", "debug")
GPU = "GPU-e0000000-1111-2222-3333-444444444444"
SCENARIO = f'version = 1\n[[gpu]]\nmodel = "H100-SXM5-80GB"\nuuid = "{GPU}"\n'
RULES = """groups:
  - name: bench
    rules:
      - alert: BenchGpuFailing
        expr: gpu_steward_gpu_health == 2
        labels:
          severity: critical
"""


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def literal(name, value):
    """An HPACK literal without indexing, new name, no Huffman (lengths < 127)."""
    return bytes([0, len(name)]) + name + bytes([len(value)]) + value


def varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def devices(msg):
    """(id, health) of each Device in a ListAndWatchResponse."""
    out, i = [], 0
    while i < len(msg):
        key, i = varint(msg, i)
        n, i = varint(msg, i)
        body, i = msg[i:i + n], i + n
        if key >> 3 != 1:
            continue
        fields, j = {}, 0
        while j < len(body):
            k, j = varint(body, j)
            if k & 7 == 2:
                m, j = varint(body, j)
                fields[k >> 3], j = body[j:j + m].decode(), j + m
            else:
                _, j = varint(body, j)
        out.append((fields.get(1), fields.get(2)))
    return out


class ListAndWatch:
    """A ListAndWatch stream over a raw HTTP/2 connection; `lists` gets (time, devices)."""

    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        block = b"".join(literal(n, v) for n, v in [
            (b":method", b"POST"), (b":scheme", b"http"),
            (b":path", b"/v1beta1.DevicePlugin/ListAndWatch"), (b":authority", b"localhost"),
            (b"content-type", b"application/grpc"), (b"te", b"trailers")])
        self.s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0) + frame(1, 4, 1, block)
                       + frame(0, 1, 1, b"\0\0\0\0\0"))
        self.lists, self.buf, self.grpc = [], b"", b""
        self.cond = threading.Condition()
        threading.Thread(target=self.read, daemon=True).start()

    def recv(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read(self):
        try:
            while True:
                h = self.recv(9)
                n = int.from_bytes(h[:3], "big")
                payload = self.recv(n)
                kind, flags, stream = h[3], h[4], int.from_bytes(h[5:9], "big") & 0x7FFFFFFF
                if kind == 4 and not flags & 1:
                    self.s.sendall(frame(4, 1, 0))
                elif kind == 0 and stream == 1:
                    now = time.time()
                    inc = struct.pack(">I", max(n, 1))
                    self.s.sendall(frame(8, 0, 0, inc) + frame(8, 0, 1, inc))
                    self.grpc += payload
                    while len(self.grpc) >= 5 and len(self.grpc) >= 5 + int.from_bytes(self.grpc[1:5], "big"):
                        m = int.from_bytes(self.grpc[1:5], "big")
                        msg, self.grpc = self.grpc[5:5 + m], self.grpc[5 + m:]
                        with self.cond:
                            self.lists.append((now, devices(msg)))
                            self.cond.notify_all()
        except (EOFError, OSError):
            pass

    def wait(self, want, timeout):
        end = time.time() + timeout
        with self.cond:
            while True:
                for t, d in self.lists:
                    if want(d):
                        return t
                left = end - time.time()
                if left <= 0:
                    return None
                self.cond.wait(left)


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait(what, timeout, f, step=0.002):
    end = time.time() + timeout
    while time.time() < end:
        v = f()
        if v is not None:
            return v
        time.sleep(step)
    raise SystemExit(f"timed out waiting for {what}")


def trial(binary, sim, interval):
    with tempfile.TemporaryDirectory() as d:
        dp = os.path.join(d, "dp")
        os.mkdir(dp)
        kubelet = socket.socket(socket.AF_UNIX)
        kubelet.bind(os.path.join(dp, "kubelet.sock"))
        kubelet.listen(16)
        scen = os.path.join(d, "scenario.toml")
        open(scen, "w").write(SCENARIO)
        open(os.path.join(d, "rules.yml"), "w").write(RULES)
        hook = os.path.join(d, "hook.txt")
        open(os.path.join(d, "config.toml"), "w").write(f"""
[health]
xid_window = "1h"
[rules]
files = ["{d}/rules.yml"]
[audit]
file = "{d}/audit.jsonl"
[[remediation.hooks]]
name = "stamp"
command = ["/bin/sh", "-c", "date +%s.%N >> {hook}"]
timeout = "10s"
[[remediation.routes]]
matchers = ['alertname="BenchGpuFailing"']
hooks = ["stamp"]
[sharing.device_plugin]
enabled = true
directory = "{dp}"
""")
        port_sock = socket.socket()
        port_sock.bind(("127.0.0.1", 0))
        port = port_sock.getsockname()[1]
        port_sock.close()
        agent = subprocess.Popen(
            [binary, "run", "--listen", f"127.0.0.1:{port}", "--interval", interval,
             "--nvml-lib", sim, "--config", os.path.join(d, "config.toml")],
            env={**os.environ, "NVML_SIM_SCENARIO": scen, "RUST_LOG": "warn"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait("/readyz", 30, lambda: True if _ok(port, "/readyz") else None, 0.02)
            plugin = os.path.join(dp, "gpu-steward-gpu.sock")
            wait("the plugin socket", 30, lambda: True if os.path.exists(plugin) else None, 0.02)
            law = ListAndWatch(plugin)
            if law.wait(lambda dev: dev == [(GPU, "Healthy")], 10) is None:
                raise SystemExit("ListAndWatch sent no healthy list")
            health_at = []

            def watch_health():
                while not health_at:
                    if get(port, "/health/gpus")[0] == 503:
                        health_at.append(time.time())
                    time.sleep(0.002)
            threading.Thread(target=watch_health, daemon=True).start()
            written = time.time()
            tmp = scen + ".tmp"
            open(tmp, "w").write(SCENARIO + "[[gpu.event]]\nid = 1\nxid = 48\n")
            os.rename(tmp, scen)
            t_law = law.wait(lambda dev: dev == [(GPU, "Unhealthy")], 90)
            wait("/health/gpus 503", 90, lambda: health_at[0] if health_at else None)
            t_hook = wait("the hook", 90, lambda: _first_line(hook))
            events = json.loads(get(port, "/api/v1/events")[1])
            observed = next(e for e in (events if isinstance(events, list) else events["events"])
                            if e.get("kind") == "observed" and e.get("condition") == "xid_48")
            t_event = datetime.fromisoformat(observed["time"].replace("Z", "+00:00")).timestamp()
            route = next(json.loads(line) for line in open(os.path.join(d, "audit.jsonl"))
                         if '"component":"remediation"' in line)
            t_route = datetime.fromisoformat(route["ts"].replace("Z", "+00:00")).timestamp()
            return {
                "sim_delay": t_event - written,
                "health": health_at[0] - t_event,
                "list_and_watch": t_law - t_event,
                "route": t_route - t_event,
                "hook": t_hook - t_event,
            }
        finally:
            agent.terminate()
            agent.wait(timeout=20)
            kubelet.close()


def _ok(port, path):
    try:
        return get(port, path)[0] == 200
    except OSError:
        return False


def _first_line(path):
    try:
        line = open(path).readline().strip()
        return float(line) if line else None
    except (OSError, ValueError):
        return None


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--bin", default=os.path.join(DEBUG, "gpu-steward"))
    ap.add_argument("--sim", default=os.path.join(DEBUG, "libnvml_sim.so"))
    ap.add_argument("--intervals", default="5s,60s")
    args = ap.parse_args()
    for interval in args.intervals.split(","):
        results = [trial(args.bin, args.sim, interval) for _ in range(args.trials)]
        print(f"poll interval {interval}, {len(results)} XIDs (ms from the NVML event):")
        for key in ("health", "list_and_watch", "route", "hook", "sim_delay"):
            xs = [r[key] * 1000 for r in results]
            print(f"  {key:15} min {min(xs):6.1f}  p50 {pct(xs, 50):6.1f}  p90 {pct(xs, 90):6.1f}"
                  f"  p99 {pct(xs, 99):6.1f}  max {max(xs):6.1f}")


if __name__ == "__main__":
    main()
