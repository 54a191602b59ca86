"""The corpus: the Python standard library's own ``.py`` sources, as bytes (vocabulary 256).

Files under ``sysconfig.get_paths()["stdlib"]``, except those in ``site-packages``, ``test``,
``tests`` and ``idlelib`` folders, in sorted order. A file goes to validation when the sha256 of
its relative path (POSIX form) is 0 mod 10, so the split is the same on every machine; the
corpus itself depends on the interpreter, whose version :func:`describe` records.

    >>> c = load()
    >>> x, y = c.sampler("train", batch=2, context=8, seed=0)()
    >>> x.shape, y.shape, bool((x[:, 1:] == y[:, :-1]).all())
    ((2, 8), (2, 8), True)
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import platform
import sysconfig
from pathlib import Path

import numpy as np

EXCLUDED_DIRS = frozenset({"site-packages", "test", "tests", "idlelib"})
VOCAB = 256


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def source_files(root: Path | None = None) -> list[str]:
    """Relative POSIX paths of the corpus files, sorted."""
    root = stdlib_root() if root is None else Path(root)
    paths = (p.relative_to(root) for p in root.rglob("*.py") if p.is_file())
    return sorted(p.as_posix() for p in paths if not EXCLUDED_DIRS & set(p.parts[:-1]))


def is_validation(relpath: str) -> bool:
    return int(hashlib.sha256(relpath.encode()).hexdigest(), 16) % 10 == 0


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Train and validation token streams (uint8, the files concatenated in sorted order)."""

    train: np.ndarray
    validation: np.ndarray
    train_files: tuple
    validation_files: tuple

    def describe(self) -> dict:
        """What the corpus was: the interpreter and its size."""
        return {"python": platform.python_version(), "stdlib": str(stdlib_root()),
                "files": {"train": len(self.train_files), "validation": len(self.validation_files)},
                "bytes": {"train": int(self.train.size), "validation": int(self.validation.size)}}

    def sampler(self, split: str, batch: int, context: int, seed: int):
        """A function returning (inputs, targets), uint8-valued int32 arrays of shape
        (batch, context): windows at random offsets drawn from ``np.random.default_rng(seed)``;
        targets are the inputs shifted by one byte."""
        tokens = {"train": self.train, "validation": self.validation}[split]
        rng = np.random.default_rng(seed)
        idx = np.arange(context + 1)

        def sample():
            starts = rng.integers(0, tokens.size - context - 1, size=batch)
            window = tokens[starts[:, None] + idx].astype(np.int32)
            return window[:, :-1], window[:, 1:]

        return sample


@functools.lru_cache(maxsize=2)
def load(root: str | None = None) -> Corpus:
    """Read the corpus (about 11 MB for Python 3.11; cached per process)."""
    base = stdlib_root() if root is None else Path(root)
    files = source_files(base)
    parts = {False: [], True: []}
    names = {False: [], True: []}
    for rel in files:
        val = is_validation(rel)
        parts[val].append(np.frombuffer((base / rel).read_bytes(), np.uint8))
        names[val].append(rel)
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.uint8)  # noqa: E731
    return Corpus(cat(parts[False]), cat(parts[True]), tuple(names[False]), tuple(names[True]))
