"""The command line: demo, layout (text and PNG)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tcemu.__main__ import main


def test_layout_text(capsys):
    assert main(["layout", "wmma.load.a.sync.aligned.row.m16n16k16.f16", "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "2 copies of each element" in out
    first_row = out.splitlines()[2].split()
    assert first_row[:3] == ["0", "T0:x0.0", "T0:x0.1"]


@pytest.mark.parametrize("spelling,matrix", [("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "b"),
                                             ("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "a"),
                                             ("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", "d")])
def test_layout_png(tmp_path, spelling, matrix):
    png = tmp_path / "layout.png"
    assert main(["layout", spelling, "--matrix", matrix, "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_demo_runs_and_reports_errors():
    r = subprocess.run([sys.executable, "-m", "tcemu", "demo", "--k", "256", "--m", "16"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "bits equal to value-level tcemu.mma: True" in r.stdout
    lines = {ln.split()[0]: ln.split() for ln in r.stdout.splitlines() if ln.strip().startswith(("V100", "H100"))}
    assert float(lines["V100"][3]) > float(lines["H100"][3])  # fewer alignment bits -> larger error
