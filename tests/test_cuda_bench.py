"""benchmarks/cuda_bench.py keeps working where CI runs: its quick mode on the CPU (tiny random
models, graphs off, the static shapes the graphs would capture) prints every figure it measures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_cuda_bench_prints_its_table(tmp_path, demo):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cuda_bench.py"), "--quick", "--out",
                          str(tmp_path / "models"), "--widths", "1,3", "--tokenizer", str(demo["hf"])],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    summary = json.loads(text.split("=== summary\n", 1)[1])
    assert summary["card"] == "CPU" and summary["bandwidth_GBps"] > 0 and summary["bound_ms"] > 0
    widths = [row["width"] for row in summary["passes"]]
    assert widths == [1, 3]
    for row in summary["passes"]:
        assert all(row[k] > 0 for k in ("transformers", "lean eager", "lean static shapes"))
    assert 0 < summary["draft_over_target"]
    loop = {row["draft"]: row for row in summary["loop"]}
    assert loop["none"]["acceptance"] is None and loop["none"]["tokens_per_pass"] == 1.0
    # the planted pair computes one token map, so its draft is accepted: the loop's ceiling is measured
    assert loop["tiny-planted"]["acceptance"] > 0.9 and loop["tiny-planted"]["tokens_per_pass"] > 2
    assert "--- tandem-cli bench, draft ngram" in text and "Tandem" in text  # the bench's own table


def test_the_smoke_check_compares_graphed_and_eager_tokens(tmp_path, demo):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cuda_bench.py"), "--smoke", "--out",
                          str(tmp_path / "models"), "--tokenizer", str(demo["hf"])],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "the same tokens" in out.stdout and "passes: lean step" in out.stdout


def test_quick_cuda_gguf_prints_the_ggufs_pass_costs(tmp_path):
    """benchmarks/cuda_gguf.py on the CPU: writes its random Q4_K_M file, loads it into the GPU's
    modules (tinygemm's CPU kernel), and prints a pass's cost by width against its bound."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "cuda_gguf.py"), "--quick", "--out",
                          str(tmp_path / "files"), "--widths", "1,3", "--repeats", "2"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "4-bit GGUF (int4 g32 from Q4_K x12; bfloat16 from" in out.stdout
    row = next(line for line in out.stdout.splitlines() if line.startswith("| GGUF Q4_K_M |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[1]) > 0 and all(float(c.split(" ")[0]) > 0 for c in cells[2:4])
