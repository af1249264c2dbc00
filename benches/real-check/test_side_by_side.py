"""Unit test of side_by_side.py's column matching: nvidia-smi names its clock columns
`clocks.current.sm [MHz]` on driver 580 and `clocks.sm [MHz]` on older drivers (whatever name
the query used); both spellings must be compared, and the table must say which column it read.
Run: python3 -m unittest benches/real-check/test_side_by_side.py (tests/real_check.rs does)."""

import io
import json
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_by_side  # noqa: E402

UUID = "GPU-11111111-2222-3333-4444-555555555555"
# One GPU's clocks, in MHz, as both nvidia-smi and the agent report them.
CLOCKS = {"sm": 1980, "memory": 2619, "graphics": 1980, "video": 1755}
MAX = {"sm": 1980, "memory": 2619}

OLD = ["clocks.sm", "clocks.mem", "clocks.gr", "clocks.video", "clocks.max.sm", "clocks.max.mem"]
NEW = ["clocks.current.sm", "clocks.current.memory", "clocks.current.graphics",
       "clocks.current.video", "clocks.max.sm", "clocks.max.memory"]
VALUES = [CLOCKS["sm"], CLOCKS["memory"], CLOCKS["graphics"], CLOCKS["video"], MAX["sm"],
          MAX["memory"]]


def metrics():
    lines = [f'gpu_steward_gpu_info{{gpu="0",uuid="{UUID}",name="NVIDIA H100"}} 1']
    for clock, mhz in CLOCKS.items():
        lines.append(f'gpu_steward_clock_hertz{{gpu="0",uuid="{UUID}",clock="{clock}"}} {mhz * 1e6}')
    for clock, mhz in MAX.items():
        lines.append(f'gpu_steward_clock_max_hertz{{gpu="0",uuid="{UUID}",clock="{clock}"}} {mhz * 1e6}')
    return "\n".join(lines) + "\n"


class ColumnSpellings(unittest.TestCase):
    def run_with(self, columns, values=VALUES):
        with tempfile.TemporaryDirectory() as d:
            m, smi, out = (os.path.join(d, n) for n in ("m.txt", "smi.csv", "r.json"))
            with open(m, "w") as f:
                f.write(metrics())
            with open(smi, "w") as f:
                f.write(", ".join(["index", "uuid"] + [f"{c} [MHz]" for c in columns]) + "\n")
                f.write(", ".join(["0", UUID] + [str(v) for v in values]) + "\n")
            with redirect_stdout(io.StringIO()):
                rc = side_by_side.main([m, smi, "--json", out, "--strict"])
            with open(out) as f:
                return rc, {r["quantity"]: r for r in json.load(f)["gpus"][0]["rows"]}

    def check(self, columns):
        rc, rows = self.run_with(columns)
        self.assertEqual(rc, 0)
        labels = ["SM clock", "memory clock", "graphics clock", "video clock", "max SM clock",
                  "max memory clock"]
        for label, column, mhz in zip(labels, columns, VALUES):
            self.assertTrue(rows[label]["match"].startswith("yes"), rows[label])
            self.assertEqual(rows[label]["nvidia-smi"], str(mhz))
            self.assertEqual(rows[label]["column"], column)

    def test_driver_580_names(self):
        self.check(NEW)

    def test_older_names(self):
        self.check(OLD)

    def test_a_missing_column_names_both_spellings(self):
        _, rows = self.run_with(OLD[1:], VALUES[1:])
        self.assertEqual(rows["SM clock"]["match"], "not compared")
        self.assertIn("clocks.current.sm", rows["SM clock"]["nvidia-smi"])
        self.assertIn("clocks.sm", rows["SM clock"]["nvidia-smi"])


if __name__ == "__main__":
    unittest.main()
