"""`rlxc compile SRC -o OUTDIR`: a model as a native library, header, JSON and package.

    SRC (path/model.py:factory -> Func, or model.mlir)
      │ --transform EXPR ...      (grad, value_and_grad, vmap, jvp, hvp, *_all; in order)
      │ --params FILE.safetensors (baked into the library)
      │ --train --optimizer K --lr X   (adds NAME_train_step from rlxc/train.py's step)
      ├─► --emit rlx|loops|llvm|asm|ptx   print that stage to stdout, build nothing
      ▼
    rlxc/export.py (spec) → the --target backend's artifact writer (rlxc/registry.py ->
    lowering/artifact/writer.py): OUTDIR/libNAME.so NAME.h NAME.json NAME/

Transform expressions are parsed by a tiny recursive-descent parser (no
eval): `NAME` or `NAME(arg, key=value, ...)` where a value is an identifier
(dots allowed), a quoted string, an integer or a `[...]` list of those.
Unknown files, factories, transforms, keywords, names and options are usage
errors (exit 2) that list the valid choices; errors in the model itself exit
1 with a one-line message (the traceback with -v).
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import re
import sys
import traceback
from dataclasses import dataclass

import click

from .main import main

OPTIMIZERS = ("sgd", "adam", "adamw", "lion", "nadamw", "radam", "lamb", "adafactor", "muon")
# LLVM x86 CPU names accepted by --cpu (besides "native").
CPU_NAMES = (
    "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4", "generic", "nehalem", "westmere",
    "sandybridge", "ivybridge", "haswell", "broadwell", "skylake", "skylake-avx512",
    "cascadelake", "cooperlake", "cannonlake", "icelake-client", "icelake-server", "tigerlake",
    "rocketlake", "alderlake", "raptorlake", "meteorlake", "arrowlake", "lunarlake",
    "sapphirerapids", "emeraldrapids", "graniterapids", "sierraforest", "grandridge",
    "znver1", "znver2", "znver3", "znver4", "znver5",
)
# LLVM AArch64 CPU names accepted by --cpu with --target aarch64-linux-gnu.
AARCH64_CPU_NAMES = (
    "generic", "cortex-a53", "cortex-a55", "cortex-a72", "cortex-a76", "cortex-a78",
    "cortex-x1", "neoverse-n1", "neoverse-n2", "neoverse-v1", "neoverse-v2", "apple-m1",
    "apple-m2", "ampere1", "a64fx",
)


def resolve_cpu(target: str, cpu: str) -> str:
    """--cpu checked against --target's architecture; returns the backend's cpu string
    (rlxc/registry.py CpuBackend.cpu_string: "native", "x86-64-v3",
    "aarch64-linux-gnu:neoverse-n1", ...)."""
    from rlxc.registry import CpuBackend, backend

    b = backend(target)
    arch = b.arch() if isinstance(b, CpuBackend) else "x86_64"
    names = (("native",) + AARCH64_CPU_NAMES if arch == "aarch64"
             else ("native", "portable") + CPU_NAMES)
    if cpu not in names:
        raise click.BadParameter(f"unknown CPU {cpu!r} for --target {target}; valid: "
                                 f"{', '.join(names)}", param_hint="'--cpu'")
    if cpu == "portable":
        from rlxc.lowering.artifact.isa import PORTABLE_CPU

        cpu = PORTABLE_CPU
    return b.cpu_string(cpu) if isinstance(b, CpuBackend) else cpu


# -- transform expressions ------------------------------------------------------------
class TransformError(ValueError):
    """A transform expression that does not parse or names something unknown."""


@dataclass(frozen=True)
class TParam:
    name: str
    kind: str  # "names" | "int"
    aliases: tuple = ()


# name -> (parameters in positional order, Func method name)
TRANSFORMS: dict[str, tuple[tuple[TParam, ...], str]] = {
    "grad": ((TParam("wrt", "names"),), "grad"),
    "value_and_grad": ((TParam("wrt", "names"),), "value_and_grad"),
    "grad_all": ((), "grad_all"),
    "value_and_grad_all": ((), "value_and_grad_all"),
    "vmap": ((TParam("batched", "names", ("in_axes", "inputs")),
              TParam("batch_size", "int", ("size", "n"))), "vmap"),
    "jvp": ((TParam("tangent_for", "names", ("wrt",)),), "jvp"),
    "hvp": ((TParam("wrt", "names"),), "hvp"),
}

_TOKEN = re.compile(r"""\s*(?:(?P<num>-?\d+)|(?P<id>[A-Za-z_][\w.]*)|(?P<str>'[^']*'|"[^"]*")
                    |(?P<punct>[()\[\],=]))""", re.VERBOSE)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise TransformError(f"cannot parse transform {text!r} at column {pos + 1}: "
                                 f"unexpected {text[pos:pos + 10]!r}")
        kind = m.lastgroup
        val = m.group(kind)
        out.append((kind, val[1:-1] if kind == "str" else val))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else ("end", "")

    def take(self, kind=None, val=None):
        k, v = self.peek()
        if (kind and k != kind) or (val is not None and v != val):
            want = val or kind
            raise TransformError(f"cannot parse transform {self.text!r}: expected {want!r}, "
                                 f"got {v or 'end of text'!r}")
        self.i += 1
        return v

    def value(self):
        k, v = self.peek()
        if (k, v) == ("punct", "["):
            self.take()
            items = []
            if self.peek() != ("punct", "]"):
                items.append(self.value())
                while self.peek() == ("punct", ","):
                    self.take()
                    items.append(self.value())
            self.take("punct", "]")
            return items
        if k == "num":
            self.take()
            return int(v)
        if k in ("id", "str"):
            self.take()
            return v
        raise TransformError(f"cannot parse transform {self.text!r}: expected a value, "
                             f"got {v or 'end of text'!r}")

    def parse(self):
        name = self.take("id")
        args, kwargs = [], {}
        if self.peek() == ("punct", "("):
            self.take()
            if self.peek() != ("punct", ")"):
                while True:
                    k, v = self.peek()
                    nxt = self.toks[self.i + 1] if self.i + 1 < len(self.toks) else None
                    if k == "id" and nxt == ("punct", "="):
                        self.take()
                        self.take()
                        if v in kwargs:
                            raise TransformError(f"transform {self.text!r}: {v!r} given twice")
                        kwargs[v] = self.value()
                    else:
                        if kwargs:
                            raise TransformError(f"transform {self.text!r}: positional "
                                                 "argument after a keyword argument")
                        args.append(self.value())
                    if self.peek() == ("punct", ","):
                        self.take()
                        continue
                    break
            self.take("punct", ")")
        if self.peek()[0] != "end":
            raise TransformError(f"cannot parse transform {self.text!r}: trailing "
                                 f"{self.peek()[1]!r}")
        return name, args, kwargs


def parse_transform(text: str) -> tuple[str, dict]:
    """`"vmap(x, 8)"` -> ("vmap", {"batched": ["x"], "batch_size": 8}); checked, no eval."""
    name, args, kwargs = _Parser(text).parse()
    if name not in TRANSFORMS:
        raise TransformError(f"unknown transform {name!r}; valid transforms: "
                             f"{', '.join(TRANSFORMS)}")
    params, _ = TRANSFORMS[name]
    if len(args) > len(params):
        raise TransformError(f"transform {name!r} takes {len(params)} argument(s) "
                             f"({', '.join(p.name for p in params) or 'none'}), got {len(args)}")
    bound = {p.name: a for p, a in zip(params, args)}
    for k, v in kwargs.items():
        p = next((p for p in params if k == p.name or k in p.aliases), None)
        if p is None:
            raise TransformError(f"transform {name!r}: unknown keyword {k!r}; valid keywords: "
                                 f"{', '.join(p.name for p in params) or 'none'}")
        if p.name in bound:
            raise TransformError(f"transform {name!r}: {p.name!r} given twice")
        bound[p.name] = v
    out = {}
    for p in params:
        if p.name not in bound:
            raise TransformError(f"transform {name!r}: missing {p.name!r} (e.g. "
                                 f"{_example(name)})")
        v = bound[p.name]
        if p.kind == "int":
            if not isinstance(v, int) or v <= 0:
                raise TransformError(f"transform {name!r}: {p.name} must be a positive integer, "
                                     f"got {v!r}")
        else:
            v = [v] if isinstance(v, str) else v
            if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
                raise TransformError(f"transform {name!r}: {p.name} must be a name or a "
                                     f"non-empty list of names, got {bound[p.name]!r}")
        out[p.name] = v
    return name, out


def _example(name: str) -> str:
    return {"grad": "grad(wrt=[w])", "value_and_grad": "value_and_grad(wrt=[w])",
            "vmap": "vmap(x, 8)", "jvp": "jvp(tangent_for=[x])", "hvp": "hvp(wrt=[x])"
            }.get(name, name)


def apply_transform(func, text: str):
    """Apply one transform expression to a Func (unknown names: TransformError)."""
    name, kw = parse_transform(text)
    params, method = TRANSFORMS[name]
    sig = func.signature()
    valid = {"wrt": [a.name for a in sig], "tangent_for": [a.name for a in sig],
             "batched": [a.name for a in sig if a.kind == "input"]}
    for p in params:
        if p.kind == "names":
            bad = [x for x in kw[p.name] if x not in valid[p.name]]
            if bad:
                raise TransformError(f"transform {text!r}: unknown name {bad[0]!r} for "
                                     f"{p.name}; valid: {', '.join(valid[p.name])}")
    if name in ("grad_all", "value_and_grad_all") and not func.param_names():
        raise TransformError(f"transform {text!r}: {func.name} has no params")
    return getattr(func, method)(*[kw[p.name] for p in params])


# -- loading SRC -------------------------------------------------------------------------
def _candidates(directory: str) -> list[str]:
    try:
        return sorted(f for f in os.listdir(directory or ".")
                      if f.endswith((".py", ".mlir", ".onnx")))
    except OSError:
        return []


def _factories(mod) -> list[str]:
    return sorted(n for n, v in vars(mod).items()
                  if inspect.isfunction(v) and v.__module__ == mod.__name__
                  and not n.startswith("_"))


def load_source(src: str, verbose: bool = False, onnx_options: dict | None = None):
    """The Func named by SRC: `path/model.py:factory`, a .onnx model (rlxc/onnx_import.py,
    `onnx_options` passed on), or MLIR text (recognised by content, any suffix)."""
    from rlxc.func import Func

    path, sep, factory = src.rpartition(":")
    if not sep or not path.endswith(".py"):
        path, factory = src, None
    if not os.path.isfile(path):
        d = os.path.dirname(path) or "."
        c = _candidates(d)
        raise click.BadParameter(f"file {path!r} not found; .py/.mlir/.onnx files in {d!r}: "
                                 f"{', '.join(c) if c else '(none)'}", param_hint="SRC")
    if not path.endswith(".py"):
        with open(path, "rb") as fh:
            head = fh.read(4096)
        if path.endswith(".onnx"):
            return _load_onnx(path, onnx_options or {}, verbose)
        from rlxc.dialect import module as M

        if not (path.endswith(".mlir") or M.looks_like_mlir(head.decode("utf-8", "replace"))):
            raise click.BadParameter(f"{src!r} is neither path/model.py:factory, a .onnx model "
                                     "nor MLIR text", param_hint="SRC")
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        try:
            return _func_from_mlir(text)
        except Exception as e:
            raise click.ClickException(f"{path}: not a valid rlx module: "
                                       f"{str(e).strip().splitlines()[-1] if str(e) else e!r}")
    modname = "rlxc_model_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    d = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, d)
    try:
        spec.loader.exec_module(mod)
    except SystemExit as e:
        raise click.ClickException(f"importing {path} called sys.exit({e.code!r})") from None
    except Exception as e:
        _user_error(f"importing {path} failed", e, verbose)
    finally:
        if sys.path and sys.path[0] == d:
            sys.path.pop(0)
    names = _factories(mod)
    if factory is None:
        raise click.BadParameter(f"{path!r}: name the factory as {path}:FACTORY; functions in "
                                 f"it: {', '.join(names) or '(none)'}", param_hint="SRC")
    fn = getattr(mod, factory, None)
    if not callable(fn):
        raise click.BadParameter(f"{path!r} has no factory {factory!r}; functions in it: "
                                 f"{', '.join(names) or '(none)'}", param_hint="SRC")
    try:
        f = fn()
    except SystemExit as e:
        raise click.ClickException(f"{path}:{factory}() called sys.exit({e.code!r}) instead "
                                   "of returning an rlxc.Func") from None
    except Exception as e:
        _user_error(f"{path}:{factory}() failed", e, verbose)
    if not isinstance(f, Func):
        raise click.ClickException(f"{path}:{factory}() returned {type(f).__name__}, not an "
                                   "rlxc.Func")
    return f


def _func_from_mlir(text: str):
    """The model Func of an rlx module: its one function, or the first of several (as
    `--emit rlx --train` prints: the model, then its train step, which --train rebuilds)."""
    from rlxc.dialect import module as M
    from rlxc.func import Func

    mods = M.split(M.parse_any(text))
    return Func.from_module(mods[0])


def _load_onnx(path: str, opts: dict, verbose: bool):
    """A .onnx model as a Func (rlxc.from_onnx); `opts["loss"]` adds a loss on output 0."""
    try:
        from rlxc.onnx_import import OnnxImportError, func_name, from_onnx, with_loss
    except ModuleNotFoundError as e:
        raise click.ClickException(f"{path}: reading ONNX needs the `onnx` package "
                                   f"(pip install onnx): {e}") from None
    try:
        stem = os.path.splitext(os.path.basename(path))[0]   # the artifact's default name
        f = from_onnx(path, name=func_name(stem), input_shapes=opts.get("input_shapes") or None)
        if opts.get("loss"):
            f = with_loss(f, opts["loss"])
    except OnnxImportError as e:
        if verbose:
            traceback.print_exc()
        raise click.ClickException(f"{path}: {e}") from None
    return f
def _fix_dims(f, dims):
    """`f` with the --sizes sizes fixed (all of them, or none: then one library serves
    every size, NAME_set_dims, lowering/artifact/dynglue.py)."""
    sizes = {}
    for d in dims:
        k, sep, v = d.partition("=")
        if not sep or not k or not v.strip().isdigit() or int(v) < 1:
            raise click.BadParameter(f"{d!r}: expected NAME=SIZE with SIZE >= 1",
                                     param_hint="'--sizes'")
        sizes[k.strip()] = int(v)
    from rlxc.runtime.dims import label

    names = {label(x): x for a in f.signature() for x in a.shape if isinstance(x, str)}
    syms = list(names.values())   # an anonymous dim by its label: --sizes x.0=SIZE
    unknown = sorted(set(sizes) - set(names))
    if unknown:
        raise click.BadParameter(f"{unknown}: not a dynamic dimension of {f.name!r} "
                                 f"(its dimensions: {sorted(names)})", param_hint="'--sizes'")
    sizes = {names[k]: v for k, v in sizes.items()}
    missing = sorted(label(s) for s in set(syms) - set(sizes))
    if sizes and missing:
        raise click.ClickException(
            f"--sizes fixes every dynamic dimension of {f.name!r} or none: also pass "
            + " ".join(f"--sizes {m}=SIZE" for m in missing)
            + " (without --sizes, one library serves every size)")
    return f.specialize(**sizes) if sizes else f


def _user_error(what: str, e: BaseException, verbose: bool):
    if verbose:
        traceback.print_exc()
    raise click.ClickException(f"{what}: {type(e).__name__}: {e}")


def _load_params(f, path: str) -> dict:
    from rlxc.checkpoint import CheckpointError, load_tensors

    if not os.path.isfile(path):
        d = os.path.dirname(path) or "."
        try:
            c = sorted(x for x in os.listdir(d) if x.endswith(".safetensors"))
        except OSError:
            c = []
        raise click.BadParameter(f"file {path!r} not found; .safetensors files in {d!r}: "
                                 f"{', '.join(c) or '(none)'}", param_hint="'--params'")
    try:
        tensors = load_tensors(path)
    except CheckpointError as e:
        raise click.ClickException(str(e))
    names = f.param_names()
    unknown = [k for k in tensors if k not in names]
    if unknown:
        raise click.BadParameter(f"{path}: {unknown[0]!r} is not a param of {f.name}; valid "
                                 f"params: {', '.join(names) or '(none)'}",
                                 param_hint="'--params'")
    for k, v in tensors.items():
        want = f.param_shape_of(k)
        if tuple(v.shape) != want:
            raise click.ClickException(f"{path}: param {k!r} has shape {tuple(v.shape)}, "
                                       f"{f.name} declares {want}")
    return tensors


def _optimizer(kind: str, lr: float, weight_decay, momentum):
    """A built-in optimizer by name, or `path/file.py:NAME` (an rlxc.optim.Optimizer
    subclass or factory, called as NAME(lr, weight_decay=..., momentum=...))."""
    import inspect

    from rlxc import optim

    path, sep, attr = kind.rpartition(":")
    if sep and path.endswith(".py"):
        cls = _optimizer_from_file(path, attr)
    elif kind in optim.BUILTINS:
        cls = optim.BUILTINS[kind]
    else:
        raise click.BadParameter(f"unknown optimizer {kind!r}; valid: {', '.join(OPTIMIZERS)}, "
                                 "or path/file.py:CLASS (an rlxc.optim.Optimizer subclass)",
                                 param_hint="'--optimizer'")
    kw = {}
    if weight_decay is not None:
        kw["weight_decay"] = weight_decay
    if momentum is not None:
        try:
            takes = "momentum" in inspect.signature(cls).parameters
        except (TypeError, ValueError):
            takes = True
        if not takes:
            raise click.BadParameter(f"--momentum does not apply to --optimizer {kind}",
                                     param_hint="'--momentum'")
        kw["momentum"] = momentum
    try:
        opt = cls(lr, **kw)
    except (ValueError, TypeError) as e:
        raise click.BadParameter(str(e), param_hint="'--optimizer'")
    if not isinstance(opt, optim.Optimizer):
        raise click.BadParameter(f"{kind}(...) returned {type(opt).__name__}, not an "
                                 "rlxc.optim.Optimizer", param_hint="'--optimizer'")
    return opt


def _optimizer_from_file(path: str, attr: str):
    if not os.path.isfile(path):
        raise click.BadParameter(f"file {path!r} not found", param_hint="'--optimizer'")
    modname = "rlxc_optim_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        raise click.ClickException(f"importing {path} failed: {type(e).__name__}: {e}")
    obj = getattr(mod, attr, None)
    if not callable(obj):
        raise click.BadParameter(f"{path!r} has no optimizer class {attr!r}",
                                 param_hint="'--optimizer'")
    return obj


# -- targets and stages (the backend registry, rlxc/registry.py) ------------------------------
class _RegistryChoice(click.Choice):
    """A click.Choice whose choices are read from the backend registry when used, so a
    backend registered after import is a valid --target / --emit value."""

    def __init__(self, names):
        self._names = names
        super().__init__(tuple(names()))

    @property
    def choices(self):
        return tuple(self._names())

    @choices.setter
    def choices(self, value):
        pass


def _artifact_targets():
    from rlxc.registry import artifact_targets

    return artifact_targets()


def _emit_stages():
    from rlxc.registry import emit_stages

    return emit_stages() + ["rlx-generic"]   # rlx in MLIR's generic op form


def check_target(target: str, emit: str | None, train: bool) -> None:
    """Usage errors for --emit / --train that `target`'s backend does not provide."""
    from rlxc.registry import artifact_targets, backend

    b = backend(target)
    if emit is not None and emit not in ("rlx", "rlx-generic") and emit not in b.stages:
        have = [t for t in artifact_targets() if emit in backend(t).stages]
        raise click.UsageError(
            f"--emit {emit} is not a stage of --target {target} (its stages: "
            f"{', '.join(('rlx',) + b.stages)}); --emit {emit} needs "
            + " or ".join(f"--target {t}" for t in have))
    if train and not b.train_artifact:
        have = [t for t in artifact_targets() if backend(t).train_artifact]
        raise click.UsageError(f"--train exports a C train step, which --target {target} "
                               f"does not build: use " + " or ".join(f"--target {t}"
                                                                      for t in have))


