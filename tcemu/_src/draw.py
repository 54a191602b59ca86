"""Pictures of fragment layouts (needs matplotlib: ``pip install "tcemu[plot]"``).

    >>> import tcemu
    >>> from tcemu._src.draw import draw_fragment
    >>> frag = tcemu.ptx("wmma.load.a.sync.aligned.row.m16n16k16.f16", arch="sm_90").fragment
    >>> fig = draw_fragment(frag, title="wmma A f16 (sm_90)")
"""
from __future__ import annotations

import os
import sys

import numpy as np

from tcemu._src.formats import ELEMENT_BITS
from tcemu._src.layouts.fragment import Fragment


def _plt():
    try:
        import matplotlib

        if "MPLBACKEND" not in os.environ and "matplotlib.pyplot" not in sys.modules:
            matplotlib.use("Agg")  # files only, unless the caller (e.g. Jupyter) chose a backend
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - exercised only without matplotlib
        raise ImportError('drawing layouts needs matplotlib: pip install "tcemu[plot]"') from e
    return plt


def holders(frag: Fragment):
    """For every (row, col): the list of (lane, register, slot) holding it, first holder first."""
    cells: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
    per = max(frag.per_reg, 1)
    for lane in range(frag.lanes):
        for v in range(frag.nvalues):
            r, c = (int(x) for x in frag.coords[lane, v])
            reg, slot = (v // per, v % per) if frag.bits <= 32 else (2 * v, 0)
            cells.setdefault((r, c), []).append((lane, reg, slot))
    return cells


def fragment_view(f, matrix=None):
    """(fragment, title, header line) that ``python -m tcemu layout`` shows of instruction ``f``
    (what ``tcemu.ptx`` returns) and operand ``matrix`` ("a".."d" of an MMA; default "a")."""
    if hasattr(f, "layout"):  # an AMD MFMA (tcemu/_src/isa/mfma_regs.py)
        return mfma_view(f.spelling, f.ins.arch, matrix)
    frag = getattr(f, "fragment", None)
    if frag is None and not hasattr(f, "fa"):
        raise ValueError(f"{f.spelling!r} moves no data: it has no fragment to draw")
    if frag is not None and matrix is not None:
        raise ValueError(f"--matrix picks an operand of an MMA spelling; {f.spelling!r} has one fragment")
    if frag is None:
        matrix = matrix or "a"
        frags = {"a": f.fa, "d": f.fd} if not hasattr(f, "fb") else dict(zip("abcd", (f.fa, f.fb, f.fc, f.fd)))
        if matrix not in frags:
            raise ValueError(f"--matrix {matrix}: wgmma holds A (from registers) and C/D in registers; B, or A "
                             "read through a descriptor, is in shared memory: pass --desc DESCRIPTOR")
        frag = frags[matrix]
    title = f"{f.spelling}" + (f" [{matrix}]" if matrix else "") + f" on {f.arch}"
    return frag, title, (f"{title}: {frag.rows} x {frag.cols}, {frag.nregs} registers/lane, {frag.copies} "
                         f"cop{'y' if frag.copies == 1 else 'ies'} of each element ({frag.source})")


def mfma_view(spelling: str, arch: str, matrix=None):
    """(fragment, title, header) of operand ``matrix`` ("a".."d", default "a") of the AMD MFMA
    ``spelling`` on ``arch`` (gfx908/gfx90a/gfx942 or MI100, MI250X, MI300X, ...), from
    :mod:`tcemu._src.layouts.mfma`; label it with ``names=("L", "v")`` (lane, VGPR). Multi-block
    forms show their blocks stacked: along rows for A and C/D, along columns for B.

    >>> frag, title, header = mfma_view("v_mfma_f32_32x32x8_f16", "MI300X")
    >>> print(header)
    v_mfma_f32_32x32x8_f16 [a] on gfx942: 32 x 8 (1 block: M x K), 2 VGPRs/lane of 64 lanes, ...
    >>> print(fragment_text(frag, names=("L", "v")).splitlines()[4])
      3   L3:v0.0   L3:v0.1   L3:v1.0   L3:v1.1  L35:v0.0  L35:v0.1  L35:v1.0  L35:v1.1
    """
    from tcemu._src.layouts.mfma import mfma

    ins = mfma(spelling, arch)
    matrix = matrix or "a"
    frag = ins.fragment(matrix)
    blocks, rows, cols = ins.shape(matrix)
    dims = {"a": "M x K", "b": "K x N"}.get(matrix, "M x N")
    stack = "" if blocks == 1 else f", stacked along {'columns' if matrix == 'b' else 'rows'}"
    title = f"{ins.spelling} [{matrix}] on {ins.arch}"
    return frag, title, (f"{title}: {rows} x {cols} ({blocks} block{'s' if blocks > 1 else ''}: {dims}{stack}), "
                         f"{frag.nregs} VGPRs/lane of 64 lanes, element bits from bit 0 ({frag.source})")


def smem_view(f, desc, matrix=None, tnsp=False):
    """(addresses, title, header): the shared-memory byte address of each element of operand ``matrix``
    ("a" or "b", default "b") of the wgmma ``f`` read through descriptor ``desc``, as A (64, K)
    or B (K, N) (a sparse wgmma: the compressed A, 64 x K/2)."""
    from tcemu._src.isa.wgmma import WgmmaDescriptor, WgmmaRegs

    if not isinstance(f, WgmmaRegs):
        raise ValueError("--desc and --tnsp are for wgmma.mma_async spellings (operands in shared memory)")
    matrix = matrix or "b"
    if matrix not in ("a", "b"):
        raise ValueError(f"--matrix {matrix}: only A and B are read through a descriptor")
    ins = f.ins
    etype = ins.atype if matrix == "a" else ins.btype
    if tnsp and etype not in ("f16", "bf16"):
        raise ValueError(f"--tnsp: only f16/bf16 operands can be MN-major, not .{etype}")
    d = WgmmaDescriptor.decode(desc)
    addr = d.addresses(64 if matrix == "a" else ins.n, f.ka if matrix == "a" else f.kb, ELEMENT_BITS[etype],
                       bool(tnsp))
    title = (f"{f.spelling} [{matrix}] from shared memory, {'MN' if tnsp else 'K'}-major: start {d.start}, "
             f"LBO {d.lbo}, SBO {d.sbo}, swizzle {d.swizzle}, base offset {d.base_offset}")
    addr = addr if matrix == "a" else addr.T
    return addr, title, f"{title}\nbyte address of each element ({addr.shape[0]} x {addr.shape[1]}; b1: of its byte)"


def _table(rows, cols, text) -> str:
    width = max(len(t) for t in text.values()) + 1
    out = [" " * 4 + "".join(f"{c:>{width}d}" for c in range(cols))]
    out += [f"{r:3d} " + "".join(f"{text[(r, c)]:>{width}s}" for c in range(cols)) for r in range(rows)]
    return "\n".join(out)


def fragment_text(frag: Fragment, names: tuple[str, str] | None = None) -> str:
    """The fragment as a table: T<lane>:x<register>[.<slot>] of the first holder of each element
    (``names``: the lane and register prefixes; default T/x, and L/v (lane, VGPR) for a 64-lane
    AMD wavefront)."""
    names = names or _names(frag)
    per = frag.per_reg
    text = {k: f"{names[0]}{v[0][0]}:{names[1]}{v[0][1]}" + (f".{v[0][2]}" if per > 1 else "")
            for k, v in holders(frag).items()}
    return _table(frag.rows, frag.cols, text)


def address_text(addr) -> str:
    """A table of byte addresses (rows, cols)."""
    addr = np.asarray(addr)
    return _table(*addr.shape, {(r, c): str(int(addr[r, c])) for r in range(addr.shape[0]) for c in range(addr.shape[1])})


def _names(frag: Fragment) -> tuple[str, str]:
    return ("L", "v") if frag.lanes == 64 else ("T", "x")


def draw_fragment(frag: Fragment, title: str = "", path=None, names: tuple[str, str] | None = None):
    """A matrix picture: every element coloured by the lane holding it and labelled T<lane> x<reg>
    (with .<slot> when a register packs several elements; +n when n more lanes hold copies;
    ``names``: the lane and register prefixes). Saves a PNG when ``path`` is given; returns the
    matplotlib figure."""
    if not isinstance(frag, Fragment):
        raise TypeError(f"frag must be a Fragment (e.g. tcemu.ptx(...).fragment), got {type(frag).__name__}")
    plt = _plt()
    names = names or _names(frag)
    cells = holders(frag)
    cmap = plt.get_cmap("hsv")
    w = min(0.62 * frag.cols + 1.5, 60)
    h = min(0.42 * frag.rows + 1.5, 40)
    fig, ax = plt.subplots(figsize=(w, h))
    img = np.zeros((frag.rows, frag.cols, 3))
    for (r, c), hs in cells.items():
        lane = hs[0][0]
        img[r, c] = cmap((lane * 11 % 32) / 32)[:3]
    ax.imshow(img * 0.55 + 0.45, aspect="auto", interpolation="nearest")
    fs = max(3, min(8, 240 // max(frag.cols, 1)))
    per = frag.per_reg
    for (r, c), hs in cells.items():
        lane, reg, slot = hs[0]
        label = f"{names[0]}{lane}\n{names[1]}{reg}" + (f".{slot}" if per > 1 else "") + (f"\n+{len(hs) - 1}" if len(hs) > 1 else "")
        ax.text(c, r, label, ha="center", va="center", fontsize=fs)
    ax.set_xticks(range(frag.cols))
    ax.set_yticks(range(frag.rows))
    ax.tick_params(labelsize=max(4, fs))
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    ax.set_title(title or f"{frag.rows}x{frag.cols} fragment, {frag.nregs} registers/lane")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def draw_smem(addr, title: str = "", path=None):
    """A wgmma operand read from shared memory: every element labelled with its byte address and
    coloured by its 16-byte unit within the 128-byte line (``(address >> 4) % 8``: the unit a
    swizzle permutes). ``addr``: (rows, cols) integer addresses. Returns the matplotlib figure."""
    addr = np.asarray(addr)
    if addr.ndim != 2 or not np.issubdtype(addr.dtype, np.integer):
        raise TypeError(f"addr must be a 2-D integer array of byte addresses, got {addr.dtype} {addr.shape}")
    plt = _plt()
    rows, cols = addr.shape
    fig, ax = plt.subplots(figsize=(min(0.62 * cols + 1.5, 60), min(0.42 * rows + 1.5, 40)))
    cmap = plt.get_cmap("tab10")
    img = np.array([[cmap(int(u))[:3] for u in row] for row in (addr >> 4) % 8])
    ax.imshow(img * 0.55 + 0.45, aspect="auto", interpolation="nearest")
    fs = max(3, min(8, 240 // max(cols, 1)))
    for r in range(rows):
        for c in range(cols):
            ax.text(c, r, str(int(addr[r, c])), ha="center", va="center", fontsize=fs)
    ax.set_xlabel("column")
    ax.set_ylabel("row")
    ax.set_title(title or "shared-memory byte address of each element", fontsize=8)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def plot_error_curves(curves, path=None, *, title="Relative error against float64 as K grows", baselines=()):
    """Log-log plot of :class:`~tcemu._src.studies.ErrorCurve` s (max as lines, mean dashed),
    one panel per input format; ``baselines`` (fp32 chains) drawn in grey. Returns the figure."""
    from tcemu._src.studies import ErrorCurve

    curves, baselines = list(curves), list(baselines)
    bad = [c for c in curves + baselines if not isinstance(c, ErrorCurve)]
    if bad:
        raise TypeError(f"curves and baselines must hold tcemu.ErrorCurve objects, got {type(bad[0]).__name__}")
    if not curves + baselines:
        raise ValueError("plot_error_curves needs at least one curve")
    plt = _plt()
    fmts = list(dict.fromkeys(c.fmt for c in [*curves, *baselines]))
    cols = min(2, len(fmts))
    rows = -(-len(fmts) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False, sharey=True)
    pos = lambda v: np.where(np.asarray(v) > 0, v, np.nan)  # noqa: E731  (exact results: no point)
    for ax, f in zip(axes.flat, fmts):
        for c in curves:
            if c.fmt != f:
                continue
            (line,) = ax.loglog(c.k, pos(c.max_rel), "o-", ms=3, label=c.label)
            ax.loglog(c.k, pos(c.mean_rel), "--", color=line.get_color(), lw=0.8)
        for c in baselines:
            if c.fmt == f:
                ax.loglog(c.k, pos(c.max_rel), "o-", ms=2, color="0.6", label="fp32 FMA chain")
        ax.set_title(f"{f} inputs")
        ax.set_xlabel("K (dot-product length)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes.flat[len(fmts):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("relative error (max solid, mean dashed)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig
