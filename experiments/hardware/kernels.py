"""CUDA source for the hardware capture harness, generated from PTX spellings.

Every kernel runs one experiment per warp (``blockIdx.x``, 32 threads) and uses inline PTX, so the
instruction under test is exactly the spelling recorded next to the data. One kernel per spelling:

* ``ld_*``  wmma.load: reads ``mem + warp*region + p`` (optionally with a ``stride`` operand) and
  writes the fragment registers to ``out[warp, lane, reg]``.
* ``st_*``  wmma.store.d: takes registers ``in[warp, lane, reg]`` and stores them to
  ``mem + warp*region + p``.
* ``wm_*``  wmma.load a/b/c -> wmma.mma -> wmma.store.d (row-major D); also dumps D registers.
* ``ms_*``  mma.sync on registers given directly: ``a|b|c`` in, ``d`` out.
* ``ldsm_*`` / ``stsm_*``  ldmatrix / stmatrix between registers and a 4 KiB shared-memory tile,
  each lane supplying its own row offset.
* ``api_*`` the same loads through the nvcuda::wmma C++ API (cross-check of the inline PTX).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tcemu._src.isa import wmma_spec as S  # noqa: E402

# How a fragment register is bound in inline asm: (constraint, C type, expr->u32 bits, u32->expr)
_REG = {
    "b32": ("r", "unsigned", "{}", "{}"),
    "f32": ("f", "float", "__float_as_uint({})", "__uint_as_float({})"),
    "f64": ("d", "double", None, None),
}


def _regkind(etype: str, matrix: str) -> str:
    if etype == "f64":
        return "f64"
    if etype == "f32" and matrix in ("c", "d"):
        return "f32"
    return "b32"


@dataclass(frozen=True)
class Frag:
    """One fragment operand of an inline-asm statement: ``nregs`` 32-bit registers."""

    name: str
    nregs: int
    kind: str  # key of _REG

    @property
    def nvars(self) -> int:
        return self.nregs // 2 if self.kind == "f64" else self.nregs

    def decl(self) -> str:
        ctype = _REG[self.kind][1]
        return f"{ctype} {self.name}[{self.nvars}];"

    def from_u32(self, src: str) -> str:
        """Statements filling the variables from u32 array expression ``src(i)``."""
        lines = []
        for v in range(self.nvars):
            if self.kind == "f64":
                lo, hi = src.format(2 * v), src.format(2 * v + 1)
                lines.append(f"{self.name}[{v}] = __longlong_as_double((long long)(((unsigned long long){hi} << 32) | {lo}));")
            else:
                lines.append(f"{self.name}[{v}] = {_REG[self.kind][3].format(src.format(v))};")
        return "\n    ".join(lines)

    def to_u32(self, dst: str) -> str:
        lines = []
        for v in range(self.nvars):
            if self.kind == "f64":
                bits = f"(unsigned long long)__double_as_longlong({self.name}[{v}])"
                lines.append(f"{dst.format(2 * v)} = (unsigned)({bits});")
                lines.append(f"{dst.format(2 * v + 1)} = (unsigned)({bits} >> 32);")
            else:
                lines.append(f"{dst.format(v)} = {_REG[self.kind][2].format(f'{self.name}[{v}]')};")
        return "\n    ".join(lines)

    def constraints(self, out: bool) -> list[str]:
        c = _REG[self.kind][0]
        return [f'"{"=" if out else ""}{c}"({self.name}[{v}])' for v in range(self.nvars)]


class Asm:
    """Builds one ``asm volatile`` statement with numbered operands."""

    def __init__(self) -> None:
        self.outs: list[str] = []
        self.ins: list[str] = []

    def vec(self, frag: Frag, out: bool) -> str:
        cons = frag.constraints(out)
        first = len(self.outs) if out else None
        if out:
            self.outs.extend(cons)
            idx = range(first, first + len(cons))
        else:
            self.ins.extend(cons)
            idx = range(len(self.ins) - len(cons), len(self.ins))
            idx = [f"IN{i}" for i in idx]
        return "{" + ", ".join(f"%{i}" for i in idx) + "}"

    def scalar(self, cons: str) -> str:
        self.ins.append(cons)
        return f"%IN{len(self.ins) - 1}"

    def render(self, text: str) -> str:
        n_out = len(self.outs)
        for i in reversed(range(len(self.ins))):
            text = text.replace(f"%IN{i}", f"%{n_out + i}")
        return (f'asm volatile("{text};"\n        : {", ".join(self.outs)}\n'
                f'        : {", ".join(self.ins)}\n        : "memory");')


HEADER = r"""
#include <cuda_fp16.h>
#include <mma.h>
#define LANE (threadIdx.x & 31)
#define WARP (blockIdx.x)
"""


def wmma_load_spelling(matrix, layout, shape, etype):
    return f"wmma.load.{matrix}.sync.aligned.{layout}.{shape}.global.{etype}"


def wmma_store_spelling(layout, shape, etype):
    return f"wmma.store.d.sync.aligned.{layout}.{shape}.global.{etype}"


def load_kernel(name, matrix, layout, shape, etype, with_stride):
    frag = Frag("r", S.FRAGMENT_REGS[(shape, matrix, etype)], _regkind(etype, matrix))
    asm = Asm()
    dst = asm.vec(frag, out=True)
    addr = asm.scalar('"l"(base)')
    text = f"{wmma_load_spelling(matrix, layout, shape, etype)} {dst}, [{addr}]"
    if with_stride:
        text += ", " + asm.scalar('"r"(stride)')
    n = frag.nregs
    return f"""
