"""Which config each GEMM of an emulated function runs with: :class:`Policy` (a default, rules
tried in order, and what gradient GEMMs do) and the shorthands :func:`as_policy` accepts.

    >>> import tcemu
    >>> p = tcemu.Policy(default=None, rules=[({"param": "*mlp*kernel*"}, tcemu.GemmConfig(arch="A100"))])
    >>> op = tcemu.GemmOp("dot_general", "", ("0/mlp/kernel/value",), (2, 8), (8, 4), "float32", "float32",
    ...                   "float32", 2, 4, 8, None, False, (((1,), (0,)), ((), ())))
    >>> import dataclasses
    >>> p.choose(op).arch, p.choose(dataclasses.replace(op, params=()))
    ('A100', None)
"""
from __future__ import annotations

import dataclasses
import fnmatch

import jax.numpy as jnp

from tcemu._src.emulate.ops import GEMMS, GemmOp
from tcemu._src.gemm import GemmConfig
from tcemu._src import library, library_layers

MATCH_KEYS = ("scope", "param", "dtype", "primitive", "min_k", "max_k", "backward")
BACKWARD = ("vjp", "forward")
VJP = "vjp"


class Match(dict):
    """A rule's match (a dict of checked criteria), hashable."""

    def __hash__(self):
        return hash(frozenset(self.items()))


def _strings(v, where: str, what: str) -> tuple:
    vals = (v,) if isinstance(v, str) else v
    try:
        vals = tuple(vals)
    except TypeError:
        vals = None
    if not vals or not all(isinstance(s, str) for s in vals):
        raise TypeError(f"{where} must be {what} or a sequence of them, got {v!r}")
    return vals


def _dtypes(v, where: str) -> tuple:
    vals = (v,) if isinstance(v, str) or not isinstance(v, (tuple, list)) else tuple(v)
    out = []
    for d in vals:
        try:
            out.append(jnp.dtype(d).name)
        except TypeError:
            raise ValueError(f"{where}: {d!r} is not a dtype; give dtype names such as 'bfloat16', 'float16', "
                             "'float32', 'float8_e4m3fn'") from None
    if not out:
        raise ValueError(f"{where} must name at least one dtype")
    return tuple(out)


def check_match(match, where: str) -> Match:
    """A rule's match dict, checked: known keys, values of the right types."""
    if not isinstance(match, dict):
        raise TypeError(f"{where} match must be a dict with keys among {', '.join(MATCH_KEYS)}, got {match!r}")
    unknown = sorted(set(map(str, match)) - set(MATCH_KEYS))
    if unknown:
        raise ValueError(f"{where} match has unknown key(s) {', '.join(map(repr, unknown))}; valid keys: "
                         f"{', '.join(MATCH_KEYS)}")
    out = Match()
    for key, v in match.items():
        w = f"{where} {key!r}"
        if key in ("scope", "param"):
            out[key] = _strings(v, w, "a glob pattern (str)")
        elif key == "dtype":
            out[key] = _dtypes(v, w)
        elif key == "primitive":
            out[key] = _strings(v, w, "a primitive name (str)")
            bad = [p for p in out[key] if p not in GEMMS]
            if bad:
                raise ValueError(f"{w}: unknown primitive(s) {bad}; valid: {', '.join(GEMMS)}")
        elif key in ("min_k", "max_k"):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise TypeError(f"{w} must be an integer >= 0, got {v!r}")
            out[key] = v
        else:
            if not isinstance(v, bool):
                raise TypeError(f"{w} must be True (gradient GEMMs) or False (forward GEMMs), got {v!r}")
            out[key] = v
    return out


def matches(match: Match, op: GemmOp) -> bool:
    """Whether ``op`` meets every criterion of ``match``."""
    tests = {"scope": lambda ps: any(fnmatch.fnmatchcase(op.scope, p) for p in ps),
             "param": lambda ps: any(fnmatch.fnmatchcase(q, p) for p in ps for q in op.params),
             "dtype": lambda ds: op.lhs_dtype in ds and op.rhs_dtype in ds,
             "primitive": lambda ps: op.primitive in ps,
             "min_k": lambda k: op.K >= k, "max_k": lambda k: op.K <= k,
             "backward": lambda b: op.backward == b}
    return all(tests[k](v) for k, v in match.items())


def _check_config(cfg, where: str):
    if cfg is None or isinstance(cfg, GemmConfig) or (callable(cfg) and not isinstance(cfg, type)):
        return cfg
    raise TypeError(f"{where} must be a tcemu.GemmConfig, None (run natively) or a callable op -> GemmConfig | None, "
                    f"got {cfg!r}")


def resolve(cfg, op: GemmOp, where: str):
    """A rule's or the default's config for ``op`` (calling it when it is a callable)."""
    if cfg is None or isinstance(cfg, GemmConfig):
        return cfg
    out = cfg(op)
    if out is not None and not isinstance(out, GemmConfig):
        raise TypeError(f"{where} {cfg!r} returned {out!r} for {op}; it must return a tcemu.GemmConfig or None")
    return out


@dataclasses.dataclass(frozen=True)
class LibraryConfig:
    """The config :func:`tcemu.library_config` gives each GEMM (a policy callable). A layer preset's
    epilogue (where a bias is added) has no bias to add here: the model's own add stays native."""

    lib: str
    arch: str
    flags: tuple = ()

    def __post_init__(self):
        libs, gpus = {**library.LIBRARIES, **library_layers.LAYERS}, library.GPUS
        if self.lib not in libs:
            raise ValueError(f"Policy.library: lib must be one of {', '.join(libs)}, got {self.lib!r}")
        if not any(str(self.arch).upper().replace("NVIDIA ", "").startswith(g) for g in gpus):
            raise ValueError(f"Policy.library: arch must be one of {', '.join(gpus)}, got {self.arch!r}")
        for name, v in self.flags:
            if name not in libs[self.lib]:
                raise TypeError(f"Policy.library: {self.lib} takes no flag {name}; its flags: "
                                f"{', '.join(libs[self.lib]) or 'none'}")
            if not isinstance(v, bool):
                raise TypeError(f"Policy.library: {name} must be True or False, got {v!r}")

    def __call__(self, op: GemmOp) -> GemmConfig:
        return library_layers.library_config(self.lib, arch=self.arch, M=op.M, N=op.N, K=op.K, a=jnp.dtype(op.lhs_dtype),
                              b=jnp.dtype(op.rhs_dtype), out=jnp.dtype(op.out_dtype), batch=op.batch,
                              **dict(self.flags))


