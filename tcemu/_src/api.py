"""The public entry points: ``ptx`` (register level), ``mma`` (value level), ``regfile``."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from tcemu._src import formats as fm
from tcemu._src.arch import resolve
from tcemu._src.checks import check_key
from tcemu._src.isa import parse as P
from tcemu._src.isa import sparse as SP
from tcemu._src.isa import wgmma as WG
from tcemu._src.isa import wgmma_sp as WSP
from tcemu._src.isa import wmma as W
from tcemu._src.isa.targets import check_arch
from tcemu._src.numerics import engine
from tcemu._src.numerics import mma as mma_numerics
from tcemu._src.numerics.presets import check_model


def regfile(nregs: int, lanes: int = 32):
    """A warp's register file: zeros of shape ``(32, nregs)``, ``uint32``; ``lanes=128`` gives a
    Hopper warpgroup's (``wgmma``), lane ``32 w + l`` being lane ``l`` of warp ``w``; ``lanes=64``
    an AMD wavefront's VGPRs (``v_mfma_...``).

    >>> import numpy as np, tcemu
    >>> regs = tcemu.regfile(8)
    >>> regs.shape, regs.dtype
    ((32, 8), dtype('uint32'))
    >>> mem = tcemu.put_matrix(tcemu.memory(512), np.full((16, 16), 1.5, np.float16))
    >>> ld_a = tcemu.ptx("wmma.load.a.sync.aligned.row.m16n16k16.f16", arch="sm_90")
    >>> hex(int(ld_a(regs, mem, dst=range(8), p=0)[0, 0]))       # two f16 1.5 in lane 0's register 0
    '0x3e003e00'
    """
    from tcemu._src.memory import is_integer_value

    if not is_integer_value(nregs):
        raise TypeError(f"regfile: nregs must be an integer, got {nregs!r} ({type(nregs).__name__})")
    if nregs < 1:
        raise ValueError(f"regfile: nregs must be >= 1, got {nregs}")
    if lanes not in (32, 64, 128) or isinstance(lanes, bool):
        raise ValueError(f"regfile: lanes must be 32 (a warp), 64 (an AMD wavefront) or 128 (a warpgroup), "
                         f"got {lanes!r}")
    return jnp.zeros((int(lanes), int(nregs)), jnp.uint32)


def ptx(spelling: str, arch="sm_90", *, model=None):
    """The instruction ``spelling`` as a pure, jit-compiled function over a warp's registers
    (a warpgroup's ``(128, nregs)`` for ``wgmma.mma_async``, which reads shared memory through
    descriptors: :class:`tcemu.WgmmaDescriptor`).

    ``arch``: "sm_70" ... "sm_120" or a GPU name ("V100", "A100", "H100", "RTX5090", ...). ``model``
    (floating-point MMAs only): a :class:`tcemu.BlockFMA` or :class:`tcemu.ArchNumerics` replacing
    the architecture's numerics preset.

    >>> import tcemu
    >>> ld_a = tcemu.ptx("wmma.load.a.sync.aligned.row.m16n16k16.f16", arch="sm_90")
    >>> ld_a.fragment.copies      # the H200 keeps every A element twice
    2
    """
    a = resolve(arch)
    if isinstance(spelling, str) and spelling.strip().startswith("v_mfma"):
        from tcemu._src.isa.mfma import parse_mfma
        from tcemu._src.isa.mfma_regs import MfmaRegs

        check_model(model, repr(spelling))
        return MfmaRegs(parse_mfma(spelling, arch), a, model)
    ins = P.parse(spelling)
    if isinstance(ins, P.Tcgen05):
        raise P.Unsupported(f"{spelling!r}: tcgen05.mma works on tensor memory and shared-memory descriptors; "
                            "tcemu emulates it at value level only: use tcemu.mma")
    if isinstance(ins, (P.Mma, P.WgmmaSync)):  # the architecture first, before what tcemu emulates of it
        check_arch(ins, a)
    if isinstance(ins, P.WgmmaSync):
        if model is not None:
            raise ValueError(f"{spelling!r}: model= applies to floating-point MMAs only")
        return WG.WgmmaSyncRegs(ins, a)
    _check_model(ins, model)
    if isinstance(ins, P.WmmaLoad):
        return W.WmmaLoad_(ins, a)
    if isinstance(ins, P.WmmaStore):
        return W.WmmaStore_(ins, a)
    if isinstance(ins, P.MatrixMove):
        from tcemu._src.isa import matrix_move as MM

        return (MM.LdMatrix if ins.op == "ld" else MM.StMatrix)(ins, a)
    if ins.kind == "mma.sp":
        return SP.MmaSpRegs(ins, a, model)
    if isinstance(ins, P.SparseMma):
        return WSP.WgmmaSpRegs(ins, a, model)
    if ins.kind == "wmma":
        return W.MmaRegs(ins, a, W.wmma_mma_fragments(a, ins), model)
    if ins.kind == "mma":
        cls = W.MmaBlockScaleRegs if ins.scale_vec else W.MmaRegs
        return cls(ins, a, W.mma_sync_fragments(ins), model)
    return WG.WgmmaRegs(ins, a, model)


def _check_model(ins, model):
    """``model`` must be a BlockFMA, an ArchNumerics or None, and only for floating-point MMAs."""
    check_model(model, repr(ins.spelling))
    if model is not None and not (isinstance(ins, P.Mma) and ins.family not in ("int", "b1", "f64")):
        raise ValueError(f"{ins.spelling!r}: model= applies to floating-point MMAs (f16, bf16, tf32, e4m3/e5m2) "
                         "only; this instruction's numerics are fixed (exact integers, f64 FMAs, or no arithmetic)")


# value range of the narrow integer types; the register path reads their low bits
_INT_RANGE = {"s4": (-8, 7), "u4": (0, 15), "b1": (0, 1)}


def _codes(x, etype, name, spelling):
    """fp6/fp4 elements and scale factors: an ml_dtypes array of ``etype``'s value dtype (numpy
    for fp6, which JAX cannot hold) or uint8 codes -> uint32 codes."""
    bits = {"e3m2": 6, "e2m3": 6, "e2m1": 4}.get(etype, 8)
    dt = getattr(x, "dtype", None)
    want = np.dtype(fm.VALUE_DTYPES[etype])
    if dt == want:
        if isinstance(x, jax.core.Tracer):  # under jit; float4 bitcasts packed, so from its values
            return engine.encode(x.astype(jnp.float32), fm.E2M1) if etype == "e2m1" else fm.to_bits(x, etype)
        return jnp.asarray(np.asarray(x).view(np.uint8)).astype(jnp.uint32)
    if dt == np.uint8:
        if not isinstance(x, jax.core.Tracer):
            v = np.asarray(x)
            if v.size and v.max() >= 1 << bits:
                raise ValueError(f"{spelling}: {name} holds .{etype} codes above {(1 << bits) - 1} (max {v.max()})")
        return jnp.asarray(x).astype(jnp.uint32) & ((1 << bits) - 1)
    raise TypeError(f"{spelling}: {name} must have dtype {want.name} or uint8 (codes) for .{etype}, got {dt}")


def _operand(x, etype, name, spelling):
    """Typed array -> engine encoding, checking the dtype (and the range of s4/u4/b1 values)."""
    if etype in ("e3m2", "e2m3", "e2m1"):
        return _codes(x, etype, name, spelling)
    if etype == "f64":
        from tcemu._src.numerics.fma64 import require_x64

        require_x64(f"{spelling!r}")
    x = jnp.asarray(x)
    want = {"f16": [jnp.float16], "bf16": [jnp.bfloat16], "tf32": [jnp.float32], "f32": [jnp.float32],
            "f64": [jnp.float64], "e4m3": [fm.VALUE_DTYPES["e4m3"]], "e5m2": [fm.VALUE_DTYPES["e5m2"]],
            "s8": [jnp.int8], "u8": [jnp.uint8], "s4": [jnp.int8, jnp.int32], "u4": [jnp.uint8, jnp.int32],
            "b1": [jnp.uint8, jnp.bool_, jnp.int32], "s32": [jnp.int32]}[etype]
    if not any(x.dtype == np.dtype(w) for w in want):
        raise TypeError(f"{spelling}: {name} must have dtype {' or '.join(np.dtype(w).name for w in want)} "
                        f"for .{etype}, got {x.dtype}")
    if etype == "f64":
        return jax.lax.bitcast_convert_type(x, jnp.uint64)
    if etype in _INT_RANGE:
        lo, hi = _INT_RANGE[etype]
        if not isinstance(x, jax.core.Tracer):
            v = np.asarray(x).astype(np.int64)
            if v.size and (v.min() < lo or v.max() > hi):
                raise ValueError(f"{spelling}: {name} holds .{etype} values outside {lo}..{hi} "
                                 f"(min {v.min()}, max {v.max()})")
        x = x.astype(jnp.int32)
        w = 4 if etype != "b1" else 1
        return (x << (32 - w)) >> (32 - w) if etype == "s4" else x & ((1 << w) - 1)
    if etype in ("s8", "u8", "s32"):
        return x.astype(jnp.int32)
    return fm.to_bits(x, etype)


# dtype -> PTX element type of tcgen05.mma operands (float32 is tf32 there)
_TCGEN05_TYPES = {np.dtype(jnp.float16): "f16", np.dtype(jnp.bfloat16): "bf16", np.dtype(jnp.float32): "tf32",
                  **{np.dtype(fm.VALUE_DTYPES[t]): t for t in fm.F8F6F4_TYPES}}
_SCALE_DTYPES = {np.dtype(fm.VALUE_DTYPES["ue8m0"]): "ue8m0", np.dtype(fm.VALUE_DTYPES["ue4m3"]): "ue4m3"}


def _bind_tcgen05(t: P.Tcgen05, a, b, c, scale_a):
    """The Mma of a tcgen05.mma from its arrays: types from the dtypes, M from a, N from b."""
    what = repr(t.spelling)
    types = []
    for name, x in (("a", a), ("b", b)):
        dt = np.dtype(getattr(x, "dtype", np.asarray(x).dtype))
        if dt not in _TCGEN05_TYPES:
            raise TypeError(f"{what}: {name} must be a typed array (float16, bfloat16, float32 for tf32, or "
                            f"ml_dtypes {', '.join(np.dtype(fm.VALUE_DTYPES[e]).name for e in fm.F8F6F4_TYPES)}), "
                            f"got {dt}: tcgen05.mma takes its types from the arrays")
        types.append(_TCGEN05_TYPES[dt])
    cdt = np.dtype(getattr(c, "dtype", np.asarray(c).dtype))
    dtype = {np.dtype(jnp.float32): "f32", np.dtype(jnp.float16): "f16"}.get(cdt)
    if dtype is None:
        raise TypeError(f"{what}: c must be float32 or float16 (the D type), got {cdt}")
    if jnp.ndim(a) < 2 or jnp.ndim(b) < 2:
        raise ValueError(f"{what}: a and b must be (..., M, K) and (..., K, N) arrays")
    stype = None
    if t.scale_vec:
        sdt = np.dtype(getattr(scale_a, "dtype", np.uint8)) if scale_a is not None else None
        stype = _SCALE_DTYPES.get(sdt)
        if stype is None and sdt == np.uint8 and len(t.stype_choices) == 1:
            stype = t.stype_choices[0]
        if stype is None and scale_a is not None:
            raise TypeError(f"{what}: scale_a must be ml_dtypes float8_e8m0fnu (ue8m0) or float8_e4m3fn (ue4m3)"
                            + (" or uint8 codes" if len(t.stype_choices) == 1 else "") + f", got {sdt}")
        stype = stype or t.stype_choices[0]
    return t.bind(types[0], types[1], dtype, int(jnp.shape(a)[-2]), int(jnp.shape(b)[-1]), stype)


def mma(spelling: str, a, b, c, *, arch="sm_90", model=None, key=None, scale_a=None, scale_b=None, metadata=None,
        **amd):
    """Value-level MMA: ``d = a @ b + c`` with the exact numerics of ``spelling`` on ``arch``.

    ``a`` (..., M, K), ``b`` (..., K, N), ``c`` (..., M, N) are typed arrays (float16, bfloat16,
    float32 for tf32, float64, ml_dtypes float8_e4m3fn/float8_e5m2, int8/uint8, ...), batched
    over broadcastable leading axes. Returns ``d`` typed as ``.dtype``. ``model`` replaces the
    preset of a floating-point MMA (a :class:`tcemu.BlockFMA` or :class:`tcemu.ArchNumerics`);
    ``key`` (``jax.random.key(...)``) feeds stochastic rounding. ``.s4``/``.u4``/``.b1`` values
    must lie in -8..7, 0..15 and 0..1: concrete arrays outside raise a ValueError, traced ones
    (under ``jit``) are wrapped to their low 4 bits (sign-extended for ``.s4``) or 1 bit, as the
    register path reads them.

    Blackwell: fp6/fp4 operands (``.e3m2``, ``.e2m3``, ``.e2m1``) are ml_dtypes arrays
    (``float6_e3m2fn`` and ``float6_e2m3fn`` as numpy arrays, which JAX cannot hold) or uint8
    codes. Block-scaled kinds take ``scale_a`` (..., M, K / block) and ``scale_b`` (..., K / block,
    N): ml_dtypes ``float8_e8m0fnu`` (ue8m0) or ``float8_e4m3fn`` (ue4m3, sign bit ignored), or
    uint8 codes. ``tcgen05.mma.cta_group::1.kind::X`` (sm_100) takes its types, M and N from the
    arrays, as the instruction descriptor would; C (and D) is float32 or float16.

    Sparse ``mma.sp`` / ``mma.sp::ordered_metadata``: ``a`` is the compressed A (..., M, K/2) and
    ``metadata`` (..., M, K/2) integers give each kept element's column inside its group (of 4;
    2 for tf32; 8 for s4/u4, kept in pairs); :func:`tcemu.sparsify` makes both from a dense A.

    >>> import jax.numpy as jnp, tcemu
    >>> a = jnp.ones((16, 16), jnp.float16); b = jnp.ones((16, 16), jnp.float16)
    >>> d = tcemu.mma("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32", a, b,
    ...               jnp.zeros((16, 16), jnp.float32), arch="A100")
    >>> float(d[0, 0])
    16.0
    >>> import ml_dtypes, numpy as np
    >>> a4 = np.full((16, 64), 1.5, ml_dtypes.float4_e2m1fn); b4 = np.full((64, 8), 2, ml_dtypes.float4_e2m1fn)
    >>> d = tcemu.mma("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X"
    ...               ".f32.e2m1.e2m1.f32.ue4m3", a4, b4, jnp.zeros((16, 8), jnp.float32), arch="RTX5090",
    ...               scale_a=np.full((16, 4), 0.5, ml_dtypes.float8_e4m3fn),
    ...               scale_b=np.full((4, 8), 1, ml_dtypes.float8_e4m3fn))
    >>> float(d[0, 0])    # 64 * 1.5 * 2 * 0.5
    96.0

    AMD ``v_mfma_...`` (MI100 ... MI325X; ``**amd``: cbsz, abid, neg): :mod:`tcemu._src.api_mfma`.
    """
    if amd or isinstance(spelling, str) and spelling.strip().startswith("v_mfma"):
        return _amd(spelling, a, b, c, arch, model, (key, scale_a, scale_b, metadata), amd)
    ins = P.parse(spelling)
    if isinstance(ins, P.Tcgen05):
        ins = _bind_tcgen05(ins, a, b, c, scale_a)
    if not isinstance(ins, P.Mma):
        raise ValueError(f"{spelling!r} is not an MMA instruction")
    arch_ = resolve(arch)
    check_arch(ins, arch_)
    _check_model(ins, model)
    key = check_key(key, f"{spelling!r}")
    sparse, shapes = _shapes(ins, spelling, metadata)
    for name, x in zip(shapes, (a, b, c, metadata)):
        if jnp.ndim(x) < 2 or tuple(jnp.shape(x)[-2:]) != shapes[name]:
            raise ValueError(f"{spelling}: {name} must have shape (..., {shapes[name][0]}, {shapes[name][1]}), "
                             f"got {jnp.shape(x)}")
    scales = [x for x in (scale_a, scale_b) if x is not None and ins.scale_vec] + ([metadata] if sparse else [])
    try:
        batch = np.broadcast_shapes(*(jnp.shape(x)[:-2] for x in (a, b, c, *scales)))
    except ValueError:
        names = [f"a {jnp.shape(a)}", f"b {jnp.shape(b)}", f"c {jnp.shape(c)}"]
        names += [f"{n} {jnp.shape(x)}" for n, x in (("scale_a", scale_a), ("scale_b", scale_b)) if x is not None and ins.scale_vec]
        raise ValueError(f"{spelling}: the batch axes of {', '.join(names[:-1])} and {names[-1]} do not broadcast") from None
    A = _operand(a, ins.atype, "a", spelling)  # f64: checks that x64 is on
    B = _operand(b, ins.btype, "b", spelling)
    C = _operand(c, ins.ctype, "c", spelling)
    SA, SB = _scales(ins, spelling, scale_a, scale_b, batch)
    A = jnp.broadcast_to(A, batch + A.shape[-2:])
    B = jnp.broadcast_to(B, batch + B.shape[-2:])
    C = jnp.broadcast_to(C, batch + C.shape[-2:])
    if sparse:
        SA = jnp.broadcast_to(_metadata(ins, spelling, metadata), batch + shapes["a"])
    D = _mma_jit(ins, arch_, model)(A, B, C, key, SA, SB)
    if ins.dtype == "f64":
        return jax.lax.bitcast_convert_type(D, jnp.float64)
    if ins.dtype == "s32":
        return D.astype(jnp.int32)
    return fm.from_bits(D, ins.dtype)


def _amd(spelling, a, b, c, arch, model, nvidia_only, amd):
    """:func:`mma` of an AMD MFMA.

    >>> import ml_dtypes, numpy as np, tcemu
    >>> a8 = np.full((16, 32), 0.5, ml_dtypes.float8_e4m3fnuz); b8 = np.full((32, 16), 2, ml_dtypes.float8_e5m2fnuz)
    >>> float(tcemu.mma("v_mfma_f32_16x16x32_fp8_bf8", a8, b8, np.zeros((16, 16), np.float32), arch="MI300X")[0, 0])
    32.0
    """
    from tcemu._src.api_mfma import mfma

    if not (isinstance(spelling, str) and spelling.strip().startswith("v_mfma")):
        raise TypeError(f"mma() got unexpected keyword arguments {', '.join(sorted(amd))} (cbsz, abid and neg "
                        "are for AMD v_mfma_* instructions)")
    if any(x is not None for x in nvidia_only):
        raise ValueError(f"{spelling}: key, scale_a, scale_b and metadata are not MFMA arguments")
    return mfma(spelling, a, b, c, arch=arch, model=model, **amd)


def _shapes(ins, spelling, metadata):
    """(sparse?, the operand shapes): the a of mma.sp is the compressed A (M, K/2), with metadata."""
    sparse = isinstance(ins, P.SparseMma)
    if sparse != (metadata is not None):
        raise ValueError(f"{spelling}: " + ("mma.sp needs metadata= (..., M, K/2): see tcemu.sparsify" if sparse
                                            else "metadata= is only for sparse mma.sp instructions"))
    a = (ins.m, ins.k // 2 if sparse else ins.k)
    return sparse, {"a": a, "b": (ins.k, ins.n), "c": (ins.m, ins.n)} | ({"metadata": a} if sparse else {})


def _metadata(ins, spelling, metadata):
    """Value-level sparse metadata: an integer array, checked when concrete (SP.check_metadata)."""
    dt = np.dtype(metadata.dtype) if hasattr(metadata, "dtype") else np.asarray(metadata).dtype
    if not np.issubdtype(dt, np.integer):
        raise TypeError(f"{spelling}: metadata must be an integer array (each kept element's column in its "
                        f"group), got dtype {dt}")
    SP.check_metadata(ins, metadata, spelling)
    return jnp.asarray(metadata).astype(jnp.int32)


def _scales(ins, spelling, scale_a, scale_b, batch):
    """The scale-factor codes of a block-scaled MMA, checked and broadcast (None, None otherwise)."""
    if not ins.scale_vec:
        if scale_a is not None or scale_b is not None:
            raise ValueError(f"{spelling}: scale_a/scale_b are only for block-scaled kinds (.kind::mxf8f6f4, "
                             ".kind::mxf4, .kind::mxf4nvf4)")
        return None, None
    S = ins.scale_vec
    out = []
    for name, x, shape in (("scale_a", scale_a, (ins.m, S)), ("scale_b", scale_b, (S, ins.n))):
        if x is None:
            raise ValueError(f"{spelling}: block-scaled: pass {name} of shape (..., {shape[0]}, {shape[1]}) "
                             f"(one .{ins.stype} per {ins.scale_block} elements of K)")
        if jnp.ndim(x) < 2 or tuple(jnp.shape(x)[-2:]) != shape:
            raise ValueError(f"{spelling}: {name} must have shape (..., {shape[0]}, {shape[1]}), got {jnp.shape(x)}")
        codes = _codes(x, ins.stype, name, spelling)
        out.append(jnp.broadcast_to(codes, batch + shape))
    return tuple(out)


_JITS: dict = {}


def _mma_jit(ins, arch, model):
    # values do not depend on the fragment layouts or the spelling: one compilation for them all
    key = (dataclasses.replace(ins, spelling="", alayout="row", blayout="col",
                               **({"ordered": False} if isinstance(ins, P.SparseMma) else {})), arch, model)
    if key not in _JITS and isinstance(ins, P.SparseMma):  # SA: the metadata
        _JITS[key] = jax.jit(lambda A, B, C, k, SA, SB: SP.sparse_mma_bits(
            ins, A, B, C, SP.positions(ins, SA), model, arch=arch, key=k))
    if key not in _JITS:
        _JITS[key] = jax.jit(lambda A, B, C, k, SA, SB: mma_numerics.mma_bits_batched(
            ins, A, B, C, model, arch=arch, key=k, scale_a=SA, scale_b=SB, over_devices=True))
    return _JITS[key]
