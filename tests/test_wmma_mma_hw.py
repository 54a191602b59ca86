"""Every wmma.mma form against the H200 (tests/data/wmma_mma_*_sm90.npz): a few hundred tiles of
random and adversarial inputs per main form (normal, all-positive, huge exponent spread, exact
cancellation, one dominant term, specials, large C, subnormals, overflow; integer extremes),
at value level and through the register file (load -> mma -> store)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tcemu
from tcemu._src.isa.parse import parse
from conftest import capture

FILES = {"f16": "wmma_mma_f16_sm90.npz", "bf16": "wmma_mma_bf16tf32_sm90.npz",
         "tf32": "wmma_mma_bf16tf32_sm90.npz", "f64": "wmma_mma_f64_sm90.npz", "int": "wmma_mma_int_sm90.npz",
         "b1": "wmma_mma_int_sm90.npz"}


def forms():
    out = []
    for name in sorted(set(FILES.values())):
        z = capture(name)
        out += sorted({k.rsplit(".", 1)[0] for k in z})
    return out


def _data(sp):
    ins = parse(sp)
    z = capture(FILES[ins.family])
    return ins, {k: z[f"{sp}.{k}"] for k in ("a", "b", "c", "d", "class", "classes", "dregs")}


_VIEW = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32, "f32": np.float32,
         "f64": np.float64, "s8": np.int8, "u8": np.uint8, "s4": np.int8, "u4": np.uint8, "b1": np.uint8,
         "s32": np.int32}


def typed(bits, etype):
    """Bit patterns (or integer values) of the capture -> the typed array tcemu.mma takes."""
    if etype in ("s8", "u8", "s4", "u4", "b1"):
        return jnp.asarray(bits.astype(_VIEW[etype]))
    if etype == "s32":
        return jnp.asarray(bits.astype(np.uint32).view(np.int32))
    store = {16: np.uint16, 32: np.uint32, 64: np.uint64}[np.dtype(_VIEW[etype]).itemsize * 8]
    return jnp.asarray(bits.astype(store).view(_VIEW[etype]))


def bits_of(x, etype):
    x = np.asarray(x)
    if etype == "s32":
        return x.view(np.uint32)
    return x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.dtype.itemsize])


def test_all_134_forms_captured():
    assert len(forms()) == 134


@pytest.mark.parametrize("sp", forms())
def test_value_level_matches_h200(sp):
    ins, z = _data(sp)
    ctx = jax.enable_x64(True) if ins.family == "f64" else _null()
    with ctx:
        d = tcemu.mma(sp, typed(z["a"], ins.atype), typed(z["b"], ins.btype), typed(z["c"], ins.ctype), arch="sm_90")
        got = bits_of(d, ins.dtype)
    want = z["d"].astype(got.dtype)
    bad = got != want
    per_class = {str(n): int(bad[z["class"] == i].sum()) for i, n in enumerate(z["classes"])}
    assert not bad.any(), f"mismatches per input class: {per_class}"


@pytest.mark.parametrize("sp", forms())
def test_register_level_matches_h200(sp):
    """wmma.load (A .alayout, B .blayout, C .row) -> wmma.mma -> D registers and wmma.store.d,
    one warp per captured tile (jax.vmap of the whole register-level program): D in memory for
    every tile, the D registers for the tiles whose registers the capture kept."""
    ins, z = _data(sp)
    ctx = jax.enable_x64(True) if ins.family == "f64" else _null()
    shape = ins.shape
    with ctx:
        ld = {m: tcemu.ptx(f"wmma.load.{m}.sync.aligned.{lay}.{shape}.{t}", arch="sm_90")
              for m, lay, t in (("a", ins.alayout, ins.atype), ("b", ins.blayout, ins.btype), ("c", "row", ins.ctype))}
        mma = tcemu.ptx(sp, arch="sm_90")
        st = tcemu.ptx(f"wmma.store.d.sync.aligned.row.{shape}.{ins.dtype}", arch="sm_90")
        na, nb, nc, nd = ld["a"].nregs, ld["b"].nregs, ld["c"].nregs, st.nregs
        ra, rb, rc = range(0, na), range(na, na + nb), range(na + nb, na + nb + nc)
        rd = range(na + nb + nc, na + nb + nc + nd)
        et = {"a": ins.atype, "b": ins.btype, "c": ins.ctype}
        ps = {"a": 0, "b": 1024, "c": 2048}

        def warp(a, b, c):
            mem = tcemu.memory(4096)
            for m, x in zip("abc", (a, b, c)):
                mem = tcemu.put_matrix(mem, x, p=ps[m], layout=ld[m].ins.layout, etype=et[m])
            regs = tcemu.regfile(na + nb + nc + nd)
            for m, r in zip("abc", (ra, rb, rc)):
                regs = ld[m](regs, mem, dst=r, p=ps[m])
            regs = mma(regs, d=rd, a=ra, b=rb, c=rc)
            out = st(mem, regs, src=rd, p=3072)
            return regs[:, rd.start:rd.stop], tcemu.get_matrix(out, (ins.m, ins.n), ins.dtype, p=3072)

        dregs, got = jax.jit(jax.vmap(warp))(*(typed(z[m], et[m]) for m in "abc"))  # every tile
        np.testing.assert_array_equal(np.asarray(dregs)[:len(z["dregs"])], z["dregs"])  # (registers kept for 8)
        np.testing.assert_array_equal(bits_of(got, ins.dtype), z["d"].astype(bits_of(got, ins.dtype).dtype))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
