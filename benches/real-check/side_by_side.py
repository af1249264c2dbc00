#!/usr/bin/env python3
"""Puts gpu-steward's /metrics beside nvidia-smi's answers, per GPU, and says which values agree
within a tolerance. Stdlib only; needs no GPU (the inputs are files).

usage: side_by_side.py METRICS_FILE SMI_CSV [SMI_CSV ...] [--apps APPS_CSV ...] [--strict]
                       [--json OUT]

  METRICS_FILE  a /metrics body of gpu-steward (Prometheus text format)
  SMI_CSV       `nvidia-smi --query-gpu=index,uuid,...,FIELDS --format=csv,nounits`; give the
                sample taken before the scrape and the one after: a value that moved between
                them matches anywhere in their range (plus the tolerance)
  --apps        `nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory
                --format=csv,nounits`, before and/or after: per-process used memory by pid
  --strict      exit 1 when any value disagrees (for CI); otherwise disagreements are findings
                and the exit code is 0
  --json OUT    every row as JSON

GPUs are joined by UUID. Each quantity reads the native gpu_steward_* series, or the dcgm-exporter
one when the native family is switched off. Exit codes: 0 done, 1 disagreement with --strict,
2 unreadable input.
"""
import argparse
import csv
import json
import re
import sys

MIB = 1 << 20
# Bits of nvmlClocksEventReasons that gpu-steward names in gpu_steward_clock_event_active.
REASON_BITS = {"gpu_idle": 0x1, "applications_clocks_setting": 0x2, "sw_power_cap": 0x4,
               "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal_slowdown": 0x20,
               "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80,
               "display_clock_setting": 0x100}
NAMED_BITS = sum(REASON_BITS.values())


class InputError(Exception):
    pass