extern "C" __global__ void {name}(const unsigned char* mem, unsigned long long region,
                                  unsigned p, unsigned stride, unsigned* out) {{
    const unsigned char* base = mem + (unsigned long long)WARP * region + p;
    {frag.decl()}
    {asm.render(text)}
    unsigned* o = out + ((unsigned long long)WARP * 32 + LANE) * {n};
    {frag.to_u32("o[{}]")}
}}
"""


def store_kernel(name, layout, shape, etype, with_stride):
    frag = Frag("r", S.FRAGMENT_REGS[(shape, "c", etype)], _regkind(etype, "d"))
    asm = Asm()
    addr = asm.scalar('"l"(base)')
    src = asm.vec(frag, out=False)
    text = f"{wmma_store_spelling(layout, shape, etype)} [{addr}], {src}"
    if with_stride:
        text += ", " + asm.scalar('"r"(stride)')
    n = frag.nregs
    return f"""
extern "C" __global__ void {name}(unsigned char* mem, unsigned long long region,
                                  unsigned p, unsigned stride, const unsigned* in) {{
    unsigned char* base = mem + (unsigned long long)WARP * region + p;
    const unsigned* s = in + ((unsigned long long)WARP * 32 + LANE) * {n};
    {frag.decl()}
    {frag.from_u32("s[{}]")}
    {asm.render(text).replace(": , ", ": ")}
}}
"""


@dataclass(frozen=True)
class WmmaMma:
    """A wmma.mma spelling plus the load/store spellings that feed it."""

    shape: str
    alayout: str
    blayout: str
    dtype: str
    atype: str
    btype: str
    ctype: str
    extra: str = ""  # ".satfinite", ".rn", ...
    op: str = ""  # ".xor.popc" / ".and.popc"

    @property
    def spelling(self) -> str:
        head = f"wmma.mma{self.op}.sync.aligned.{self.alayout}.{self.blayout}.{self.shape}"
        if self.atype == "f16":
            return f"{head}.{self.dtype}.{self.ctype}"
        if self.atype == "f64":
            return f"{head}{self.extra}.f64.f64.f64.f64"
        return f"{head}.{self.dtype}.{self.atype}.{self.btype}.{self.ctype}{self.extra}"

    @property
    def name(self) -> str:
        return "wm_" + self.spelling.replace("wmma.mma.", "").replace(".sync.aligned", "").replace(".", "_")


def wmma_mma_kernel(f: WmmaMma):
    """Memory layout of one tile: A | B | C (each with default stride) ; D separately."""
    M, N, K = S.SHAPES[f.shape]
    fa = Frag("a", S.FRAGMENT_REGS[(f.shape, "a", f.atype)], _regkind(f.atype, "a"))
    fb = Frag("b", S.FRAGMENT_REGS[(f.shape, "b", f.btype)], _regkind(f.btype, "b"))
    fc = Frag("c", S.FRAGMENT_REGS[(f.shape, "c", f.ctype)], _regkind(f.ctype, "c"))
    fd = Frag("d", S.FRAGMENT_REGS[(f.shape, "c", f.dtype)], _regkind(f.dtype, "d"))
    bits = S.ELEMENT_BITS
    a_bytes = M * K * bits[f.atype] // 8
    b_bytes = K * N * bits[f.btype] // 8
    c_bytes = M * N * bits[f.ctype] // 8
    d_bytes = M * N * bits[f.dtype] // 8
    stmts = []
    for frag, mat, lay, et, off in ((fa, "a", f.alayout, f.atype, "0"), (fb, "b", f.blayout, f.btype, str(a_bytes)),
                                    (fc, "c", "row", f.ctype, str(a_bytes + b_bytes))):
        asm = Asm()
        dst = asm.vec(frag, out=True)
        addr = asm.scalar(f'"l"(tile + {off})')
        stmts.append(asm.render(f"{wmma_load_spelling(mat, lay, f.shape, et)} {dst}, [{addr}]"))
    asm = Asm()
    d = asm.vec(fd, out=True)
    a = asm.vec(fa, out=False)
    b = asm.vec(fb, out=False)
    c = asm.vec(fc, out=False)
    stmts.append(asm.render(f"{f.spelling} {d}, {a}, {b}, {c}"))
    asm = Asm()
    addr = asm.scalar('"l"(dout)')
    src = asm.vec(fd, out=False)
    stmts.append(asm.render(f"{wmma_store_spelling('row', f.shape, f.dtype)} [{addr}], {src}").replace(": , ", ": "))
    body = "\n    ".join(stmts)
    return f"""
