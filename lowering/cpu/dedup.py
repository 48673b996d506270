"""Merge identical internal functions of a generated module before LLVM sees it.

    LLVM IR text (codegen.generate: one internal function per kernel, epilogue
    callback and outlined parallel body)
          │ merge_identical: group internal functions whose text is equal once
          │ their own name is blanked; keep the first of each group, point every
          │ reference at it, drop the rest; repeat until nothing merges (merging
          │ callees makes their callers equal); the kept ones are noinline
          ▼
    LLVM IR text with one copy of each distinct kernel

Why: a deep network repeats its layers, and so does its gradient: a 20-layer
residual MLP's value_and_grad has 165 functions of which 22 are distinct.  The
O3 pipeline and instruction selection cost time per function, so compiling
every copy made compile time grow with depth (about 3x JAX's jit compile of the
same model).  Equal text means equal semantics (the signature is part of it),
so merging is always safe; it is the textual twin of LLVM's MergeFunctions
pass, done before the optimizer instead of after it.
"""
from __future__ import annotations

import re

__all__ = ["merge_identical"]

_DEFINE = re.compile(r'^define internal [^@]*@("(?:[^"\\]|\\.)*"|[\w.$-]+)\(', re.M)


def _functions(text: str) -> list[tuple[int, int, str]]:
    """(start, end, quoted-or-bare name) of each internal function definition."""
    out = []
    for m in _DEFINE.finditer(text):
        end = text.find("\n}\n", m.end())
        if end < 0:
            end = len(text) - 1
        out.append((m.start(), end + 3, m.group(1)))
    return out


def _ref(name: str) -> re.Pattern:
    """References to @name (quoted names match exactly; bare ones at a word end)."""
    if name.startswith('"'):
        return re.compile(re.escape("@" + name))
    return re.compile(re.escape("@" + name) + r"(?![\w.$-])")


def merge_identical(text: str) -> tuple[str, int]:
    """(text with duplicate internal functions merged, how many were removed)."""
    removed = 0
    kept: set[str] = set()
    while True:
        funcs = _functions(text)
        first: dict[str, str] = {}
        alias: dict[str, str] = {}
        for start, end, name in funcs:
            body = _ref(name).sub("@__self__", text[start:end])
            keep = first.setdefault(body, name)
            if keep != name:
                alias[name] = keep
        if not alias:
            return _noinline(text, kept), removed
        parts, pos = [], 0
        for start, end, name in funcs:
            if name in alias:
                parts.append(text[pos:start])
                pos = end
        parts.append(text[pos:])
        text = "".join(parts)
        for name, keep in alias.items():
            text = _ref(name).sub(lambda _m, k=keep: "@" + k, text)
        removed += len(alias)
        kept |= set(alias.values())


def _noinline(text: str, names: set[str]) -> str:
    """Mark the merged functions noinline: the inliner would otherwise paste a copy into
    every caller again (a 20-layer gradient became one 10,000-line function)."""
    if not names:
        return text
    parts, pos = [], 0
    for start, end, name in _functions(text):
        if name not in names:
            continue
        head_end = text.find("\n{", start)
        head = text[start:head_end]
        if "alwaysinline" in head or "noinline" in head:
            continue
        parts.append(text[pos:head_end] + " noinline")
        pos = head_end
    parts.append(text[pos:])
    return "".join(parts)