# ---------- inputs ----------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\d+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def parse_metrics(text):
    """{name: [(labels, value)]} (the same parser as agent_meter.py, kept here so that this file
    stands alone)."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {}
        if m.group(2):
            for lm in _LABEL.finditer(m.group(2)[1:-1]):
                labels[lm.group(1)] = lm.group(2).replace('\\"', '"').replace("\\\\", "\\")
        try:
            out.setdefault(m.group(1), []).append((labels, float(m.group(3))))
        except ValueError:
            continue
    return out


NA = re.compile(r"^\[?(N/A|Not Supported|Unknown Error|Insufficient Permissions|"
                r"GPU requires reset|Not Available)\]?$", re.I)


def smi_value(raw):
    """A CSV cell -> (number, text) or (None, text) for N/A and the like; units are dropped
    ('62 %' and '62' both give 62)."""
    text = raw.strip()
    if not text or NA.match(text):
        return None, text or "(empty)"
    if re.fullmatch(r"0x[0-9a-fA-F]+", text):
        return int(text, 16), text
    m = re.fullmatch(r"(-?\d+(?:\.\d+)?)(?:\s*(%|MiB|W|MHz|C))?", text)
    if m:
        return float(m.group(1)), text
    return None, text


def read_csv(path):
    """rows of a `nvidia-smi --format=csv` file as dicts keyed by field name (the ' [unit]'
    suffix of the header dropped)."""
    try:
        with open(path, newline="") as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
    except OSError as e:
        raise InputError(f"cannot read {path}: {e}")
    if not lines:
        raise InputError(f"{path} is empty (did nvidia-smi fail? its error would be in the file)")
    rows = list(csv.reader(lines, skipinitialspace=True))
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
    if "," not in lines[0] and len(header) == 1 and " " in lines[0]:
        raise InputError(f"{path} does not start with a CSV header: {lines[0][:120]!r}")
    out = []
    for r in rows[1:]:
        if len(r) != len(header):
            raise InputError(f"{path}: row {r!r} has {len(r)} cells, the header {len(header)}")
        out.append(dict(zip(header, (c.strip() for c in r))))
    return header, out


# ---------- the quantities ----------

class Q:
    """One compared quantity: nvidia-smi field(s), gpu-steward series (native first, then dcgm),
    unit, tolerance (absolute, or relative with an absolute floor)."""

    def __init__(self, label, fields, unit, agent, abs_tol=0.0, rel_tol=0.0, why=""):
        self.label, self.fields, self.unit, self.agent = label, fields, unit, agent
        self.abs_tol, self.rel_tol, self.why = abs_tol, rel_tol, why

    def tol(self, ref):
        return max(self.abs_tol, self.rel_tol * abs(ref))

    def tol_text(self):
        if self.rel_tol:
            return f"±{self.rel_tol * 100:g} %, at least {self.abs_tol:g}"
        return f"±{self.abs_tol:g}" if self.abs_tol else "exact"


def native(name, scale=1.0, **match):
    return ("native", name, scale, match)


def dcgm(name, scale=1.0, **match):
    return ("dcgm", name, scale, match)


MOVING = "sampled at different instants"
QUANTITIES = [
    Q("utilization, GPU", ["utilization.gpu"], "%",
      [native("gpu_steward_gpu_utilization_ratio", 100), dcgm("DCGM_FI_DEV_GPU_UTIL")], 10, why=MOVING),
    Q("utilization, memory", ["utilization.memory"], "%",
      [native("gpu_steward_memory_utilization_ratio", 100), dcgm("DCGM_FI_DEV_MEM_COPY_UTIL")], 10,
      why=MOVING),
    Q("memory used", ["memory.used"], "MiB",
      [native("gpu_steward_memory_used_bytes", 1 / MIB), dcgm("DCGM_FI_DEV_FB_USED")], 64,
      why="allocations move; nvidia-smi rounds to MiB"),
    Q("memory free", ["memory.free"], "MiB",
      [native("gpu_steward_memory_free_bytes", 1 / MIB), dcgm("DCGM_FI_DEV_FB_FREE")], 64),
    Q("memory total", ["memory.total"], "MiB",
      [native("gpu_steward_memory_total_bytes", 1 / MIB), dcgm("DCGM_FI_DEV_FB_TOTAL")], 1),
    Q("memory reserved", ["memory.reserved"], "MiB",
      [native("gpu_steward_memory_reserved_bytes", 1 / MIB), dcgm("DCGM_FI_DEV_FB_RESERVED")], 1),
    Q("temperature, GPU", ["temperature.gpu"], "°C",
      [native("gpu_steward_temperature_celsius"), dcgm("DCGM_FI_DEV_GPU_TEMP")], 2, why=MOVING),
    Q("temperature, memory", ["temperature.memory"], "°C",
      [native("gpu_steward_memory_temperature_celsius"), dcgm("DCGM_FI_DEV_MEMORY_TEMP")], 2,
      why=MOVING),
    Q("power draw", ["power.draw"], "W",
      [native("gpu_steward_power_watts"), dcgm("DCGM_FI_DEV_POWER_USAGE")], 10, 0.10,
      why="power moves within a second; nvidia-smi may average it"),
    Q("power limit", ["power.limit"], "W",
      [native("gpu_steward_power_limit_watts"), dcgm("DCGM_FI_DEV_POWER_MGMT_LIMIT")], 0.5),
    Q("enforced power limit", ["enforced.power.limit"], "W",
      [native("gpu_steward_enforced_power_limit_watts"), dcgm("DCGM_FI_DEV_ENFORCED_POWER_LIMIT")], 0.5),
    Q("default power limit", ["power.default_limit"], "W",
      [native("gpu_steward_power_default_limit_watts")], 0.5),
    Q("SM clock", ["clocks.current.sm", "clocks.sm"], "MHz",
      [native("gpu_steward_clock_hertz", 1e-6, clock="sm"), dcgm("DCGM_FI_DEV_SM_CLOCK")], 15, 0.05,
      why="clocks move with load and power capping"),
    Q("memory clock", ["clocks.current.memory", "clocks.mem"], "MHz",
      [native("gpu_steward_clock_hertz", 1e-6, clock="memory"), dcgm("DCGM_FI_DEV_MEM_CLOCK")], 15, 0.05),
    Q("graphics clock", ["clocks.current.graphics", "clocks.gr"], "MHz",
      [native("gpu_steward_clock_hertz", 1e-6, clock="graphics")], 15, 0.05),
    Q("video clock", ["clocks.current.video", "clocks.video"], "MHz",
      [native("gpu_steward_clock_hertz", 1e-6, clock="video"), dcgm("DCGM_FI_DEV_VIDEO_CLOCK")], 15, 0.05),
    Q("max SM clock", ["clocks.max.sm"], "MHz", [native("gpu_steward_clock_max_hertz", 1e-6, clock="sm")]),
    Q("max memory clock", ["clocks.max.memory", "clocks.max.mem"], "MHz",
      [native("gpu_steward_clock_max_hertz", 1e-6, clock="memory")]),
    Q("PCIe link generation", ["pcie.link.gen.current"], "gen",
      [native("gpu_steward_pcie_link_generation"), dcgm("DCGM_FI_DEV_PCIE_LINK_GEN")],
      why="an idle link may train down between samples"),
    Q("PCIe link width", ["pcie.link.width.current"], "lanes",
      [native("gpu_steward_pcie_link_width"), dcgm("DCGM_FI_DEV_PCIE_LINK_WIDTH")]),
    Q("PCIe max generation", ["pcie.link.gen.max"], "gen", [native("gpu_steward_pcie_link_max_generation")]),
    Q("PCIe max width", ["pcie.link.width.max"], "lanes", [native("gpu_steward_pcie_link_max_width")]),
    Q("ECC errors, volatile corrected", ["ecc.errors.corrected.volatile.total"], "errors",
      [native("gpu_steward_ecc_errors_volatile_total", error="corrected"),
       dcgm("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")]),
    Q("ECC errors, volatile uncorrected", ["ecc.errors.uncorrected.volatile.total"], "errors",
      [native("gpu_steward_ecc_errors_volatile_total", error="uncorrected"),
       dcgm("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")]),
    Q("fan speed", ["fan.speed"], "%", [native("gpu_steward_fan_speed_ratio", 100)], 5),
]
IDENTITY = [("name", "name"), ("PCI bus id", "pci.bus_id"), ("serial", "serial"),
            ("driver version", "driver_version")]
REASON_FIELDS = ["clocks_event_reasons.active", "clocks_throttle_reasons.active"]


class Agent:
    """gpu-steward's series of one GPU."""

    def __init__(self, metrics, uuid):
        self.m, self.uuid = metrics, uuid

    def series(self, family, name, match):
        key = "uuid" if family == "native" else "UUID"
        for labels, v in self.m.get(name, []):
            if labels.get(key) == self.uuid and all(labels.get(k) == x for k, x in match.items()):
                yield labels, v

    def value(self, sources):
        """(value, metric) from the first source that has a series, or (None, None)."""
        for family, name, scale, match in sources:
            for _, v in self.series(family, name, match):
                return v * scale, name
        return None, None

    def info(self):
        for labels, _ in self.series("native", "gpu_steward_gpu_info", {}):
            return labels
        return {}

    def reasons(self):
        """(mask, source, known-bits mask) of the active clock event reasons."""
        for _, v in self.series("dcgm", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {}):
            return int(v), "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", None
        rows = list(self.series("native", "gpu_steward_clock_event_active", {}))
        if not rows:
            return None, None, None
        mask = sum(REASON_BITS.get(l.get("reason"), 0) for l, v in rows if v >= 1)
        return mask, "gpu_steward_clock_event_active", NAMED_BITS

    def processes(self):
        return {l.get("pid"): v / MIB for l, v in
                self.series("native", "gpu_steward_process_memory_used_bytes", {})}


