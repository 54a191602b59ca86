"""The command line: demo, layout (text and PNG); bad arguments: tests/test_validation_cli.py."""
from __future__ import annotations

import subprocess
import sys

import pytest

import tcemu
from tcemu.__main__ import main


def test_layout_text(capsys):
    assert main(["layout", "wmma.load.a.sync.aligned.row.m16n16k16.f16", "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out
    assert "2 copies of each element" in out
    first_row = out.splitlines()[2].split()
    assert first_row[:3] == ["0", "T0:x0.0", "T0:x0.1"]


@pytest.mark.parametrize("spelling,matrix", [("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", "b"),
                                             ("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16", None),
                                             ("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", "d")])
def test_layout_png(tmp_path, spelling, matrix):
    png = tmp_path / "layout.png"
    assert main(["layout", spelling, "--png", str(png)] + (["--matrix", matrix] if matrix else [])) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_layout_wgmma_descriptor(capsys, tmp_path):
    """B of m64n8k16 f16 through a 128B-swizzled K-major descriptor at 1024: row k of B is byte
    2 k of each N row; N row n starts at 1024 + 128 n, its 16-byte units XORed with n."""
    sp = "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16"
    desc = tcemu.wgmma_descriptor(start=1024, lbo=16, sbo=1024, swizzle="128B")
    assert main(["layout", sp, "--desc", hex(desc)]) == 0
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines()[3:]]
    want = [[1024 + 128 * n + (((k * 2 // 16) ^ n) * 16) + (k * 2) % 16 for n in range(8)] for k in range(16)]
    assert [[int(x) for x in r[1:]] for r in rows] == want
    png = tmp_path / "smem.png"
    assert main(["layout", sp, "--desc", str(desc), "--tnsp", "--png", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["layout", sp, "--matrix", "d"]) == 0
    assert "64 x 8, 4 registers/lane" in capsys.readouterr().out


def test_demo_runs_and_reports_errors(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run([sys.executable, "-m", "tcemu", "demo", "--kmax", "256", "--outputs", "64",
                        "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "bits equal to value-level tcemu.mma: True" in r.stdout
    rows = {ln[:36].strip(): ln[36:].split() for ln in r.stdout.splitlines()
            if ln.startswith("   ") and ln[36:].split()[-1:] and ln[36:].split()[-1][0].isdigit()}
    err = lambda label: float(rows[label][-1])  # max relative error at K = 256
    assert err("V100 f16") > err("A100 f16") > err("H100 f16")  # 23 < 24 < 25 alignment bits
    assert err("H100 e4m3") > 2 * err("H100 e4m3 + promotion/128")
    assert err("B200 e4m3") < 1e-5 < err("H100 e4m3")
    csv = (tmp_path / "demo.csv").read_text().splitlines()
    assert len(csv) > 10 and "," in csv[0]
    assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args", [["layout", "wmma.load.a.sync.aligned.row.m16n16k16.f16", "--arch", "sm_80"],
                                  ["probe", "--arch", "H100", "--format", "bf16"]])
def test_output_piped_into_head_stops_quietly(args):
    """A reader that closes the pipe early (``| head -1``) gets its line and no traceback."""
    cmd = " ".join([sys.executable, "-m", "tcemu", *args]) + " | head -1"
    out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() and out.stderr == ""
