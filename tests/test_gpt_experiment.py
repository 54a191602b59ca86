"""Smoke test of the GPT experiment (``experiments/gpt``): the corpus loader is deterministic and its
split disjoint, and two training steps of the tiny model under an emulated policy give finite
losses that differ from native float32's, with every GEMM of the model emulated."""
from __future__ import annotations

import sys

import numpy as np
import pytest

from conftest import ROOT

pytest.importorskip("flax")
pytest.importorskip("optax")
sys.path.insert(0, str(ROOT / "experiments" / "gpt"))
import data  # noqa: E402
import train  # noqa: E402


@pytest.fixture(autouse=True)
def _float32_model():
    """The model takes JAX's default dtypes, float64 under ``TCEMU_X64=1`` (no tensor-core GEMM)."""
    import jax

    with jax.enable_x64(False):
        yield


def test_corpus_split_and_sampler():
    corpus = data.load()
    files = data.source_files()
    assert set(corpus.train_files).isdisjoint(corpus.validation_files)
    assert sorted(corpus.train_files + corpus.validation_files) == files
    assert all(data.is_validation(f) for f in corpus.validation_files)
    assert 0.03 < len(corpus.validation_files) / len(files) < 0.2
    assert not any(set(f.split("/")[:-1]) & data.EXCLUDED_DIRS for f in files)
    info = corpus.describe()
    assert info["bytes"]["train"] == corpus.train.size > corpus.validation.size == info["bytes"]["validation"] > 0
    assert info["python"].count(".") == 2
    a = corpus.sampler("train", 4, 16, seed=3)
    b = corpus.sampler("train", 4, 16, seed=3)
    for _ in range(2):
        (xa, ya), (xb, yb) = a(), b()
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    np.testing.assert_array_equal(xa[:, 1:], ya[:, :-1])
    assert not np.array_equal(corpus.sampler("train", 4, 16, seed=4)()[0], xa)


def test_two_emulated_steps_differ_from_exact():
    corpus = data.load()
    settings = train.Settings.make("tiny", steps=2, batch=4)
    exact = train.train("exact", settings, corpus, log=None)
    fp8 = train.train("h100-fp8", settings, corpus, log=None)
    for r in (exact, fp8):
        assert np.isfinite(r["train_loss"]).all() and np.isfinite([v for _, v in r["val_loss"]]).all()
        assert 4.0 < r["train_loss"][0] < 7.0  # about ln(256) before training
    assert fp8["train_loss"] != exact["train_loss"]
    assert abs(fp8["train_loss"][0] - exact["train_loss"][0]) < 0.1
    layers = train.gpt.SIZES["tiny"].layers
    assert fp8["emulate"]["status"] == {"emulated": 8 * layers + 1}  # q, k, v, scores, mix, out, fc, proj; head
    assert exact["emulate"] is None
