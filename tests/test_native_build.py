"""Building the compiled kernels (tcemu/_src/native/build.py, toolchain.py) without a GPU: where
nvcc is found (pip wheels included, in fake site-packages trees) and what a wheel's nvcc is given,
the flags for every GPU architecture, the cache key, the one line a build prints, one build for
concurrent processes, a rebuild of a cached library that does not load, and the environment
variables read once per process with errors for bad values."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tcemu._src.native import build, toolchain
from tcemu._src.numerics import engine, fused_block
from tcemu._src.numerics import mma as mma_numerics

ROOT = Path(__file__).resolve().parents[1]
needs_cxx = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler")


def _exe(path: Path, body: str = "exit 0") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def _touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def test_nvcc_search_order(tmp_path):
    """$TCEMU_NVCC, $CUDA_HOME, $CUDA_PATH, the PATH, then the pip wheels' in site order
    (nvidia/cu13 for CUDA 13, nvidia/cuda_nvcc for CUDA 12); no executable, no candidate."""
    cu13 = _exe(tmp_path / "site1/nvidia/cu13/bin/nvcc")
    cu12 = _exe(tmp_path / "site2/nvidia/cuda_nvcc/bin/nvcc")
    _touch(tmp_path / "site2/nvidia/cublas/bin/nvcc")  # not executable
    sites = [str(tmp_path / "missing"), str(tmp_path / "site1"), str(tmp_path / "site2")]
    assert toolchain.nvcc_candidates({"PATH": ""}, sites)[:2] == [str(cu13), str(cu12)]
    explicit, home, cuda_path, on_path = (_exe(tmp_path / d / "bin/nvcc") for d in ("own", "home", "cpath", "path"))
    env = {"TCEMU_NVCC": str(explicit), "CUDA_HOME": str(tmp_path / "home"), "CUDA_PATH": str(tmp_path / "cpath"),
           "PATH": str(tmp_path / "path/bin")}
    want = [explicit, home, cuda_path, on_path, cu13, cu12]
    assert toolchain.nvcc_candidates(env, sites)[:6] == [str(p) for p in want]


def test_nvcc_explicit_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("TCEMU_NVCC", str(tmp_path / "nvcc"))
    with pytest.raises(RuntimeError, match="TCEMU_NVCC"):
        toolchain.nvcc()


def test_nvcc_found_in_sys_path_wheel(tmp_path, monkeypatch):
    """A wheel's nvcc under a sys.path entry is a candidate; with no variable set and no nvcc on the
    PATH, a wheel's is used (before /usr/local/cuda's)."""
    cu13 = _exe(tmp_path / "nvidia/cu13/bin/nvcc")
    for var in ("TCEMU_NVCC", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    found = toolchain.nvcc_candidates(os.environ, toolchain.site_dirs())
    assert str(cu13) in found and toolchain.nvcc() == found[0] and toolchain.is_wheel(found[0])


def test_wheel_flags_cuda13(tmp_path):
    """CUDA 13 wheels (one nvidia/cu13 tree): its headers (and CCCL's), the host compiler and the
    static runtime's directory."""
    site = tmp_path / "site"
    nvcc = _exe(site / "nvidia/cu13/bin/nvcc")
    _touch(site / "nvidia/cu13/include/cuda_runtime.h")
    (site / "nvidia/cu13/include/cccl").mkdir()
    for lib in ("libcudart_static.a", "libcudart.so.13"):
        _touch(site / "nvidia/cu13/lib" / lib)
    _touch(site / "nvidia/cudnn/include/cudnn.h")  # another wheel: not included
    cxx = _exe(tmp_path / "bin/g++-13")
    inc = site / "nvidia/cu13/include"
    assert toolchain.wheel_flags(str(nvcc), [str(site)], {"CXX": str(cxx)}) == [
        f"-I{inc}", "-isystem", str(inc / "cccl"), "-ccbin", str(cxx), f"-L{site / 'nvidia/cu13/lib'}"]


def test_wheel_flags_cuda12(tmp_path):
    """CUDA 12 wheels: nvcc's own headers and cuda_runtime's (another wheel, maybe another site
    directory), c++ from the PATH, and the shared runtime by its versioned name."""
    nvcc = _exe(tmp_path / "a/nvidia/cuda_nvcc/bin/nvcc")
    _touch(tmp_path / "a/nvidia/cuda_nvcc/include/crt/host_config.h")
    _touch(tmp_path / "b/nvidia/cuda_runtime/include/cuda_runtime.h")
    lib = tmp_path / "b/nvidia/cuda_runtime/lib"
    _touch(lib / "libcudart.so.12")
    cxx = _exe(tmp_path / "bin/c++")
    sites = [str(tmp_path / "a"), str(tmp_path / "b")]
    flags = toolchain.wheel_flags(str(nvcc), sites, {"PATH": str(tmp_path / "bin")})
    assert flags == [f"-I{tmp_path / 'a/nvidia/cuda_nvcc/include'}", f"-I{tmp_path / 'b/nvidia/cuda_runtime/include'}",
                     "-ccbin", str(cxx), "-cudart=none", f"-L{lib}", f"-Xlinker=-l:libcudart.so.12,-rpath,{lib}"]


def test_toolkit_nvcc_gets_no_flags(tmp_path):
    assert toolchain.wheel_flags(str(_exe(tmp_path / "cuda-13.0/bin/nvcc")), [], {}) == []


def test_gpu_build_targets_every_architecture(monkeypatch):
    """One -gencode per distinct compute capability of the devices, named in the message."""
    devices = [SimpleNamespace(compute_capability=cc) for cc in ("9.0", "8.0", "9.0")]
    monkeypatch.setattr(build.jax, "local_devices", lambda backend=None: devices)
    monkeypatch.setattr(build, "_nvcc", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(toolchain, "identity", lambda compiler, native=False: b"nvcc 13.0")
    calls = []
    monkeypatch.setattr(build, "_compile", lambda *args: calls.append(args) or Path("x.so"))
    build._build_gpu()
    what, takes, nvcc, flags = calls[0][:4]
    assert [f for f in flags if f.startswith("-gencode")] == ["-gencode=arch=compute_80,code=sm_80",
                                                              "-gencode=arch=compute_90,code=sm_90"]
    assert what == "the GPU kernel for sm_80, sm_90" and takes == "about 4 minutes" and calls[0][5] == [b"nvcc 13.0"]


def test_wheel_build_failure_says_what_to_install(tmp_path, monkeypatch):
    nvcc = _exe(tmp_path / "site/nvidia/cu13/bin/nvcc", 'echo "fatal error: nv/target: No such file" >&2; exit 1')
    monkeypatch.setenv("TCEMU_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(build, "_nvcc", lambda: str(nvcc))
    monkeypatch.setattr(build, "_capabilities", lambda: ["90"])
    with pytest.raises(RuntimeError, match="(?s)nv/target.*pip install nvidia-cuda-cccl"):
        build._build_gpu()


@needs_cxx
def test_compiler_identity():
    """The key names the compiler's version and what -march=native is here; a compiler that
    cannot say falls back to the CPU's flags."""
    native = toolchain.identity("c++", native=True)
    assert native.startswith(toolchain.identity("c++")) and native != toolchain.identity("c++")
    assert b"march=" in native or b"target-cpu" in native


def test_compiler_identity_fallback(tmp_path):
    cc = _exe(tmp_path / "cc", 'test "$1" = --version && echo "fakecc 1.0" || exit 1')
    ident = toolchain.identity(str(cc), native=True)
    assert b"fakecc 1.0" in ident and ident.endswith(toolchain._cpu_flags().encode())


def _tiny(tmp_path) -> tuple[Path, Path]:
    """A one-function C++ source, and a compiler that counts its runs in ``runs``."""
    src = tmp_path / "tiny.cc"
    src.write_text('extern "C" int tiny() { return 7; }\n')
    cc = _exe(tmp_path / "cc", f'echo run >> "{tmp_path / "runs"}"\nsleep 1\nexec c++ "$@"')
    return src, cc


def _runs(tmp_path) -> int:
    runs = tmp_path / "runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


@needs_cxx
def test_build_says_once_and_caches(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TCEMU_CACHE_DIR", str(tmp_path / "cache"))
    src, cc = _tiny(tmp_path)

    def make(stale=None):
        return build._compile("a test", "a second", str(cc), ["-shared", "-fPIC"], src, [b"k"], stale)

    path = make()
    said = f"tcemu: compiling a test with {cc} (a second, once; cached in {tmp_path / 'cache'})\n"
    assert capsys.readouterr().err == said
    assert make() == path and _runs(tmp_path) == 1 and capsys.readouterr().err == ""
    path.write_bytes(b"not a library")  # a cached library that does not load: built again, once
    assert build._open(make).tiny() == 7 and _runs(tmp_path) == 2


@needs_cxx
def test_truncated_library_is_built_again(tmp_path, monkeypatch):
    """A truncated library is not loaded (dlopen could crash on it) but built again."""
    monkeypatch.setenv("TCEMU_CACHE_DIR", str(tmp_path / "cache"))
    src, cc = _tiny(tmp_path)

    def make(stale=None):
        return build._compile("a test", "a second", str(cc), ["-shared", "-fPIC"], src, [b"k"], stale)

    path = make()
    assert not build._truncated(path)
    path.write_bytes(path.read_bytes()[:4096])
    assert build._truncated(path)
    assert build._open(make).tiny() == 7 and _runs(tmp_path) == 2
    assert not list((tmp_path / "cache").glob("tmp*")), "no temporary build directory is left"


_WORKER = """
import ctypes, sys, time
from pathlib import Path
from tcemu._src.native import build
tmp, i, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(tmp / f"ready{i}").touch()
while len(list(tmp.glob("ready*"))) < n:  # start building together
    time.sleep(0.01)
path = build._compile("a test", "a second", str(tmp / "cc"), ["-shared", "-fPIC"], tmp / "tiny.cc", [b"k"])
print(ctypes.CDLL(str(path)).tiny())
"""


@needs_cxx
def test_concurrent_processes_build_once(tmp_path):
    """Processes building the same library into a fresh cache at once: one compiles, all load it."""
    _tiny(tmp_path)
    n = 3
    env = dict(os.environ, TCEMU_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(tmp_path), str(i), str(n)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * n, [err for _, err in outs]
    assert [out for out, _ in outs] == ["7\n"] * n
    assert _runs(tmp_path) == 1
    assert sum(err.count("tcemu: compiling") for _, err in outs) == 1


SETTINGS = [("TCEMU_NATIVE", build._setting, "1", "1", "yes", "valid: 0 (off), 1 (required), auto"),
            ("TCEMU_ALIGN", engine.alignment_path, "int", "int", "foo", "valid: int, float"),
            ("TCEMU_UNROLL", fused_block.unroll_terms, "1", True, "-1", "valid: 0 (XLA reductions), 1 (unrolled)"),
            ("TCEMU_CHUNK_TERMS", mma_numerics.chunk_terms, "4096", 4096, "abc", "valid: a positive integer")]


@pytest.fixture
def reread():
    """The settings read afresh in a test, and again after it (the session's environment)."""
    build._reread_settings()
    yield
    build._reread_settings()


@pytest.mark.parametrize("name,read,value,parsed,bad,valid", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_setting_read_once(monkeypatch, reread, name, read, value, parsed, bad, valid):
    """Read at first use and kept for the process (a later change does nothing, as documented)."""
    monkeypatch.setenv(name, value)
    assert read() == parsed
    monkeypatch.setenv(name, bad)
    assert read() == parsed


@pytest.mark.parametrize("name,read,value,parsed,bad,valid", SETTINGS, ids=[s[0] for s in SETTINGS])
def test_setting_bad_value(monkeypatch, reread, name, read, value, parsed, bad, valid):
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=re.escape(f"{name}={bad!r}; {valid}")):
        read()


@pytest.mark.parametrize("bad", ["0", "-5", "1.5", ""])
def test_chunk_terms_values(monkeypatch, reread, bad):
    monkeypatch.setenv("TCEMU_CHUNK_TERMS", bad)
    if bad:
        with pytest.raises(ValueError, match="TCEMU_CHUNK_TERMS"):
            mma_numerics.chunk_terms()
    else:  # empty: unset
        assert mma_numerics.chunk_terms() in (1 << 23, 1 << 29)


def test_wheel_flags_prefer_nvcc_own_site(tmp_path):
    """A second, partial copy of the same wheel in another site directory (a torch venv's
    nvidia/cu13 with the runtime headers only) does not shadow the headers beside nvcc."""
    nvcc = _exe(tmp_path / "a/nvidia/cu13/bin/nvcc")
    _touch(tmp_path / "a/nvidia/cu13/include/cuda_runtime.h")
    _touch(tmp_path / "b/nvidia/cu13/include/cuda_runtime.h")
    flags = toolchain.wheel_flags(str(nvcc), [str(tmp_path / "a"), str(tmp_path / "b")], {"PATH": ""})
    assert flags == [f"-I{tmp_path / 'a/nvidia/cu13/include'}"]
