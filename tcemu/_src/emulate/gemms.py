"""What one run of an emulated function does with each GEMM: the policy's choice, the emulated,
native or exact-float32 computation, unsupported GEMMs (an error, or native with a warning), the
report's rows, and the forward operands that gradient GEMMs look up (the "vjp" rule).

    >>> import jax, jax.numpy as jnp, tcemu
    >>> from tcemu._src.emulate.gemms import Gemms
    >>> from tcemu._src.emulate.policy import as_policy
    >>> eqn = jax.make_jaxpr(lambda a, b: a @ b)(jnp.ones((2, 8), jnp.float32), jnp.ones((8, 3), jnp.float32)).jaxpr.eqns[0]
    >>> g = Gemms(as_policy(tcemu.GemmConfig(arch="H100")), "error")
    >>> out = g.run(eqn, [jnp.ones((2, 8), jnp.float32), jnp.ones((8, 3), jnp.float32)], "", (), (0,))
    >>> out[0].tolist()[0], [r.status for r in g.rows.values()]
    ([8.0, 8.0, 8.0], ['emulated'])
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import jax
import jax.numpy as jnp

from tcemu._src.emulate.conv import emulated_conv
from tcemu._src.emulate.ops import GemmOp, op_of, operand_problem
from tcemu._src.emulate.policy import VJP, Policy
from tcemu._src.emulate.vjp import gradient
from tcemu._src.gemm import GemmConfig, dot_general
from tcemu._src.quant.elements import quantize

EXACT = "exact float32 (vjp)"
NATIVE = "native (policy)"
# data movement a gradient GEMM's operand may have gone through since the forward GEMM read it
FOLLOW = ("reshape", "transpose", "rev", "squeeze", "expand_dims", "broadcast_in_dim", "copy", "copy_p")


@dataclasses.dataclass(frozen=True)
class Row:
    """One GEMM of a report: the op, the config it ran with (None: native or exact float32) and
    its status: "emulated", "native (policy)", "exact float32 (vjp)" or "unsupported: <reason>"."""

    op: GemmOp
    config: GemmConfig | None
    status: str


@dataclasses.dataclass(frozen=True)
class Record:
    """A forward GEMM's operand ``value``: the config it ran with (None: natively), its side and,
    for a dot_general operand as read (not data moved since), the forward GEMM's
    ``(dimension_numbers, lhs shape, rhs shape)``."""

    value: object
    config: GemmConfig | None
    side: str
    forward: tuple | None

    def quantized(self, x):
        """``x`` (this operand, or data moved from it) rounded to the forward config's input
        format (block-scaled formats: as it is, its blocks along K being out of view)."""
        ins = self.config.ins
        x = x.astype(jnp.float32)
        return x if ins.scale_vec is not None else quantize(x, ins.atype if self.side == "lhs" else ins.btype)


def native(eqn, invals):
    """The equation's own primitive on ``invals``."""
    return [eqn.primitive.bind(*invals, **eqn.params)]


def emulated(eqn, invals, cfg: GemmConfig, params=None):
    """The GEMM emulated with ``cfg``, of the equation's output dtype (``params``: the
    equation's, or others for the same primitive)."""
    params = eqn.params if params is None else params
    lhs, rhs = invals[:2]
    out = eqn.outvars[0].aval
    sharding = params.get("out_sharding")
    if eqn.primitive.name == "dot_general":
        return [dot_general(lhs, rhs, params["dimension_numbers"], preferred_element_type=out.dtype,
                            out_sharding=sharding, config=cfg)]
    return [emulated_conv(lhs, rhs, params, out.shape, out.dtype, cfg, sharding)]