@dataclasses.dataclass(frozen=True)
class Policy:
    """Which :class:`tcemu.GemmConfig` each GEMM of a :func:`tcemu.emulate`-d function runs with.

    Attributes:
      default: the config of forward GEMMs no rule matches: a GemmConfig, None (run natively), or
        a callable ``op -> GemmConfig | None`` (``op`` a :class:`tcemu.GemmOp`; a ValueError it
        raises marks the op unsupported, with its message as the reason).
      rules: ``((match, config), ...)`` tried in order, the first match wins; ``config`` as for
        ``default``. ``match`` is a dict of criteria, all of which must hold: "scope" (glob
        pattern(s), :func:`fnmatch.fnmatchcase`, against ``op.scope``), "param" (glob(s) against
        any of ``op.params``, e.g. "*mlp*kernel*"), "dtype" (dtype name(s): both inputs among
        them), "primitive" ("dot_general" / "conv_general_dilated"), "min_k" / "max_k" (bounds on
        K), "backward" (True: only gradient GEMMs, False: only forward GEMMs).
      backward: what gradient GEMMs (made by JAX's transpose inside the function, e.g. by a
        ``jax.grad`` in a train step) that no ``"backward": True`` rule matches run with:
        "vjp" (default) as tcemu's own VJP computes them: with the config of the forward GEMM
        they differentiate (found by the forward operand they read), its ``grad_lhs`` /
        ``grad_rhs`` (None: exactly in float32) on that operand quantised to the forward
        config's input format, so ``emulate(train_step)`` gives the bits of the train step
        written with ``tcemu.dot_general`` (both jitted); a gradient GEMM whose forward GEMM is
        out of view (the transposed body of a ``scan``) takes the rules' and default's config's
        ``grad_lhs`` (which must equal ``grad_rhs``) on its operands as they are. "forward": the
        rules and default, like forward GEMMs; or one GemmConfig / None for all of them.

    >>> import jax, jax.numpy as jnp, tcemu
    >>> p = tcemu.Policy(default=None, rules=[({"scope": "*attn*"}, tcemu.GemmConfig(arch="H100"))])
    >>> def f(x, w):
    ...     with jax.named_scope("attn"):
    ...         y = x @ w
    ...     return y @ w.T
    >>> [row.status for row in tcemu.emulate(f, p).report(jnp.ones((2, 8), jnp.float32), jnp.ones((8, 8), jnp.float32))]
    ['emulated', 'native (policy)']
    """

    default: object = None
    rules: tuple = ()
    backward: object = VJP

    def __post_init__(self):
        _check_config(self.default, "Policy.default")
        if isinstance(self.rules, (str, dict)) or not isinstance(self.rules, (tuple, list)):
            raise TypeError(f"Policy.rules must be a sequence of (match, config) pairs, got {self.rules!r}")
        rules = []
        for i, rule in enumerate(self.rules):
            if not isinstance(rule, (tuple, list)) or len(rule) != 2:
                raise TypeError(f"Policy.rules[{i}] must be a (match, config) pair, e.g. "
                                f"({{'scope': '*attn*'}}, tcemu.GemmConfig(...)), got {rule!r}")
            rules.append((check_match(rule[0], f"Policy.rules[{i}]"), _check_config(rule[1], f"Policy.rules[{i}] config")))
        object.__setattr__(self, "rules", tuple(rules))
        b = self.backward
        if not (b is None or isinstance(b, GemmConfig) or (isinstance(b, str) and b in BACKWARD)):
            raise ValueError(f"Policy.backward must be one of {', '.join(map(repr, BACKWARD))}, a tcemu.GemmConfig "
                             f"or None, got {b!r}")

    @classmethod
    def library(cls, lib: str, arch: str, **flags) -> "Policy":
        """Every GEMM with the config :func:`tcemu.library_config` gives for ``lib`` on ``arch``
        at the GEMM's M, N, K, batch and types (``flags``: the library's flags). GEMMs whose
        types the library table lacks are unsupported, with its message as the reason.

        >>> import jax.numpy as jnp, tcemu
        >>> f = tcemu.emulate(jnp.dot, tcemu.Policy.library("jnp.dot", arch="H100", xla_autotune=False))
        >>> f.report(jnp.ones((4, 16), jnp.bfloat16), jnp.ones((16, 8), jnp.bfloat16))[0].config.instruction
        'm16n8k16.f32.bf16.bf16.f32'
        """
        return cls(default=LibraryConfig(lib, arch, tuple(sorted(flags.items()))))

    def forward_config(self, op: GemmOp):
        """The config of ``op`` by the rules (those not marked ``"backward": True``) and default."""
        for i, (match, cfg) in enumerate(self.rules):
            if match.get("backward") is not True and matches(match, op):
                return resolve(cfg, op, f"Policy.rules[{i}] config")
        return resolve(self.default, op, "Policy.default")

    def choose(self, op: GemmOp):
        """``op``'s config (None: native), or "vjp" for a gradient GEMM left to the VJP rule."""
        if not op.backward:
            return self.forward_config(op)
        for i, (match, cfg) in enumerate(self.rules):
            if match.get("backward") is True and matches(match, op):
                return resolve(cfg, op, f"Policy.rules[{i}] config")
        if self.backward == VJP:
            return VJP
        return self.forward_config(op) if self.backward == "forward" else self.backward


def as_policy(policy, where: str = "emulate") -> Policy:
    """``policy`` as a :class:`Policy`: a GemmConfig (every GEMM), a Policy, or a callable."""
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, GemmConfig) or (callable(policy) and not isinstance(policy, type)):
        return Policy(default=policy)
    raise TypeError(f"{where}: policy must be a tcemu.GemmConfig (every GEMM), a tcemu.Policy, or a callable "
                    f"op -> GemmConfig | None; got {policy!r} (for all-native use tcemu.Policy(default=None))")
