"""The lexical layer of the PTX parsers: a spelling cleaned and split into dotted qualifiers,
the qualifiers sorted into categories (``.sync``, ``.aligned``, layouts, shapes, types, ...) with
errors that name the valid choices and suggest close matches, and the shape and ``.scale_vec``
qualifiers read as numbers. Every parser of :mod:`tcemu._src.isa.parse` builds on these.
"""
from __future__ import annotations

import difflib
import re

# Block-scale factors per row of A / column of B (PTX ``.scale_vec::NX``).
SCALE_VECS = ("scale_vec::1X", "scale_vec::2X", "scale_vec::4X")


def _close(tok, choices):
    if tok.lower() in choices:
        return f" (qualifiers are lower case: .{tok.lower()})"
    m = [c for c in difflib.get_close_matches(tok, choices, n=3) if c != tok]
    return f" (did you mean {', '.join('.' + c for c in m)}?)" if m else ""


def clean(spelling) -> str:
    """The spelling without surrounding whitespace and a trailing ``;``; rejects non-strings,
    empty spellings and whitespace inside."""
    if not isinstance(spelling, str):
        raise TypeError(f"a PTX spelling must be a string, got {spelling!r} ({type(spelling).__name__})")
    s = spelling.strip().rstrip(";").rstrip()
    if not s:
        raise ValueError(f"empty PTX spelling {spelling!r}; expected e.g. "
                         "'wmma.load.a.sync.aligned.row.m16n16k16.f16'")
    ws = re.search(r"\s", s)
    if ws:
        raise ValueError(f"{spelling!r}: whitespace inside the spelling (after {s[:ws.start()]!r}); "
                         "write the instruction as one dotted word")
    return s


def split(spelling: str, prefix: str):
    """(the cleaned spelling, its qualifier tokens after ``prefix``)."""
    s = clean(spelling)
    if not s.startswith(prefix + "."):
        raise ValueError(f"{spelling!r} does not start with {prefix!r}")
    return s, s[len(prefix) + 1:].split(".")


class Quals:
    """Sorts qualifier tokens into categories, rejecting unknown and repeated ones."""

    def __init__(self, spelling, tokens, categories: dict[str, tuple[str, ...]], shapes_re=None):
        self.found: dict[str, list[str]] = {c: [] for c in categories}
        valid = [v for vs in categories.values() for v in vs]
        for tok in tokens:
            if not tok:
                raise ValueError(f"{spelling!r}: empty qualifier (two dots in a row, or a trailing dot?)")
            for cat, vals in categories.items():
                if tok in vals:
                    self.found[cat].append(tok)
                    break
            else:
                if shapes_re and re.fullmatch(r"m\d+n\d+k\d+", tok):
                    raise ValueError(f"{spelling!r}: shape .{tok} is not valid here; valid shapes: "
                                     f"{', '.join('.' + v for v in categories['shape'])}")
                shown = f".{tok}" if tok.isascii() and tok.isprintable() else repr("." + tok)
                raise ValueError(f"{spelling!r}: unknown qualifier {shown}{_close(tok, valid)}; valid "
                                 f"qualifiers: {', '.join('.' + v for v in valid)}")

    def one(self, spelling, cat, *, required=True, multi_ok=False):
        vals = self.found[cat]
        if len(vals) > 1 and not multi_ok:
            raise ValueError(f"{spelling!r}: more than one {cat} qualifier: {', '.join(vals)}")
        if not vals:
            if required:
                raise ValueError(f"{spelling!r}: missing the {cat} qualifier")
            return None
        return vals[0]


def check_sync(spelling, q):
    """The mandatory ``.sync`` is present; ``.sync`` and ``.aligned`` are not repeated."""
    if not q.found["sync"]:
        raise ValueError(f"{spelling!r}: the mandatory .sync qualifier is missing")
    for cat in ("sync", "aligned"):
        if len(q.found[cat]) > 1:
            raise ValueError(f"{spelling!r}: .{cat} given twice")


def mnk(shape):
    """(M, N, K) of a ``mMnNkK`` shape qualifier."""
    m = re.fullmatch(r"m(\d+)n(\d+)k(\d+)", shape)
    return tuple(int(x) for x in m.groups())


def parse_scale_vec(s: str, kind: str, vecs: dict, vec: str | None) -> int:
    """The scale_vec of a block-scaled kind (its default where PTX has one), validated."""
    valid = ", ".join(f".scale_vec::{v}X" for v in vecs)
    if vec is None:
        if len(vecs) > 1:
            raise ValueError(f"{s!r}: .kind::{kind} needs a .scale_vec qualifier ({valid})")
        return next(iter(vecs))
    nvec = int(vec[len("scale_vec::"):-1])
    if nvec not in vecs:
        raise ValueError(f"{s!r}: .{vec} is not valid with .kind::{kind}; valid: {valid}")
    return nvec