def reasons_text(mask):
    if mask is None:
        return "absent"
    names = [n for n, b in REASON_BITS.items() if mask & b]
    other = mask & ~NAMED_BITS
    if other:
        names.append(f"0x{other:x}")
    return f"0x{mask:x}" + (f" ({', '.join(names)})" if names else " (none)")


def fmt(v):
    if v is None:
        return "absent"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{int(v)}"


# ---------- comparison ----------

def compare_number(q, samples, agent_v):
    """samples: [(number or None, text)] from each nvidia-smi file. -> (smi text, agent text, verdict)"""
    nums = [n for n, _ in samples if n is not None]
    texts = [t for _, t in samples]
    smi_txt = fmt(nums[0]) if nums and len(set(nums)) == 1 else \
        (f"{fmt(min(nums))}..{fmt(max(nums))}" if nums else texts[0])
    if not nums and agent_v is None:
        return smi_txt, "absent", "yes (both n/a)"
    if not nums:
        return smi_txt, fmt(agent_v), "NO (nvidia-smi has no value)"
    if agent_v is None:
        return smi_txt, "absent", "NO (absent in gpu-steward)"
    lo, hi = min(nums), max(nums)
    ok = lo - q.tol(lo) <= agent_v <= hi + q.tol(hi)
    return smi_txt, fmt(agent_v), ("yes" if ok else "NO") + f" ({q.tol_text()})"


