"""Whole models with emulated GEMMs: :func:`emulate` runs any JAX function (Flax nnx / linen,
Equinox, plain JAX) with every ``dot_general`` and ``conv_general_dilated`` computed by tcemu,
as a :class:`Policy` assigns configs to the GEMMs (:class:`GemmOp` describes one).

    >>> import jax, jax.numpy as jnp, tcemu
    >>> def mlp(params, x):
    ...     return jax.nn.relu(x @ params["w1"]) @ params["w2"]
    >>> params = {"w1": jnp.ones((8, 16), jnp.float32) / 3, "w2": jnp.ones((16, 2), jnp.float32) / 3}
    >>> f = tcemu.emulate(mlp, tcemu.Policy(default=None, rules=[({"param": "*w2"}, tcemu.GemmConfig(arch="A100"))]))
    >>> [(r.op.params, r.status) for r in f.report(params, jnp.ones((4, 8), jnp.float32))]
    [(('0/w1', '1'), 'native (policy)'), (('0/w2',), 'emulated')]

The package is one step a module:

* :mod:`.ops`: :class:`GemmOp`, a GEMM equation's description (M, N, K, scope, params, ...);
* :mod:`.policy`: :class:`Policy`, its rules and matching, ``Policy.library``;
* :mod:`.conv`: convolutions as implicit GEMMs;
* :mod:`.gemms`: what one run does with each GEMM (emulated, native, gradient, unsupported);
* :mod:`.interpret`: the jaxpr interpreter and the higher-order primitives;
* :mod:`.api`: :func:`emulate` and its report.
"""
from tcemu._src.emulate.api import Emulated, Report, emulate
from tcemu._src.emulate.gemms import Row
from tcemu._src.emulate.ops import GemmOp
from tcemu._src.emulate.policy import Policy

__all__ = ["Emulated", "GemmOp", "Policy", "Report", "Row", "emulate"]
