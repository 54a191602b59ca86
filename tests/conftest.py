"""Shared test helpers: hardware capture data (tests/data) and the published peer vectors."""
from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=None)
def capture(name: str):
    """A committed capture file, loaded once (``np.load`` of tests/data/<name>)."""
    return dict(np.load(DATA / name))


def peer_dir() -> Path | None:
    env = os.environ.get("TCEMU_PEER_VECTORS")
    p = Path(env) if env else ROOT.parent / "shared" / "peer-vectors"
    return p if (p / "index.json").exists() else None


@pytest.fixture
def x64():
    """Run a test with jax_enable_x64 on (the f64 paths need it)."""
    import jax

    with jax.enable_x64(True):
        yield
