"""Architecture names: ``sm_XX`` targets and the GPU names users know them by.

    >>> from tcemu._src.arch import resolve
    >>> resolve("H100").sm, resolve("sm_90a").name
    (90, 'sm_90')
    >>> a = resolve("MI300X"); a.name, a.amd, a.sm        # AMD: gfx targets, no SM number
    ('gfx942', True, 0)
"""
from __future__ import annotations

import dataclasses
import difflib


@dataclasses.dataclass(frozen=True)
class Arch:
    """An architecture: its canonical ``sm_XX`` name, SM number and the GPU name it was given by
    (``None`` when given as ``sm_XX``). Every ``arch=`` argument takes one, or a string naming it.

    >>> import tcemu
    >>> a = tcemu.Arch("sm_90", 90, "H100")
    >>> str(a), a.sm
    ('sm_90 (H100)', 90)
    """

    name: str  # canonical sm_XX
    sm: int
    gpu: str | None = None  # the GPU name given, if any

    def __str__(self) -> str:
        return f"{self.name} ({self.gpu})" if self.gpu else self.name

    @property
    def amd(self) -> bool:
        """An AMD gfx target (its ``sm`` is 0: no NVIDIA instruction runs on it)."""
        return self.name in AMD


SM = {"sm_70": 70, "sm_72": 72, "sm_75": 75, "sm_80": 80, "sm_86": 86, "sm_87": 87, "sm_89": 89,
      "sm_90": 90, "sm_100": 100, "sm_120": 120}
GPUS = {"V100": "sm_70", "T4": "sm_75", "A100": "sm_80", "A30": "sm_80", "A2": "sm_86",
        "L40S": "sm_89", "Ada": "sm_89", "RTX1000Ada": "sm_89", "H100": "sm_90", "H200": "sm_90",
        "B200": "sm_100", "RTX5090": "sm_120", "RTXPRO6000": "sm_120",
        "MI100": "gfx908", "MI210": "gfx90a", "MI250": "gfx90a", "MI250X": "gfx90a",
        "MI300A": "gfx942", "MI300X": "gfx942", "MI325X": "gfx942"}
# AMD Instinct targets (LLVM AMDGPU processor names) and their matrix-core generation
AMD = {"gfx908": "CDNA1", "gfx90a": "CDNA2", "gfx942": "CDNA3"}


def resolve(arch) -> Arch:
    """An :class:`Arch` from ``"sm_90"``, ``"sm_90a"``, ``"H100"`` (case-insensitive) or an Arch."""
    if isinstance(arch, Arch):
        return arch
    if not isinstance(arch, str):
        raise TypeError(f"arch must be a string such as 'sm_90' or 'H100', got {type(arch).__name__}")
    key = arch.strip()
    low = key.lower()
    for gpu, sm in GPUS.items():
        if gpu.lower() == low:
            return Arch(sm, SM.get(sm, 0), gpu)
    if low in AMD:
        return Arch(low, 0)
    base = low[:-1] if low.endswith(("a", "f")) and low[:-1] in SM else low
    if base in SM:
        return Arch(base, SM[base])
    choices = sorted(SM) + sorted(AMD) + sorted(GPUS)
    close = difflib.get_close_matches(key, choices, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise ValueError(f"unknown arch {arch!r}{hint}; valid: {', '.join(choices)}")
