"""C text helpers for the artifact templates: literals, comments, macro names.

Every value the fillers put into C goes through one of these, so a model,
param or file name can never end a comment, a string or a macro early.
"""
from __future__ import annotations

import math
import re

import numpy as np

from rlxc.runtime.dims import label

__all__ = ["c_string", "comment", "hexf", "hexd", "fmt_shape", "macro"]


def c_string(s: str) -> str:
    """A C string literal for `s` (UTF-8; quotes, backslashes and controls escaped)."""
    out = []
    for b in s.encode("utf-8"):
        c = chr(b)
        if c in '"\\':
            out.append("\\" + c)
        elif 32 <= b < 127 and c != "?":
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def comment(s: str) -> str:
    """`s` safe inside a C block comment (no terminator, nested opener, trigraph, newline)."""
    return (s.replace("*/", "* /").replace("/*", "/ *").replace("??", "? ?")
            .replace("\n", " ").replace("\r", " "))


def hexf(x: float) -> str:
    """A C float literal with the exact value of the float32 `x`."""
    x = float(np.float32(x))
    if math.isinf(x) or math.isnan(x):
        raise ValueError(f"non-finite optimizer constant {x}")
    return f"{x.hex()}f" if x != 0 else "0.0f"


def hexd(x: float) -> str:
    """A C double literal with the exact value of `x`."""
    x = float(x)
    return x.hex() if x != 0 else "0.0"


def fmt_shape(shape) -> str:
    """[B, 784]; an anonymous dim (None in an input's shape) by its label: [x.0, 784]."""
    return "[" + ", ".join(str(label(d)) for d in shape) + "]"


def macro(name: str) -> str:
    """The upper-case macro prefix of an artifact name."""
    return re.sub(r"\W", "_", name).upper()
