"""Building and loading the compiled kernels: ``blockfma.cc`` with the system's C++ compiler for
this CPU, ``blockfma_gpu.cu`` with ``nvcc`` for the GPU's compute capability, each cached under
``$TCEMU_CACHE_DIR`` (default ``~/.cache/tcemu``) by its sources, jaxlib, the command and the
target, and registered as XLA FFI targets. ``TCEMU_NATIVE=0`` turns the kernels off,
``TCEMU_NATIVE=1`` makes a failed build an error; otherwise a failure warns once and the
pure-JAX engine runs.

    >>> from tcemu._src.native.build import available
    >>> available() in (True, False)
    True
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import jax

_SOURCE = Path(__file__).with_name("blockfma.cc")
_GPU_SOURCE = Path(__file__).with_name("blockfma_gpu.cu")
_HEADER = Path(__file__).with_name("blockfma.h")  # what the two kernels share
TARGET, GROUPED = "tcemu_blockfma_chains", "tcemu_grouped_chains"  # the FFI targets
_lock = threading.Lock()
_state: dict = {}


def _setting() -> str:
    env = os.environ.get("TCEMU_NATIVE", "auto")
    if env not in ("0", "1", "auto"):
        raise ValueError(f"TCEMU_NATIVE={env!r}; valid: 0 (off), 1 (required), auto")
    return env


def _cache_dir() -> Path:
    env = os.environ.get("TCEMU_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tcemu"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return platform.processor()


def _compile(compiler: str, flags: list[str], source: Path, key_parts: list[bytes]) -> Path:
    """``source`` compiled by ``compiler`` into a shared library in the cache (once: named by the
    sources, the shared header, jaxlib, the command and ``key_parts``)."""
    import jaxlib

    key = hashlib.sha256(b"\0".join([source.read_bytes(), _HEADER.read_bytes(), jaxlib.__version__.encode(),
                                     " ".join([compiler] + flags).encode(), *key_parts])).hexdigest()[:16]
    out = _cache_dir() / f"{source.stem}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_out = Path(tmp) / out.name
        cmd = [compiler, *flags, f"-I{jax.ffi.include_dir()}", str(source), "-o", str(tmp_out)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
        os.replace(tmp_out, out)  # atomic: concurrent builds all end with one complete file
    return out


def _build() -> Path:
    """Compile blockfma.cc for this machine (once; cached by source, jaxlib and CPU)."""
    # -ffp-contract=fast: the kernel's float products are exact (its sums of products may fuse)
    flags = ["-O3", "-march=native", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC", "-pthread",
             "-Wno-psabi"]
    return _compile(os.environ.get("CXX", "c++"), flags, _SOURCE,
                    [platform.machine().encode(), _cpu_flags().encode()])


def _nvcc() -> str | None:
    """The CUDA compiler: ``$TCEMU_NVCC``, ``$CUDA_HOME/bin/nvcc``, ``nvcc`` on the PATH, or the
    default CUDA install's."""
    import shutil

    for cand in (os.environ.get("TCEMU_NVCC"),
                 *(os.path.join(os.environ[v], "bin", "nvcc") for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)),
                 shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def _capability() -> str:
    """The compute capability of the first CUDA device, as nvcc spells it (``90`` for sm_90)."""
    cc = getattr(jax.devices("gpu")[0], "compute_capability", None)
    if not cc:
        raise RuntimeError("the GPU reports no compute capability (not a CUDA device)")
    return str(cc).replace(".", "")


def _build_gpu() -> Path:
    """Compile blockfma_gpu.cu for this machine's GPU (once; cached by source, jaxlib, nvcc, GPU)."""
    nvcc = _nvcc()
    if nvcc is None:
        raise RuntimeError("no nvcc found (set TCEMU_NVCC or CUDA_HOME)")
    sm = _capability()
    flags = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{sm},code=sm_{sm}"]
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    return _compile(nvcc, flags, _GPU_SOURCE, [version.encode()])


def _gpu() -> bool:
    """Whether the default backend is XLA's CUDA backend."""
    if jax.default_backend() != "gpu":
        return False
    return "cuda" in jax.devices()[0].client.platform_version.lower()


def _load(which: str, build, targets: dict[str, str], platform_name: str) -> bool:
    """Build (once) and register kernel ``which`` ("CPU" or "GPU"): its FFI handlers ``targets``
    (registered name: symbol) for ``platform_name``; a failure warns and leaves the pure-JAX path
    (``TCEMU_NATIVE=1``: raises)."""
    setting = _setting()
    if setting == "0":
        return False
    with _lock:
        if which not in _state:
            try:
                lib = ctypes.CDLL(str(build()))
                for name, symbol in targets.items():
                    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)), platform=platform_name)
                _state[which] = (True, lib)
            except Exception as e:  # noqa: BLE001 - any build or load failure means: use the JAX path
                _state[which] = (False, f"{type(e).__name__}: {e}")
                if setting == "1":
                    raise RuntimeError(f"TCEMU_NATIVE=1 but the {which} kernel could not be built: {_state[which][1]}")
                warnings.warn(f"tcemu: {which} kernel unavailable, using the slower pure-JAX path ({_state[which][1]})",
                              RuntimeWarning, stacklevel=4)
    return _state[which][0]


def _error(which: str) -> str:
    ok, detail = _state.get(which, (False, "TCEMU_NATIVE=0"))
    return "TCEMU_NATIVE=0" if ok else detail


def available() -> bool:
    """Whether the compiled CPU kernel is built and registered (building it on the first call)."""
    return _load("CPU", _build, {TARGET: TARGET, GROUPED: GROUPED}, "cpu")


def available_gpu() -> bool:
    """Whether the GPU kernel is built and registered for the CUDA backend (building it on the
    first call)."""
    return _load("GPU", _build_gpu, {TARGET: f"{TARGET}_gpu", GROUPED: f"{GROUPED}_gpu"}, "CUDA")