def emit_stage(stage: str, func, name: str, target: str, cpu: str) -> str:
    """The text of one pipeline stage of `func` (compiled under the symbol `name`)."""
    if stage == "rlx":
        return func.mlir()
    if stage == "rlx-generic":
        from rlxc.dialect import module as M

        return M.to_generic_text(func.module)
    from rlxc.registry import backend

    return backend(target).emit(stage, func.module, name, cpu)


def _onnx_options(src: str, loss, input_shapes, train: bool) -> dict:
    """--loss / --input-shape, which only a .onnx SRC takes, checked and parsed."""
    is_onnx = src.endswith(".onnx")
    if not is_onnx and (loss or input_shapes):
        raise click.UsageError("--loss and --input-shape apply to a .onnx SRC only")
    if is_onnx and train and not loss:
        raise click.UsageError("--train on a .onnx model needs --loss mse|cross_entropy "
                               "(the loss of output 0 against a `labels` input)")
    shapes = {}
    for item in input_shapes:
        name, eq, dims = item.partition("=")
        try:
            shapes[name] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shapes[name] = None
        if not eq or not name or shapes[name] is None:
            raise click.BadParameter(f"{item!r} is not NAME=D0,D1,... (e.g. x=4,784)",
                                     param_hint="'--input-shape'")
    return {"loss": loss, "input_shapes": shapes}