def compare_reasons(smi_rows, header, agent):
    """The active clock event reasons: a bit mask, exact (either sample)."""
    row = {"quantity": "clock event reasons", "unit": "mask", "source": "",
           "why": "reasons change with load"}
    field = next((f for f in REASON_FIELDS if f in header), None)
    if field is None:
        row.update({"nvidia-smi": "n/a (no clocks_event_reasons.active field)", "gpu-steward": "",
                    "match": "not compared"})
        return row
    masks = [smi_value(r.get(field, ""))[0] for r in smi_rows]
    mask, source, known = agent.reasons()
    if known:
        row["why"] += " (compared on the 9 bits gpu_steward_clock_event_active names)"
    shown = [None if m is None else int(m) & (known or ~0) for m in masks]
    if mask is None:
        verdict = ("NO (absent in gpu-steward)" if any(m is not None for m in shown)
                   else "yes (both n/a)")
    else:
        verdict = "yes (exact)" if mask in shown else "NO (exact)"
    row.update({"nvidia-smi": " / ".join(dict.fromkeys(reasons_text(m) for m in shown)),
                "gpu-steward": reasons_text(mask), "match": verdict, "source": source or ""})
    return row


def smi_field(q, header):
    """The first of the quantity's column names the CSV header has: nvidia-smi prints a field's
    current name whatever name it was asked for (driver 580: `clocks.current.sm [MHz]` for
    `--query-gpu=clocks.sm`; older drivers `clocks.sm [MHz]`), so both spellings are listed."""
    return next((f for f in q.fields if f in header), None)


def compare_gpu(uuid, smi_rows, header, agent, app_samples):
    rows = []

    def add(quantity, smi, ours, unit, verdict, source="", why=""):
        rows.append({"quantity": quantity, "nvidia-smi": smi, "gpu-steward": ours, "unit": unit,
                     "match": verdict, "source": source, "why": why})

    info = agent.info()
    first = smi_rows[0]
    for label, field in IDENTITY:
        if field not in header:
            continue
        ours = info.get(field.replace(".", "_"))
        smi = first.get(field, "")
        if ours is None:
            add(label, smi, "absent", "", "NO (absent in gpu-steward)", "gpu_steward_gpu_info")
        else:
            same = smi.strip().lower() == ours.strip().lower()
            add(label, smi, ours, "", "yes" if same else "NO", "gpu_steward_gpu_info")
    for q in QUANTITIES:
        field = smi_field(q, header)
        if field is None:
            add(q.label, f"n/a (no {' or '.join(repr(f) for f in q.fields)} column)", "", q.unit,
                "not compared")
            continue
        value, source = agent.value(q.agent)
        smi, ours, verdict = compare_number(q, [smi_value(r.get(field, "")) for r in smi_rows], value)
        add(q.label, smi, ours, q.unit, verdict, source or q.agent[0][1], q.why)
        rows[-1]["column"] = field
        if q.label == "max memory clock":
            rows.append(compare_reasons(smi_rows, header, agent))

    # Per-process used memory, by pid.
    if app_samples is not None:
        ours = agent.processes()
        theirs = {}
        for sample in app_samples:
            for r in sample:
                if r.get("gpu_uuid") == uuid:
                    mem = r.get("used_gpu_memory", r.get("used_memory", ""))
                    theirs.setdefault(r.get("pid"), []).append(smi_value(mem))
        if not ours and not theirs:
            add("processes", "none", "none", "", "yes", "gpu_steward_process_memory_used_bytes")
        q = Q("process memory", [], "MiB", [], 1)
        for pid in sorted(set(ours) | set(theirs), key=lambda p: int(p) if p and p.isdigit() else 0):
            label = f"process {pid} used memory"
            if pid not in theirs:
                add(label, "absent", fmt(ours[pid]), "MiB",
                    "NO (not in --query-compute-apps)", "gpu_steward_process_memory_used_bytes",
                    "a graphics-only process is not in nvidia-smi's compute list; or it ended")
                continue
            smi, mine, verdict = compare_number(q, theirs[pid], ours.get(pid))
            add(label, smi, mine, "MiB", verdict, "gpu_steward_process_memory_used_bytes",
                "" if pid in ours else "a process that started after the scrape is not in it")
    return rows


