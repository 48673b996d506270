"""The filler for the artifact templates (`glue.c.in`, `header.h.in`, `package.py.in`).

    templates/NAME.in  +  {key: text}  +  {section: bool}
          │ fill: keep or drop `@if S@ ... @else@ ... @end@` line blocks,
          │       then replace every `@key@` with its text
          ▼
    the generated file's text

A template is the generated file as it will read, with `@key@` holes; the
Python side computes only the values (tables, names, numbers).  Section
markers sit alone on their line and nest.  Strict both ways: a hole with no
value, a value no hole uses, and an unknown or unbalanced section marker all
raise ValueError naming the template, so a template and its filler cannot
silently drift apart.  The files are package data (pyproject.toml), read with
importlib.resources.
"""
from __future__ import annotations

import functools
import re
from importlib import resources

__all__ = ["fill", "template_text"]

_HOLE = re.compile(r"@([a-z][a-z0-9_]*)@")
_MARK = re.compile(r"^@(if [a-z][a-z0-9_]*|else|end)@\n?$")


@functools.lru_cache(maxsize=None)
def template_text(name: str) -> str:
    """The text of lowering/artifact/templates/`name`."""
    return resources.files(__package__).joinpath("templates", name).read_text("utf-8")


def _sections(name: str, text: str, sections: dict) -> str:
    out, stack = [], []  # stack of (section, keeping-before, keeping-now)
    keep = True
    for line in text.splitlines(keepends=True):
        m = _MARK.match(line)
        if not m:
            if keep:
                out.append(line)
            continue
        word = m.group(1)
        if word.startswith("if "):
            sec = word[3:]
            if sec not in sections:
                raise ValueError(f"template {name}: no value for section {sec!r}")
            stack.append((sec, keep))
            keep = keep and bool(sections[sec])
        elif not stack:
            raise ValueError(f"template {name}: @{word}@ without @if@")
        elif word == "else":
            sec, outer = stack[-1]
            keep = outer and not sections[sec]
        else:
            keep = stack.pop()[1]
    if stack:
        raise ValueError(f"template {name}: section {stack[-1][0]!r} is not closed with @end@")
    return "".join(out)


def fill(name: str, values: dict, sections: dict | None = None) -> str:
    """`name`'s template with its sections chosen and its holes filled from `values`."""
    text = _sections(name, template_text(name), sections or {})

    def sub(m):
        key = m.group(1)
        if key not in values:
            raise ValueError(f"template {name}: no value for @{key}@")
        return str(values[key])

    unused = set(values) - set(_HOLE.findall(template_text(name)))
    if unused:
        raise ValueError(f"template {name}: values {sorted(unused)} fill no hole")
    return _HOLE.sub(sub, text)
