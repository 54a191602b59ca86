"""Building and loading the compiled kernels: ``blockfma.cc`` with the system's C++ compiler for
this CPU, ``blockfma_gpu.cu`` with ``nvcc`` (:mod:`.toolchain` finds it, pip wheels included) for
the compute capability of every GPU, each cached under ``$TCEMU_CACHE_DIR`` (default
``~/.cache/tcemu``) by its sources, jaxlib, the command, the compiler's version and the target,
and registered as XLA FFI targets. A build prints one line to stderr; concurrent processes build
once (a file lock) and a cached library that does not load is built again. ``TCEMU_NATIVE=0``
turns the kernels off, ``TCEMU_NATIVE=1`` makes a failed build an error; otherwise a failure
warns once and the pure-JAX engine runs (read once per process, at first use).

    >>> from tcemu._src.native.build import available
    >>> available() in (True, False)
    True
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import struct
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import jax

from tcemu._src.native import toolchain

try:
    import fcntl
except ImportError:  # Windows: no lock (concurrent builds repeat the work; each renames a whole file)
    fcntl = None

_SOURCE = Path(__file__).with_name("blockfma.cc")
_GPU_SOURCE = Path(__file__).with_name("blockfma_gpu.cu")
_HEADER = Path(__file__).with_name("blockfma.h")  # what the two kernels share
TARGET, GROUPED = "tcemu_blockfma_chains", "tcemu_grouped_chains"  # the FFI targets
_lock = threading.Lock()
_state: dict = {}


@functools.cache
def _setting() -> str:
    """``$TCEMU_NATIVE``, read once per process (:func:`_reread_settings` reads it again)."""
    env = os.environ.get("TCEMU_NATIVE", "auto")
    if env not in ("0", "1", "auto"):
        raise ValueError(f"TCEMU_NATIVE={env!r}; valid: 0 (off), 1 (required), auto")
    return env


def _reread_settings() -> None:
    """Forget the environment variables read once per process (``TCEMU_NATIVE``, ``TCEMU_ALIGN``,
    ``TCEMU_UNROLL``, ``TCEMU_CHUNK_TERMS``): their next use reads them again (for tests)."""
    from tcemu._src.numerics import engine, fused_block, mma

    for read in (_setting, engine.alignment_path, fused_block.unroll_terms, mma.chunk_terms):
        read.cache_clear()


def _cache_dir() -> Path:
    env = os.environ.get("TCEMU_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tcemu"


def _compile(what: str, takes: str, compiler: str, flags: list[str], source: Path, key_parts: list[bytes],
             stale: os.stat_result | None = None) -> Path:
    """``source`` compiled by ``compiler`` into a shared library in the cache, once: named by the
    sources, the shared header, jaxlib, the command and ``key_parts``; built under a lock on the
    cache entry (concurrent processes wait for one build) into a temporary file renamed into place.
    ``stale``: the entry's file that failed to load, built again. A build says on stderr that it
    compiles ``what`` (it ``takes`` about so long)."""
    import jaxlib

    key = hashlib.sha256(b"\0".join([source.read_bytes(), _HEADER.read_bytes(), jaxlib.__version__.encode(),
                                     " ".join([compiler] + flags).encode(), *key_parts])).hexdigest()[:16]
    out = _cache_dir() / f"{source.stem}-{key}.so"

    def cached() -> bool:
        return out.exists() and not (stale is not None and os.path.samestat(out.stat(), stale))

    if cached():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        if fcntl:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
        if cached():  # another process built it while this one waited
            return out
        print(f"tcemu: compiling {what} with {compiler} ({takes}, once; cached in {out.parent})", file=sys.stderr,
              flush=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            tmp_out = Path(tmp) / out.name
            cmd = [compiler, *flags, f"-I{jax.ffi.include_dir()}", str(source), "-o", str(tmp_out)]
            res = subprocess.run(cmd, capture_output=True, text=True)
            if res.returncode:
                raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-2000:]}")
            os.replace(tmp_out, out)  # atomic: a reader sees no file or a complete one
    return out


def _build(stale: os.stat_result | None = None) -> Path:
    """Compile blockfma.cc for this machine (once; cached by source, jaxlib, compiler and CPU)."""
    # -ffp-contract=fast: the kernel's float products are exact (its sums of products may fuse)
    flags = ["-O3", "-march=native", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC", "-pthread",
             "-Wno-psabi"]
    cxx = os.environ.get("CXX", "c++")
    return _compile("the CPU kernel", "about 10 seconds", cxx, flags, _SOURCE,
                    [toolchain.identity(cxx, native=True)], stale)


def _nvcc() -> str | None:
    """The CUDA compiler (:func:`.toolchain.nvcc`), or None."""
    return toolchain.nvcc()


def _capabilities() -> list[str]:
    """The distinct compute capabilities of this process's CUDA devices, as nvcc spells them (``90``)."""
    ccs = {getattr(d, "compute_capability", None) for d in jax.local_devices(backend="gpu")}
    if not all(ccs):
        raise RuntimeError("a GPU reports no compute capability (not a CUDA device)")
    return sorted(str(cc).replace(".", "") for cc in ccs)


def _build_gpu(stale: os.stat_result | None = None) -> Path:
    """Compile blockfma_gpu.cu for this machine's GPUs (once; cached by source, jaxlib, nvcc, GPUs)."""
    nvcc = _nvcc()
    if nvcc is None:
        raise RuntimeError("no nvcc found: set TCEMU_NVCC or CUDA_HOME, put nvcc on the PATH, or install "
                           "jax[cuda13] (its wheels include nvcc)")
    sms = _capabilities()
    flags = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
             *(f"-gencode=arch=compute_{sm},code=sm_{sm}" for sm in sms),
             *toolchain.wheel_flags(nvcc, toolchain.site_dirs(), os.environ)]
    what = f"the GPU kernel for {', '.join(f'sm_{sm}' for sm in sms)}"
    try:
        return _compile(what, f"about {2 * len(sms)} minutes", nvcc, flags, _GPU_SOURCE, [toolchain.identity(nvcc)],
                        stale)
    except RuntimeError as e:
        if toolchain.is_wheel(nvcc):
            raise RuntimeError(f"{e}\n{toolchain.WHEEL_HINT}") from None
        raise


def _truncated(path: Path) -> bool:
    """Whether a 64-bit little-endian ELF file ends before its section headers do (dlopen of a
    truncated library can crash the process with SIGBUS instead of failing)."""
    with open(path, "rb") as f:
        head = f.read(64)
    if len(head) < 64 or head[:6] != b"\x7fELF\x02\x01":
        return False  # too short or not such a file: dlopen fails cleanly
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", head, 0x3A)
    return path.stat().st_size < shoff + shentsize * shnum


def _open(build) -> ctypes.CDLL:
    """The library ``build()`` returns, loaded; one that does not load (truncated, or corrupt) is
    built again, once."""
    path = build()
    try:
        if _truncated(path):
            raise OSError(f"{path} is truncated")
        return ctypes.CDLL(str(path))
    except OSError:
        return ctypes.CDLL(str(build(path.stat())))


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
                lib = _open(build)
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