extern "C" __global__ void {f.name}(const unsigned char* in, unsigned char* out, unsigned* dregs) {{
    const unsigned char* tile = in + (unsigned long long)WARP * {a_bytes + b_bytes + c_bytes};
    unsigned char* dout = out + (unsigned long long)WARP * {d_bytes};
    {fa.decl()} {fb.decl()} {fc.decl()} {fd.decl()}
    {body}
    unsigned* o = dregs + ((unsigned long long)WARP * 32 + LANE) * {fd.nregs};
    {fd.to_u32("o[{}]")}
}}
"""


def wmma_mma_forms() -> list[WmmaMma]:
    forms = []
    lays = [(a, b) for a in ("row", "col") for b in ("row", "col")]
    for shape in S.MMA_F16_SHAPES:
        for al, bl in lays:
            for dt, ct in S.MMA_F16_DC:
                forms.append(WmmaMma(shape, al, bl, dt, "f16", "f16", ct))
            forms.append(WmmaMma(shape, al, bl, "f32", "bf16", "bf16", "f32"))
            for t in S.MMA_INT_TYPES:
                for sat in ("", ".satfinite"):
                    forms.append(WmmaMma(shape, al, bl, "s32", t, t, "s32", sat))
    for al, bl in lays:
        forms.append(WmmaMma("m16n16k8", al, bl, "f32", "tf32", "tf32", "f32"))
        for rnd in S.F64_ROUNDINGS:
            forms.append(WmmaMma("m8n8k4", al, bl, "f64", "f64", "f64", "f64", "." + rnd))
    for t in S.MMA_SUBBYTE_TYPES:
        for sat in ("", ".satfinite"):
            forms.append(WmmaMma("m8n8k32", "row", "col", "s32", t, t, "s32", sat))
    for op in S.B1_OPS:
        forms.append(WmmaMma("m8n8k128", "row", "col", "s32", "b1", "b1", "s32", op=f".{op}.popc"))
    return forms


@dataclass(frozen=True)
class MmaSync:
    """An mma.sync spelling with its per-thread register counts (PTX ISA 9.7.14.5.x)."""

    spelling: str
    na: int
    nb: int
    nc: int
    nd: int
    kind: str = "b32"  # f64 for DMMA

    @property
    def name(self) -> str:
        return "ms_" + self.spelling.replace("mma.sync.aligned.", "").replace(".", "_")


def mma_sync_forms() -> list[MmaSync]:
    fs = []
    p = "mma.sync.aligned"
    for acc, nacc in (("f32", 4), ("f16", 2)):
        fs.append(MmaSync(f"{p}.m16n8k16.row.col.{acc}.f16.f16.{acc}", 4, 2, nacc, nacc))
        fs.append(MmaSync(f"{p}.m16n8k8.row.col.{acc}.f16.f16.{acc}", 2, 1, nacc, nacc))
        for ta in ("e4m3", "e5m2"):
            for tb in ("e4m3", "e5m2"):
                fs.append(MmaSync(f"{p}.m16n8k32.row.col.{acc}.{ta}.{tb}.{acc}", 4, 2, nacc, nacc))
    for acc, nacc in (("f32", 8), ("f16", 4)):
        fs.append(MmaSync(f"{p}.m8n8k4.row.col.{acc}.f16.f16.{acc}", 2, 2, nacc, nacc))
    fs.append(MmaSync(f"{p}.m16n8k16.row.col.f32.bf16.bf16.f32", 4, 2, 4, 4))
    fs.append(MmaSync(f"{p}.m16n8k8.row.col.f32.bf16.bf16.f32", 2, 1, 4, 4))
    fs.append(MmaSync(f"{p}.m16n8k8.row.col.f32.tf32.tf32.f32", 4, 2, 4, 4))
    fs.append(MmaSync(f"{p}.m16n8k4.row.col.f32.tf32.tf32.f32", 2, 1, 4, 4))
    for rnd in ("", ".rn", ".rz", ".rm", ".rp"):
        fs.append(MmaSync(f"{p}.m8n8k4.row.col{rnd}.f64.f64.f64.f64", 2, 2, 4, 4, kind="f64"))
    for t in ("s8", "u8"):
        for sat in ("", ".satfinite"):
            fs.append(MmaSync(f"{p}.m8n8k16.row.col{sat}.s32.{t}.{t}.s32", 1, 1, 2, 2))
            fs.append(MmaSync(f"{p}.m16n8k16.row.col{sat}.s32.{t}.{t}.s32", 2, 1, 4, 4))
            fs.append(MmaSync(f"{p}.m16n8k32.row.col{sat}.s32.{t}.{t}.s32", 4, 2, 4, 4))
    for t in ("s4", "u4"):
        for sat in ("", ".satfinite"):
            fs.append(MmaSync(f"{p}.m8n8k32.row.col{sat}.s32.{t}.{t}.s32", 1, 1, 2, 2))
            fs.append(MmaSync(f"{p}.m16n8k32.row.col{sat}.s32.{t}.{t}.s32", 2, 1, 4, 4))
            fs.append(MmaSync(f"{p}.m16n8k64.row.col{sat}.s32.{t}.{t}.s32", 4, 2, 4, 4))
    for op in ("xor", "and"):
        fs.append(MmaSync(f"{p}.m8n8k128.row.col.s32.b1.b1.s32.{op}.popc", 1, 1, 2, 2))
        fs.append(MmaSync(f"{p}.m16n8k128.row.col.s32.b1.b1.s32.{op}.popc", 2, 1, 4, 4))
        fs.append(MmaSync(f"{p}.m16n8k256.row.col.s32.b1.b1.s32.{op}.popc", 4, 2, 4, 4))
    return fs


def mma_sync_f64_forms() -> list[MmaSync]:
    """sm_90's f64 m16n8kK (DMMA): A 2/4/8, B 1/2/4, C/D 4 doubles a lane; every rounding at k16."""
    return [MmaSync(f"mma.sync.aligned.m16n8k{k}.row.col{rnd}.f64.f64.f64.f64", k, k // 2, 8, 8, kind="f64")
            for k in (4, 8, 16) for rnd in (("", ".rz", ".rm", ".rp") if k == 16 else ("",))]


def mma_sync_kernel(f: MmaSync):
    kind_ab = "f64" if f.kind == "f64" else "b32"
    acc_kind = "f64" if f.kind == "f64" else ("f32" if ".f32." in f.spelling else "b32")
    fa, fb = Frag("a", f.na, kind_ab), Frag("b", f.nb, kind_ab)
    fc, fd = Frag("c", f.nc, acc_kind), Frag("d", f.nd, acc_kind)
    asm = Asm()
    d = asm.vec(fd, out=True)
    a, b, c = asm.vec(fa, out=False), asm.vec(fb, out=False), asm.vec(fc, out=False)
    stmt = asm.render(f"{f.spelling} {d}, {a}, {b}, {c}")
    n_in = f.na + f.nb + f.nc
    return f"""
extern "C" __global__ void {f.name}(const unsigned* in, unsigned* out) {{
    const unsigned* s = in + ((unsigned long long)WARP * 32 + LANE) * {n_in};
    {fa.decl()} {fb.decl()} {fc.decl()} {fd.decl()}
    {fa.from_u32("s[{}]")}
    {fb.from_u32("s[" + str(f.na) + " + {}]")}
    {fc.from_u32("s[" + str(f.na + f.nb) + " + {}]")}
    {stmt}
    unsigned* o = out + ((unsigned long long)WARP * 32 + LANE) * {f.nd};
    {fd.to_u32("o[{}]")}
}}
"""


LDSM_FORMS = [(x, t) for x in (1, 2, 4) for t in ("", ".trans")]
SMEM_BYTES = 4096


def ldsm_name(kind, x, trans):
    return f"{kind}_x{x}{trans.replace('.', '_')}"


def ldmatrix_kernel(x, trans):
    fr = Frag("r", x, "b32")
    asm = Asm()
    dst = asm.vec(fr, out=True)
    addr = asm.scalar('"r"(saddr)')
    stmt = asm.render(f"ldmatrix.sync.aligned.m8n8.x{x}{trans}.shared.b16 {dst}, [{addr}]")
    return f"""
extern "C" __global__ void {ldsm_name('ldsm', x, trans)}(const unsigned* gsrc, const unsigned* offs, unsigned* out) {{
    __shared__ __align__(16) unsigned sm[{SMEM_BYTES // 4}];
    for (int i = threadIdx.x; i < {SMEM_BYTES // 4}; i += 32) sm[i] = gsrc[WARP * {SMEM_BYTES // 4} + i];
    __syncwarp();
    unsigned saddr = (unsigned)__cvta_generic_to_shared(sm) + offs[WARP * 32 + LANE];
    {fr.decl()}
    {stmt}
    unsigned* o = out + ((unsigned long long)WARP * 32 + LANE) * {x};
    {fr.to_u32("o[{}]")}
}}
"""


def stmatrix_kernel(x, trans):
    fr = Frag("r", x, "b32")
    asm = Asm()
    addr = asm.scalar('"r"(saddr)')
    src = asm.vec(fr, out=False)
    stmt = asm.render(f"stmatrix.sync.aligned.m8n8.x{x}{trans}.shared.b16 [{addr}], {src}").replace(": , ", ": ")
    return f"""
extern "C" __global__ void {ldsm_name('stsm', x, trans)}(unsigned* gmem, const unsigned* offs, const unsigned* in) {{
    __shared__ __align__(16) unsigned sm[{SMEM_BYTES // 4}];
    for (int i = threadIdx.x; i < {SMEM_BYTES // 4}; i += 32) sm[i] = gmem[WARP * {SMEM_BYTES // 4} + i];
    __syncwarp();
    unsigned saddr = (unsigned)__cvta_generic_to_shared(sm) + offs[WARP * 32 + LANE];
    const unsigned* s = in + ((unsigned long long)WARP * 32 + LANE) * {x};
    {fr.decl()}
    {fr.from_u32("s[{}]")}
    {stmt}
    __syncwarp();
    for (int i = threadIdx.x; i < {SMEM_BYTES // 4}; i += 32) gmem[WARP * {SMEM_BYTES // 4} + i] = sm[i];
}}
"""


def api_load_kernel(mat, lay, et):
    """nvcuda::wmma C++ API cross-check of the m16n16k16 ``wmma.load.{mat}.{lay}...{et}`` (raw
    fragment element bits, element order as fragment.x[i])."""
    ctype, as_bits, nbytes = {"f16": ("__half", "__half_as_ushort", 512), "f32": ("float", "__float_as_uint", 1024)}[et]
    major = f"{lay}_major"
    frag, extra = ((f"wmma::accumulator, 16, 16, 16, {ctype}", f", wmma::mem_{major}") if mat == "c" else
                   (f"wmma::matrix_{mat}, 16, 16, 16, {ctype}, wmma::{major}", ""))
    return f"""extern "C" __global__ void api_ld_{mat}_{lay}_m16n16k16_{et}(const unsigned char* mem, unsigned* out) {{
    using namespace nvcuda;
    wmma::fragment<{frag}> f;
    wmma::load_matrix_sync(f, (const {ctype}*)(mem + WARP * {nbytes}), 16{extra});
    for (int i = 0; i < f.num_elements; i++)
        out[(WARP * 32 + LANE) * f.num_elements + i] = {as_bits}(f.x[i]);
}}
"""


API_KERNELS = ("\n// nvcuda::wmma C++ API cross-checks: raw fragment element bits, element order as fragment.x[i].\n"
               + "".join(api_load_kernel(*c) for c in (("a", "row", "f16"), ("b", "col", "f16"), ("c", "row", "f32"))))


def load_name(mat, lay, shape, et, with_stride):
    return f"ld_{mat}_{lay}_{shape}_{et}" + ("_s" if with_stride else "")


def store_name(lay, shape, et, with_stride):
    return f"st_{lay}_{shape}_{et}" + ("_s" if with_stride else "")


def source() -> str:
    parts = [HEADER]
    for cfg in S.load_forms():
        for ws in (False, True):
            parts.append(load_kernel(load_name(*cfg, ws), *cfg, ws))
    for cfg in S.store_forms():
        for ws in (False, True):
            parts.append(store_kernel(store_name(*cfg, ws), *cfg, ws))
    for f in wmma_mma_forms():
        parts.append(wmma_mma_kernel(f))
    for f in mma_sync_forms() + mma_sync_f64_forms():
        parts.append(mma_sync_kernel(f))
    for x, t in LDSM_FORMS:
        parts.append(ldmatrix_kernel(x, t))
        parts.append(stmatrix_kernel(x, t))
    parts.append(API_KERNELS)
    return "\n".join(parts)


if __name__ == "__main__":
    Path(sys.argv[1] if len(sys.argv) > 1 else "capture.cu").write_text(source())