def emit_rlx_with_train(stage: str, func, step) -> str:
    """The model and its train step as ONE rlx module (model first), in `stage`'s form."""
    from rlxc.dialect import module as M

    mod = M.join([func.module, step.module])
    return M.to_generic_text(mod) if stage == "rlx-generic" else M.to_text(mod)


class _Command(click.Command):
    """A click command whose unknown-option error lists every valid option."""

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            opts = sorted({o for p in self.get_params(ctx) for o in p.opts if o.startswith("-")})
            raise click.UsageError(f"no such option: {e.option_name}; valid options: "
                                   f"{', '.join(opts)}", ctx) from None


@main.command("compile", cls=_Command)
@click.argument("src")
@click.option("-o", "--output", "outdir", type=click.Path(file_okay=False),
              help="Output directory for libNAME.so, NAME.h, NAME.json and NAME/.")
@click.option("--name", help="Artifact name (a C identifier, not a Python keyword or a "
                              "standard module); default: the Func's name made C-safe.")
@click.option("--target", type=_RegistryChoice(_artifact_targets), default="cpu",
              show_default=True, help="A registered backend (rlxc/registry.py): cpu (this "
                                      "machine), cuda, or a CPU to cross-compile for "
                                      "(aarch64-linux-gnu, x86_64-linux-gnu).")
