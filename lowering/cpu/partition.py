"""Split a generated module into parts that LLVM optimizes and compiles in parallel.

    LLVM IR text of one program (codegen, after dedup.merge_identical)
          │ split_module: the module's top-level items; the reference graph of its
          │ functions; the dominator tree of that graph from the entry points and the
          │ globals; bottom-up, a subtree of at least MIN_UNIT lines becomes a unit (a
          │ kernel with its outlined parallel bodies and helpers stays in one piece);
          │ units go to parts longest first, each onto the lightest part (part 0 holds
          │ the entry points, the globals and what no unit took)
          │ an internal symbol used from another part becomes hidden (the .so still
          │ exports nothing new) and that part declares it; private constants and the
          │ alwaysinline math helpers are copied into every part
          ▼
    N IR texts → target.compile_objects: a thread per part, each with its own
    LLVMContext and target machine → N objects, linked into one library

Why: the O3 pipeline and instruction selection are most of a cold compile (W10's
transformer block: 4.1 of 5.3 s) and LLVM works on one module on one core.  LLVM
is thread safe across contexts, so parts compile side by side.  The number of parts
depends on the module's size only, never on the machine's cores, so the same
program gives the same objects everywhere (reproducible builds); the cores only
decide how many parts run at once.  RLXC_LLVM_PARTS=1 compiles one module.

A program small enough for one part, or any top-level item this module does not
recognise, is returned as the single input text (the one-module path).
"""
from __future__ import annotations

import os
import re

__all__ = ["split_module", "parts_for"]

PART_LINES = 800   # lines of generated IR per part (W4's train step: 1745 lines -> 2 parts)
MAX_PARTS = 8
MIN_UNIT = 40      # a subtree smaller than this stays with its caller (inlining kept)

_NAME = r'@("(?:[^"\\]|\\.)*"|[\w.$-]+)'
_DEFINE = re.compile(r'define ([^@]*)' + _NAME + r'\(')
_GLOBAL = re.compile(_NAME + r' = (.*)$')
_REF = re.compile(_NAME)
_LINKAGE = ("private", "internal")