def table(rows):
    cols = ["quantity", "nvidia-smi", "gpu-steward", "unit", "match", "column"]
    width = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    out = ["| " + " | ".join(c.ljust(width[c]) for c in cols) + " |",
           "|" + "|".join("-" * (width[c] + 2) for c in cols) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(r.get(c, "")).ljust(width[c]) for c in cols) + " |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("metrics")
    ap.add_argument("smi", nargs="+")
    ap.add_argument("--apps", action="append")
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        try:
            with open(args.metrics, encoding="utf-8", errors="replace") as f:
                metrics = parse_metrics(f.read())
        except OSError as e:
            raise InputError(f"cannot read {args.metrics}: {e}")
        if not metrics:
            raise InputError(f"{args.metrics} holds no Prometheus samples")
        samples = [read_csv(p) for p in args.smi]
        header = samples[0][0]
        if "uuid" not in header:
            raise InputError(f"{args.smi[0]} has no uuid column: query it with "
                             "--query-gpu=index,uuid,...")
        apps = None
        if args.apps:
            apps = []
            for p in args.apps:
                h, rows = read_csv(p)
                if "gpu_uuid" not in h or "pid" not in h:
                    raise InputError(f"{p} lacks gpu_uuid or pid: query it with "
                                     "--query-compute-apps=gpu_uuid,pid,process_name,used_memory")
                apps.append(rows)
    except InputError as e:
        print(f"side_by_side: {e}", file=sys.stderr)
        return 2

    agent_uuids = {l.get("uuid") for l, _ in metrics.get("gpu_steward_gpu_info", [])} | \
                  {l.get("UUID") for l, _ in metrics.get("DCGM_FI_DEV_GPU_TEMP", [])}
    agent_uuids.discard(None)
    smi_uuids = list(dict.fromkeys(r["uuid"] for r in samples[0][1]))
    agent_gpus = next((v for l, v in metrics.get("gpu_steward_gpus", []) if not l), None)
    print(f"GPUs: nvidia-smi {len(smi_uuids)}, gpu-steward "
          f"{'?' if agent_gpus is None else f'{agent_gpus:.0f}'} (gpu_steward_gpus)")
    result = {"gpus": [], "mismatches": 0, "matches": 0, "not_compared": 0}
    for uuid in smi_uuids:
        smi_rows = [r for _, rows in samples for r in rows if r.get("uuid") == uuid]
        idx = smi_rows[0].get("index", "?")
        rows = compare_gpu(uuid, smi_rows, header, Agent(metrics, uuid), apps)
        print(f"\nGPU {idx}  {uuid}  {smi_rows[0].get('name', '')}"
              + ("" if uuid in agent_uuids else "  -- NOT in gpu-steward's /metrics"))
        print(table(rows))
        for r in rows:
            key = ("matches" if r["match"].startswith("yes") else
                   "mismatches" if r["match"].startswith("NO") else "not_compared")
            result[key] += 1
        result["gpus"].append({"index": idx, "uuid": uuid, "rows": rows})
    extra = sorted(agent_uuids - set(smi_uuids))
    if extra:
        print(f"\ngpu-steward reports GPUs nvidia-smi does not list: {', '.join(extra)}")
        result["mismatches"] += len(extra)
    print(f"\nside-by-side: {result['matches']} agree, {result['mismatches']} disagree, "
          f"{result['not_compared']} not compared")
    if result["mismatches"]:
        print("disagreements (the value moved between samples, or a defect; see 'why'):")
        for g in result["gpus"]:
            for r in g["rows"]:
                if r["match"].startswith("NO"):
                    why = f" [{r['why']}]" if r["why"] else ""
                    print(f"  GPU {g['index']} {r['quantity']}: nvidia-smi {r['nvidia-smi']}, "
                          f"gpu-steward {r['gpu-steward']} from {r['source'] or '?'}{why}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if args.strict and result["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