def exact(eqn, invals, params=None):
    """The GEMM exactly in float32 (HIGHEST precision, float32 accumulation) as tcemu's VJP
    computes a gradient GEMM whose config is None: a dot_general brought to (batch, M, K) x
    (batch, K, N) as ``tcemu.dot_general`` does; of the equation's output dtype."""
    params = eqn.params if params is None else params
    hi = jax.lax.Precision.HIGHEST
    lhs, rhs = (x.astype(jnp.float32) for x in invals[:2])
    if eqn.primitive.name != "dot_general":
        out = eqn.primitive.bind(lhs, rhs, **dict(params, precision=(hi, hi), preferred_element_type=jnp.dtype(jnp.float32)))
        return [out.astype(eqn.outvars[0].aval.dtype)]
    (lc, rc), (lb, rb) = params["dimension_numbers"]
    lf = tuple(i for i in range(lhs.ndim) if i not in lc and i not in lb)
    rf = tuple(i for i in range(rhs.ndim) if i not in rc and i not in rb)
    size = lambda x, dims: math.prod(x.shape[i] for i in dims)  # noqa: E731
    L = jnp.transpose(lhs, tuple(lb) + lf + tuple(lc)).reshape(size(lhs, lb), size(lhs, lf), size(lhs, lc))
    R = jnp.transpose(rhs, tuple(rb) + tuple(rc) + rf).reshape(size(rhs, rb), size(rhs, rc), size(rhs, rf))
    out = jnp.matmul(L if lb else L[0], R if rb else R[0], precision=hi, preferred_element_type=jnp.float32)
    shape = tuple(lhs.shape[i] for i in tuple(lb) + lf) + tuple(rhs.shape[i] for i in rf)
    return [out.reshape(shape).astype(eqn.outvars[0].aval.dtype)]