@click.option("--cpu", "cpu", default="native", show_default=True,
              help="LLVM CPU name: native (this machine), portable (x86-64-v3: AVX2+FMA, "
                   "for unknown machines), x86-64-v4, skylake-avx512, znver4, ...; with "
                   "--target aarch64-linux-gnu: generic, neoverse-n1, cortex-a72, ...")
@click.option("--transform", "transforms", multiple=True, metavar="EXPR",
              help="grad(wrt=[w]), value_and_grad(wrt=[w]), grad_all, value_and_grad_all, "
                   "vmap(x, 8), jvp(tangent_for=[x]), hvp(wrt=[x]); repeatable, in order.")
@click.option("--params", "params_file", metavar="FILE.safetensors",
              help="Bake these param values into the library.")
@click.option("--emit", type=_RegistryChoice(_emit_stages),
              help="Print this stage to stdout instead of building.")
@click.option("--train", is_flag=True, help="Also export NAME_train_step (first output = loss).")
@click.option("--optimizer", default="adamw", show_default=True,
              help=f"{', '.join(OPTIMIZERS)}, or path/file.py:CLASS (an Optimizer subclass).")
@click.option("--lr", type=float, default=1e-3, show_default=True,
              help="Default learning rate of the train step.")
@click.option("--weight-decay", type=float, default=None, help="Optimizer weight decay.")
@click.option("--momentum", type=float, default=None, help="SGD momentum.")
@click.option("--max-grad-norm", type=float, default=0.0, show_default=True,
              help="Clip gradients to this global norm in the train step (0: off).")