def parts_for(lines: int) -> int:
    """How many parts a module of `lines` lines is split into (RLXC_LLVM_PARTS caps it)."""
    cap = MAX_PARTS
    env = os.environ.get("RLXC_LLVM_PARTS", "").strip()
    if env:
        try:
            cap = max(1, int(env))
        except ValueError:
            raise ValueError(f"RLXC_LLVM_PARTS must be a whole number, got {env!r}") from None
    return max(1, min(cap, lines // PART_LINES))


class _Item:
    __slots__ = ("kind", "name", "text", "head", "refs", "lines", "linkage", "dup")

    def __init__(self, kind, name, text, head=""):
        self.kind, self.name, self.text, self.head = kind, name, text, head
        self.refs: set[str] = set()
        self.lines = text.count("\n")
        self.linkage = ""
        self.dup = False


def _items(text: str):
    """(header lines, items) or None when a top-level line is not one we know."""
    header, items = [], []
    lines = text.splitlines(True)
    i = 0
    while i < len(lines):
        ln = lines[i]
        if ln.startswith("define "):
            j = i
            while j < len(lines) and not lines[j].startswith("}"):
                j += 1
            if j == len(lines):
                return None
            m = _DEFINE.match(ln)
            if m is None:
                return None
            body = "".join(lines[i:j + 1])
            it = _Item("fn", m.group(2), body, ln)
            words = m.group(1).split()
            it.linkage = words[0] if words and words[0] in _LINKAGE + ("weak", "linkonce_odr",
                                                                        "hidden") else ""
            it.refs = {r for r in _REF.findall(body[m.end() - m.start():])}
            items.append(it)
            i = j + 1
            continue
        if ln.startswith("@"):
            m = _GLOBAL.match(ln.rstrip("\n"))
            if m is None or " alias " in ln or " ifunc " in ln:
                return None
            it = _Item("gv", m.group(1), ln)
            it.linkage = m.group(2).split()[0]
            it.refs = set(_REF.findall(m.group(2)))
            items.append(it)
        elif ln.startswith(("declare ", "attributes ", "!")) or (
                ln.startswith("%") and " = type " in ln):
            if not ln.startswith("declare ") and "@" in ln:
                return None   # metadata naming a symbol: every part would copy it
            items.append(_Item("other", None, ln))
        elif ln.startswith(("target ", "source_filename", ";")) or not ln.strip():
            header.append(ln)
        else:
            return None
        i += 1
    return header, items


def _mark_duplicable(items, by_name) -> None:
    """Private/internal constants, and internal alwaysinline functions that use only
    declarations and other such items: copied into every part that needs them."""
    for it in items:   # (a constant that points at a symbol stays one definition)
        if it.kind == "gv" and it.linkage in _LINKAGE and " constant " in it.text and \
                not any(r in by_name for r in it.refs):
            it.dup = True
    changed = True
    cands = [it for it in items if it.kind == "fn" and it.linkage == "internal"
             and re.search(r"\)\s[^{]*\balwaysinline\b", it.head)]
    while changed:
        changed = False
        for it in cands:
            if it.dup:
                continue
            if all(by_name.get(r) is None or by_name[r].dup or r == it.name
                   for r in it.refs):
                it.dup = changed = True


def _dominators(succ, roots):
    """Immediate dominator of each node reachable from `roots` (a virtual root None
    above them): the iterative algorithm of Cooper, Harvey and Kennedy."""
    order, seen = [], set()

    def dfs(n):
        stack = [(n, iter(succ.get(n, ())))]
        seen.add(n)
        while stack:
            v, it = stack[-1]
            for w in it:
                if w not in seen:
                    seen.add(w)
                    stack.append((w, iter(succ.get(w, ()))))
                    break
            else:
                order.append(v)
                stack.pop()
    for r in roots:
        if r not in seen:
            dfs(r)
    rpo = [None] + order[::-1]
    index = {n: i for i, n in enumerate(rpo)}
    preds: dict = {n: [] for n in rpo}
    for r in roots:
        preds[r].append(None)
    for v in order:
        for w in succ.get(v, ()):
            if w in index and v not in preds[w]:
                preds[w].append(v)
    idom = {None: None}

    def meet(a, b):
        while a != b:
            while index[a] > index[b]:
                a = idom[a]
            while index[b] > index[a]:
                b = idom[b]
        return a
    changed = True
    while changed:
        changed = False
        for n in rpo[1:]:
            ps = [p for p in preds[n] if p in idom]
            new = ps[0]
            for p in ps[1:]:
                new = meet(p, new)
            if idom.get(n, object()) != new:
                idom[n] = new
                changed = True
    return idom


def _declaration(it: _Item, hidden: bool) -> str:
    """`declare` for a function defined in another part, or `external` for a global."""
    vis = "hidden " if hidden else ""
    if it.kind == "gv":
        rest = it.text.split(" = ", 1)[1].split()
        words = [w for w in rest if w not in _LINKAGE + ("weak", "hidden", "dso_local",
                                                         "unnamed_addr", "local_unnamed_addr")]
        tls = words[0] + " " if words and words[0].startswith("thread_local") else ""
        if tls:   # thread_local, or thread_local(<model>)
            words = words[1:]
        kind = words[0]                      # global | constant
        ty = _type_of(" ".join(words[1:]))
        return f"@{it.name} = external {vis}{tls}{kind} {ty}\n"
    m = _DEFINE.match(it.head)
    ret = " ".join(w for w in m.group(1).split()
                   if w not in _LINKAGE + ("weak", "hidden", "dso_local"))
    params = _params(it.head[m.end():])
    tail = it.head[it.head.rfind(")") + 1:]   # function attributes: only nounwind carries
    nounwind = " nounwind" if re.search(r"\bnounwind\b", tail) else ""
    return f"declare {vis}{ret} @{it.name}({', '.join(params)}){nounwind}\n"


def _split_top(s: str) -> list[str]:
    """Split at commas outside (), [], {} and <>."""
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return out


def _params(after_paren: str) -> list[str]:
    """Parameter types (with their attributes, without names) of a define line."""
    depth, end = 1, 0
    for end, ch in enumerate(after_paren):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                break
    out = []
    for p in _split_top(after_paren[:end]):
        out.append(re.sub(r'\s+%("(?:[^"\\]|\\.)*"|[\w.$-]+)$', "", p))
    return out


def _type_of(init: str) -> str:
    """The type at the start of a global's `<type> <initializer>[, align N]`."""
    depth = 0
    for i, ch in enumerate(init):
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        elif ch == " " and depth == 0 and not init[i + 1:].startswith(("(", "*")):
            return init[:i]
    return init


def _promote(it: _Item, shared: bool) -> str:
    """The definition with internal/private linkage turned into hidden (weak_odr hidden
    for a `shared` object, which several objects of one link may each contain)."""
    vis = "weak_odr hidden" if shared else "hidden"
    if it.kind == "fn":
        return it.text.replace(f"define {it.linkage} ", f"define {vis} ", 1)
    return it.text.replace(f" = {it.linkage} ", " = hidden ", 1)


def split_module(text: str, parts: int | None = None,
                 hidden_globals: tuple[str, ...] = (), shared: bool = False) -> list[str]:
    """The IR texts of the parts of `text` (one: `text` itself, unchanged).

    `parts`: how many (default parts_for(lines)); `hidden_globals`: names that part 0
    makes hidden after parsing (target.HIDDEN_GLOBALS), declared hidden elsewhere;
    `shared`: the objects are a runtime piece that one link may hold several copies of
    (the sgemm objects, in every program's object): functions turn weak_odr hidden, and a
    global used across parts keeps the module whole."""
    n = parts_for(text.count("\n")) if parts is None else parts
    if n <= 1:
        return [text]
    parsed = _items(text)
    if parsed is None:
        return [text]
    header, items = parsed
    by_name = {it.name: it for it in items if it.name is not None}
    _mark_duplicable(items, by_name)
    units_of = [it for it in items if it.name is not None and not it.dup]
    # part 0: external definitions and globals (and their helpers no unit takes)
    fixed = [it.name for it in units_of
             if it.kind == "gv" or it.linkage not in _LINKAGE]
    movable = {it.name for it in units_of if it.name not in set(fixed)}
    succ = {it.name: [r for r in sorted(it.refs) if r in by_name and not by_name[r].dup
                      and r != it.name] for it in units_of}
    idom = _dominators(succ, fixed)
    children: dict = {}
    for v, d in idom.items():
        if v is not None:
            children.setdefault(d, []).append(v)
    # bottom-up: a movable node whose subtree (less the units cut below it) reaches
    # MIN_UNIT lines heads a unit
    weight: dict = {}
    head_of: dict = {}
    units: list[tuple[int, str]] = []

    def post(v):
        stack, out = [(v, False)], []
        while stack:
            x, done = stack.pop()
            if done:
                out.append(x)
                continue
            stack.append((x, True))
            for c in sorted(children.get(x, ()), reverse=True):
                stack.append((c, False))
        return out
    for v in post(None):
        if v is None:
            continue
        w = by_name[v].lines + sum(weight[c] for c in children.get(v, ())
                                   if c not in head_of)
        weight[v] = w
        if v in movable and w >= MIN_UNIT:
            head_of[v] = v
            units.append((w, v))
    if not units:
        return [text]
    # each movable node goes with the nearest unit head above it (itself included)
    where: dict = {}
    loads = [sum(by_name[f].lines for f in fixed)] + [0] * (n - 1)
    part_of_head = {}
    for w, h in sorted(units, key=lambda u: (-u[0], u[1])):
        p = min(range(n), key=lambda i: (loads[i], i))
        loads[p] += w
        part_of_head[h] = p
    unreached = [v for v in movable if v not in idom]
    for v in sorted(movable):
        x = v
        while x is not None and x not in head_of:
            x = idom.get(x)
        where[v] = part_of_head[x] if x is not None else 0
    for v in fixed + unreached:
        where[v] = 0
    if len(set(where.values())) == 1:
        return [text]
    # a symbol that turns hidden must be this program's own (named after one of its entry
    # points), so that two programs linked into one library never define it twice
    entries = tuple(it.name.strip('"') + "." for it in units_of
                    if it.kind == "fn" and it.linkage not in _LINKAGE)
    for it in units_of:
        if it.linkage in _LINKAGE and (shared and it.kind == "gv" or not it.name.strip(
                '"').startswith(entries)) and any(
                it.name in o.refs for o in units_of if where[o.name] != where[it.name]):
            return [text]
    # what each part defines, copies and declares
    out = []
    for p in range(n):
        mine = [it for it in units_of if where[it.name] == p]
        if not mine:
            continue
        need: set = set()
        for it in mine:
            need |= it.refs
        body = []
        for it in items:
            if it.kind == "other":
                body.append(it.text)
            elif it.dup:
                body.append(it.text)
            elif where[it.name] == p:
                foreign_use = it.linkage in _LINKAGE and any(
                    it.name in other.refs for other in units_of if where[other.name] != p)
                body.append(_promote(it, shared) if foreign_use else it.text)
            elif it.name in need:
                hidden = it.linkage in _LINKAGE or it.name.strip('"') in hidden_globals
                body.append(_declaration(it, hidden))
        out.append("".join(header) + "".join(body))
    return out if len(out) > 1 else [text]