def swapped(compute, eqn, invals):
    """``compute(params, operands)`` of a dot_general with its operands exchanged (the
    dimension numbers to match), its output transposed back to the equation's layout."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = invals[:2]
    nb, nl, nr = len(lb), lhs.ndim - len(lc) - len(lb), rhs.ndim - len(rc) - len(rb)
    out = compute(dict(eqn.params, dimension_numbers=((rc, lc), (rb, lb))), [rhs, lhs])[0]
    return [jnp.transpose(out, [*range(nb), *range(nb + nr, nb + nr + nl), *range(nb, nb + nr)])]


class Gemms:
    """The GEMMs of one run: ``rows`` (report rows by site, in program order) and ``records``
    (forward operands by ``id``). ``collect=True`` (reports) never raises or warns."""

    def __init__(self, policy: Policy, unsupported: str, collect: bool = False):
        self.policy, self.unsupported, self.collect = policy, unsupported, collect
        self.rows: dict = {}
        self.records: dict = {}

    def run(self, eqn, invals, scope: str, params: tuple, site: tuple):
        """The outputs of the GEMM equation ``eqn`` on ``invals``."""
        op = op_of(eqn, scope, params)
        try:
            choice = self.policy.choose(op)
        except ValueError as e:
            return self._unsupported(eqn, invals, op, site, None, str(e))
        if isinstance(choice, str) and choice == VJP:
            return self._gradient(eqn, invals, op, site)
        out = self._compute(eqn, invals, op, site, choice)
        if not op.backward and site in self.rows and not self.rows[site].status.startswith("unsupported"):
            self._record(eqn, invals, choice)
        return out

    def _compute(self, eqn, invals, op, site, cfg):
        if cfg is None:
            self.rows[site] = Row(op, None, NATIVE)
            return native(eqn, invals)
        problem = operand_problem(op)
        if problem is not None:
            return self._unsupported(eqn, invals, op, site, cfg, problem)
        try:
            out = emulated(eqn, invals, cfg)
        except ValueError as e:  # tcemu's checks of the config against this GEMM
            return self._unsupported(eqn, invals, op, site, cfg, str(e))
        self.rows[site] = Row(op, cfg, "emulated")
        return out

    def _record(self, eqn, invals, cfg):
        forward = None
        if eqn.primitive.name == "dot_general":
            forward = (eqn.params["dimension_numbers"], tuple(invals[0].shape), tuple(invals[1].shape))
        for i, side in enumerate(("lhs", "rhs")):
            self.records.setdefault(id(invals[i]), []).append(Record(invals[i], cfg, side, forward))

    def follow(self, eqn, invals, outs):
        """Let a forward operand's records follow it through data movement (and exact widening)."""
        if not invals or len(outs) != 1 or not self.records.get(id(invals[0])):
            return
        name = eqn.primitive.name
        if name == "convert_element_type":
            src, dst = jnp.dtype(invals[0].dtype), jnp.dtype(outs[0].dtype)
            if not (jnp.issubdtype(src, jnp.floating) and jnp.issubdtype(dst, jnp.floating)
                    and dst.itemsize >= src.itemsize):
                return
        elif name not in FOLLOW:
            return
        recs = [Record(outs[0], r.config, r.side, None) for r in self.records[id(invals[0])] if r.value is invals[0]]
        if recs:
            self.records.setdefault(id(outs[0]), []).extend(recs)

    def _forward_of(self, invals):
        """(operand index, its records) of the one operand forward GEMMs read (all with one config
        and side), or None."""
        hits = []
        for i, v in enumerate(invals[:2]):
            recs = [r for r in self.records.get(id(v), ()) if r.value is v]
            if recs:
                hits.append((i, recs))
        if len(hits) != 1:
            return None
        i, recs = hits[0]
        if any((r.config, r.side) != (recs[0].config, recs[0].side) for r in recs):
            return None
        return i, recs

    def _gradient(self, eqn, invals, op, site):
        """A gradient GEMM by the VJP rule (see :class:`tcemu.Policy`): with the config of the
        forward GEMM whose operand it reads, as :mod:`.vjp` computes it; data moved from that
        operand, or a convolution: the operand quantised, the GEMM exact (or with grad_lhs /
        grad_rhs) in its own layout, operands in tcemu's order dA = G B^T, dB = A^T G; forward
        GEMM out of view: the rules' config's grad_lhs (= grad_rhs) on the operands as they are."""
        found, side = self._forward_of(invals), None
        if found is None:
            try:
                cfg = self.policy.forward_config(op)
            except ValueError as e:
                return self._unsupported(eqn, invals, op, site, None, str(e))
            if cfg is not None and cfg.grad_lhs != cfg.grad_rhs:
                return self._unsupported(eqn, invals, op, site, cfg, "a gradient GEMM whose forward GEMM is out of "
                                         "view (e.g. in another scan): cannot tell grad_lhs from grad_rhs")
        else:
            i, recs = found
            cfg, side = recs[0].config, recs[0].side
        if cfg is None:
            return self._compute(eqn, invals, op, site, None)
        grad = cfg.grad_rhs if side == "lhs" else cfg.grad_lhs  # dB = A^T G reads A, dA = G B^T reads B
        problem = operand_problem(op)
        if problem is not None:
            return self._unsupported(eqn, invals, op, site, grad, problem)
        try:
            out, swap = None, False
            if found is not None:
                for forward in dict.fromkeys(r.forward for r in recs if r.forward is not None):
                    out = gradient(eqn, invals[1 - i], invals[i], i, side, cfg, *forward)
                    if out is not None:
                        out = [out]
                        break
                else:
                    invals = list(invals)
                    invals[i] = recs[0].quantized(invals[i])
                    swap = eqn.primitive.name == "dot_general" and i != (0 if side == "lhs" else 1)
            if out is None:
                compute = (lambda p, xs: exact(eqn, xs, p)) if grad is None else (lambda p, xs: emulated(eqn, xs, grad, p))
                out = swapped(compute, eqn, invals) if swap else compute(None, invals)
        except ValueError as e:  # tcemu's checks of a grad config against this GEMM
            return self._unsupported(eqn, invals, op, site, grad, str(e))
        self.rows[site] = Row(op, grad, "emulated" if grad is not None else EXACT)
        return out

    def flag(self, op: GemmOp, site, cfg, reason: str):
        """Report ``op`` unsupported: raise (unsupported="error") or warn once per site."""
        new = site not in self.rows
        self.rows[site] = Row(op, cfg, f"unsupported: {reason}")
        if self.collect:
            return
        if self.unsupported == "error":
            raise ValueError(f"tcemu.emulate cannot emulate {op}: {reason}. Pass unsupported=\"native\" to "
                             "tcemu.emulate to run such GEMMs natively (with a warning), or give them the config "
                             "None in the policy")
        if new:
            warnings.warn(f"tcemu.emulate runs {op} natively: {reason}", stacklevel=2)

    def opaque(self, op: GemmOp, site, primitive: str):
        """A GEMM inside a primitive the interpreter cannot look into: native if the policy says
        so, else unsupported."""
        try:
            cfg = self.policy.choose(op)
            cfg = self.policy.forward_config(op) if isinstance(cfg, str) else cfg
        except ValueError as e:
            return self.flag(op, site, None, str(e))
        if cfg is None:
            self.rows[site] = Row(op, None, NATIVE)
        else:
            self.flag(op, site, cfg, f"it is inside {primitive}, a primitive tcemu.emulate cannot look into")

    def _unsupported(self, eqn, invals, op, site, cfg, reason):
        self.flag(op, site, cfg, reason)
        return native(eqn, invals)