@click.option("--loss", type=click.Choice(["mse", "cross_entropy"]), default=None,
              help="A .onnx SRC: add this loss of output 0 against a `labels` input (the "
                   "loss becomes output 0, the model's outputs follow); needed with --train.")
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=D0,D1,...",
              help="A .onnx SRC: the size of an input's dynamic (dim_param) dims; repeatable.")
@click.option("-v", "--verbose", is_flag=True, help="Print per-stage timings (stderr).")
@click.option("--sizes", "dims", multiple=True, metavar="NAME=SIZE",
              help="Fix a dynamic dimension for the library (B=32); repeatable.")
def compile_cmd(src, outdir, name, target, cpu, transforms, params_file, emit, train, optimizer,
                lr, weight_decay, momentum, max_grad_norm, loss, input_shapes, verbose, dims=()):
    """Compile SRC (path/model.py:factory or model.mlir) into OUTDIR.

    Writes libNAME.so, NAME.h (C ABI), NAME.json (metadata, sha256) and the
    Python package NAME/ (`import NAME; NAME.run(x=...)`)."""
    from rlxc.runtime.errors import NameLookupError, RlxError

    if emit is None and not outdir:
        raise click.UsageError("missing -o OUTDIR (or pass --emit STAGE to print a stage)")
    check_target(target, emit, train)
    cpu = resolve_cpu(target, cpu)
    from rlxc.lowering.artifact.spec import check_name

    if name is not None:
        try:
            check_name(name)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--name'") from None

    from rlxc import export as aot
    from rlxc.lowering.artifact.dynglue import NotSizeGeneric

    progress = aot.Progress(name or os.path.basename(src), verbose).start()
    ok = False
    try:
        with progress.stage("load source"):
            f = load_source(src, verbose, _onnx_options(src, loss, input_shapes, train))
        if name is None:
            name = f.symbol
            try:
                check_name(name)
            except ValueError as e:
                raise click.ClickException(f"the Func {f.name!r}: {e}") from None
        progress.label = name
        for t in transforms:
            with progress.stage(f"transform {t}"):
                try:
                    f = apply_transform(f, t)
                except TransformError as e:
                    raise click.BadParameter(str(e), param_hint="'--transform'") from None
                except NameLookupError as e:
                    raise click.BadParameter(str(e), param_hint="'--transform'") from None
        f = _fix_dims(f, dims)
        from rlxc.runtime.dims import label

        left = sorted({label(d) for a in f.signature() for d in a.shape if isinstance(d, str)})
        from rlxc.runtime.targets import target as runtime_target

        if left and runtime_target(target).family != "cpu" and not emit:
            raise click.ClickException(
                f"the Func {f.name!r} has dynamic dimensions {left}: a library for every size "
                f"is built for the CPU targets only; pass "
                + " ".join(f"--sizes {d}=SIZE" for d in left)
                + f" to build a --target {target} library for one size")
        if emit and emit not in ("rlx", "rlx-generic") and left:
            raise click.ClickException(
                f"--emit {emit} prints one size's code: the Func {f.name!r} has dynamic "
                f"dimensions {left}; pass --sizes {left[0]}=SIZE")
        baked = dict(f.params())
        if params_file:
            with progress.stage("load params"):
                baked.update(_load_params(f, params_file))
        spec = aot.spec_from_func(f, name, baked, cpu=cpu, target=target,
                                  transforms=transforms, source=src)
        if train:
            with progress.stage("train step (value_and_grad + update)"):
                opt = _optimizer(optimizer, lr, weight_decay, momentum)
                spec.train = aot.train_spec(f, opt, max_grad_norm)
        if emit:
            with progress.stage(f"emit {emit}"):
                if spec.train is not None and emit in ("rlx", "rlx-generic"):
                    # one module holding the model and its train step, which
                    # `rlxc opt` and `rlxc compile` read back (the model is the first)
                    text = emit_rlx_with_train(emit, f, spec.train.program.func)
                else:
                    text = emit_stage(emit, f, name, target, spec.cpu)
                if spec.train is not None and emit not in ("rlx", "rlx-generic"):
                    step = spec.train.program.func
                    text += ("\n" if not text.endswith("\n") else "") + \
                        emit_stage(emit, step, f"{name}_train_step_kernel", target, spec.cpu)
            ok = True
            click.echo(text, nl=not text.endswith("\n"))
            return
        from rlxc.registry import backend

        meta = backend(target).write_artifact(spec, outdir, progress)
        ok = True
    except click.ClickException:
        raise
    except NotSizeGeneric as e:   # a dynamic Func no single library serves: --sizes
        if verbose:
            traceback.print_exc()
        raise click.ClickException(str(e)) from None
    except (RlxError, ValueError, TypeError, NotImplementedError, RuntimeError, OSError) as e:
        if verbose:
            traceback.print_exc()
        raise click.ClickException(f"{type(e).__name__}: {e}") from None
    finally:
        progress.finish(ok)
    files = [meta["library"], meta["header"], f"{name}.json", f"{name}/__init__.py"]
    files = [f for f in files if f]
    if verbose and meta.get("sgemm"):
        from rlxc.lowering.cpu.sgemm_kernels import describe_params

        click.echo("rlxc: " + describe_params(meta["sgemm"]), err=True)
    click.echo(f"wrote {outdir}: " + " ".join(files))
