"""The compilers of the kernels and what they need: where ``nvcc`` is (the explicit variables, the
``PATH``, NVIDIA's pip wheels, the default CUDA install), the flags a pip wheel's ``nvcc`` lacks
(no toolkit tree around it: headers, host compiler, CUDA runtime), and what a compiler and
``-march=native`` are here (part of the cache key, so that an upgrade or another CPU rebuilds).

    >>> import sys
    >>> from tcemu._src.native.toolchain import nvcc_candidates
    >>> nvcc_candidates({"TCEMU_NVCC": sys.executable, "PATH": ""}, sites=[])[0] == sys.executable
    True
"""
from __future__ import annotations

import os
import platform
import shutil
import site
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

# what a failed build with a wheel's nvcc adds to its error
WHEEL_HINT = ("nvcc from NVIDIA's pip wheels takes the CUDA headers from nvidia-cuda-runtime, nvidia-cuda-crt and "
              "nvidia-cuda-cccl (jax[cuda13] installs all but nvidia-cuda-cccl: pip install nvidia-cuda-cccl)")


def _executable(path: str | None) -> bool:
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def site_dirs() -> list[str]:
    """Where pip wheels may be installed: the parents of the ``nvidia`` namespace package (the one
    NVIDIA's wheels share), every ``sys.path`` entry and the site-packages directories."""
    dirs = []
    try:
        import nvidia

        dirs += [os.path.dirname(p) for p in nvidia.__path__]
    except ImportError:
        pass
    dirs += [*sys.path, *getattr(site, "getsitepackages", list)()]
    return list(dict.fromkeys(d for d in dirs if d))


def nvcc_candidates(environ: Mapping[str, str], sites: Iterable[str]) -> list[str]:
    """The executable ``nvcc``s, in the order tried: ``$TCEMU_NVCC``, ``$CUDA_HOME/bin/nvcc``,
    ``$CUDA_PATH/bin/nvcc``, ``nvcc`` on ``$PATH``, the pip wheels' (``nvidia/*/bin/nvcc`` under
    each of ``sites``: ``nvidia/cu13`` for CUDA 13, ``nvidia/cuda_nvcc`` for CUDA 12), then
    ``/usr/local/cuda/bin/nvcc``."""
    found = [environ.get("TCEMU_NVCC"),
             *(os.path.join(environ[v], "bin", "nvcc") for v in ("CUDA_HOME", "CUDA_PATH") if environ.get(v)),
             shutil.which("nvcc", path=environ.get("PATH", "")),
             *(str(p) for d in sites for p in sorted(Path(d).glob("nvidia/*/bin/nvcc"))),
             "/usr/local/cuda/bin/nvcc"]
    return list(dict.fromkeys(c for c in found if _executable(c)))


def nvcc() -> str | None:
    """The first of :func:`nvcc_candidates` here (None: no nvcc); a ``$TCEMU_NVCC`` that is no
    executable is an error, not skipped."""
    env = os.environ.get("TCEMU_NVCC")
    if env and not _executable(env):
        raise RuntimeError(f"TCEMU_NVCC={env!r} is not an executable file; valid: the path of nvcc")
    found = nvcc_candidates(os.environ, site_dirs())
    return found[0] if found else None


def wheel_flags(nvcc_path: str, sites: Iterable[str], environ: Mapping[str, str]) -> list[str]:
    """What an ``nvcc`` of NVIDIA's pip wheels needs that a toolkit install's ``nvcc.profile``
    provides: ``-I`` for the wheels' CUDA headers (its own ``include``, those holding
    ``cuda_runtime.h`` or CCCL's ``nv/target``, CUDA 13's ``include/cccl``; of each wheel the copy
    beside this ``nvcc`` first, another site directory's only where it has none), ``-ccbin`` (``$CXX``
    or ``c++``) and the CUDA runtime: its static library's directory, or else the shared
    ``libcudart.so.N`` (the wheels ship no ``libcudart.so`` for ``-lcudart``). Other ``nvcc``s:
    none."""
    if not is_wheel(nvcc_path):
        return []
    root = Path(nvcc_path).parent.parent
    packages = {}  # one directory a package name, nvcc's own site first (another site's copy may be partial)
    for p in [root, *sorted(root.parent.iterdir()), *(p for d in sites for p in sorted(Path(d).glob("nvidia/*")))]:
        packages.setdefault(p.name, p)
    packages = list(packages.values())
    inc = [p / "include" for p in packages]
    flags = [f"-I{d}" for d in inc if (d / "cuda_runtime.h").is_file() or (d / "nv" / "target").is_file()
             or (d == root / "include" and d.is_dir())]
    flags += [f for d in inc if (d / "cccl").is_dir() for f in ("-isystem", str(d / "cccl"))]
    host = shutil.which(environ.get("CXX") or "c++", path=environ.get("PATH", ""))
    flags += ["-ccbin", host] if host else []
    libs = [p / "lib" for p in packages if any((p / "lib").glob("libcudart*"))]
    if not libs:
        return flags
    if (libs[0] / "libcudart_static.a").is_file():
        return [*flags, f"-L{libs[0]}"]
    shared = sorted(libs[0].glob("libcudart.so*"), key=lambda p: len(p.name))[-1]  # libcudart.so.12 over .so
    return [*flags, "-cudart=none", f"-L{libs[0]}", f"-Xlinker=-l:{shared.name},-rpath,{libs[0]}"]


def is_wheel(nvcc_path: str) -> bool:
    """Whether ``nvcc_path`` is an ``nvcc`` of NVIDIA's pip wheels (``.../nvidia/<package>/bin/nvcc``)."""
    return Path(nvcc_path).parent.parent.parent.name == "nvidia"


def _run(cmd: list[str]) -> subprocess.CompletedProcess | None:
    try:  # from /: clang's -### lines name the working directory
        return subprocess.run(cmd, capture_output=True, text=True, cwd="/", timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def identity(compiler: str, native: bool = False) -> bytes:
    """The compiler's ``--version`` and, with ``native``, what ``-march=native`` resolves to on
    this CPU (the compiler's ``-###`` line: gcc's ``-march=znver3 -mavx512f ...``, clang's
    ``-target-cpu``/``-target-feature``), or where the compiler cannot say, ``/proc/cpuinfo``'s
    flags."""
    parts = [platform.machine()]
    version = _run([compiler, "--version"])
    parts.append(version.stdout if version else "")
    if native:
        target = _run([compiler, "-march=native", "-###", "-E", "-x", "c++", os.devnull])
        parts.append(target.stderr if target and target.returncode == 0 else _cpu_flags())
    return "\0".join(parts).encode()


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), platform.processor())
    except OSError:
        return platform.processor()
