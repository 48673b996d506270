"""Artifact writer: a compiled model as libNAME.so + NAME.h + NAME.json + NAME/.

    Func (transformed, params bound or not)   [+ StepProgram for --train]
          │ compile_cpu (lowering/cpu/driver.py) per function: kernel object with
          │   int32_t rlx_<sym>(void **inputs, void **outputs, void **params, void *ws)
          ▼
    objects:  kernel.o [step.o]  +  glue.o (cc, generated C: contexts, params,
              metadata tables, error strings)  +  blob.o (baked params, .incbin)
          │ link_shared (cc -shared)
          ▼
    OUTDIR/libNAME.so   NAME.h   NAME.json (sha256 of the .so)   NAME/__init__.py

Purpose
-------
One compile serves three users: a C/C++ program (`NAME.h` + `libNAME.so`),
`import NAME` (a thin package over `rlxc.runtime.load`), and
`rlxc.runtime.load(OUTDIR)`.  The C ABI is the one documented in the header
this file generates (and in examples/embed_c/README.md).

Algorithm
---------
* The glue C file is generated from the signature: tables of names, dtypes,
  ranks and dims; a context struct holding a workspace, a pointer per param
  (NULL = unset; baked params point into the read-only blob until set) and,
  with --train, owned double buffers for params and optimizer slots.  It is
  compiled with the system cc against the generated header, so the header and
  the library cannot disagree.
* Baked params are written as one binary blob (each param 64-byte aligned) and
  assembled with `.incbin`: no C literal, so 10 MB of weights cost a few
  milliseconds, not a compiler run over millions of tokens.
* The train step calls the traced step function of rlxc/train.py (data |
  params | slots | opt_scalars -> loss | new params | new slots).  The
  per-step scalars are computed in C exactly as `Optimizer.step_scalars`:
  float64 from the hyperparameters (t-dependent ones such as 1 - b1**t with
  pow()), rounded to float32 once; constants are written as hex floats.
* Every file is written to a temporary name and renamed into place; the JSON,
  which holds the .so's sha256, is written last.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from rlxc.runtime.loader import (ABI_VERSION, ARTIFACT_FORMAT, ERROR_CODES, ERROR_DOCS,
                                 RLX_OK, TensorSpec,
                                 sha256_file)
from rlxc.runtime.signature import NP_DTYPES

__all__ = ["ArtifactSpec", "TrainSpec", "Progress", "spec_from_func", "build_artifact",
           "emit_header", "emit_glue", "emit_package", "emit_metadata", "check_header"]

C_TYPES = {"f32": "float", "f64": "double", "i1": "uint8_t", "i32": "int32_t", "i64": "int64_t"}
BLOB_ALIGN = 64

# -- what goes into an artifact -------------------------------------------------
@dataclass
class TrainSpec:
    """The --train part: the step function and how its arguments map to the context."""

    program: object              # rlxc.train.StepProgram
    optimizer: object            # rlxc.optim.Optimizer (its hyperparameters)
    lr: float
    scalar_names: list           # names in opt_scalars, in order
    scalar_src: list             # per scalar: ("lr",) | ("const", float32) | ("expr", C text)
    hp: dict                     # hyperparameters (floats) used by the expressions


@dataclass
class ArtifactSpec:
    name: str
    func: object                 # the forward Func
    inputs: list                 # TensorSpec
    outputs: list
    params: list
    baked: dict = field(default_factory=dict)   # param name -> array (declared dtype)
    train: TrainSpec | None = None
    target: str = "cpu"
    cpu: str = "native"
    transforms: list = field(default_factory=list)
    source: str = ""

    def ir_hash(self) -> str:
        h = hashlib.sha256(self.func.mlir().encode())
        if self.train is not None:
            h.update(b"\0train\0" + self.train.program.func.mlir().encode())
        return h.hexdigest()


def spec_from_func(func, name: str, baked: dict | None = None, *, cpu: str = "native",
                   target: str = "cpu", transforms=(), source: str = "") -> ArtifactSpec:
    """Describe `func`'s artifact; `baked` (default: the Func's bound params) is checked
    against the declared shapes and converted to the declared dtypes."""
    sig = func.signature()
    inputs = [TensorSpec(a.name, "input", tuple(a.shape), a.dtype)
              for a in sig if a.kind == "input"]
    from rlxc.dialect import module as M
    from rlxc.dialect.types import dtype_of, shape_of

    outs = M.outputs(M.get_func(func.module))
    outputs = [TensorSpec(f"out{i}", "output", shape_of(v.type), dtype_of(v.type))
               for i, v in enumerate(outs)]
    baked = dict(func.params() if baked is None else baked)
    params = []
    for a in sig:
        if a.kind != "param":
            continue
        if a.name in baked:
            arr = np.ascontiguousarray(np.asarray(baked[a.name]), NP_DTYPES[a.dtype])
            if arr.size != math.prod(a.shape):
                raise ValueError(f"baked param {a.name!r}: {arr.size} elements, declared "
                                 f"shape {tuple(a.shape)}")
            baked[a.name] = arr.reshape(tuple(a.shape))
        params.append(TensorSpec(a.name, "param", tuple(a.shape), a.dtype, a.name in baked))
    unknown = [k for k in baked if k not in {p.name for p in params}]
    if unknown:
        raise ValueError(f"baked params {unknown} are not params of {func.name}; "
                         f"params: {[p.name for p in params]}")
    return ArtifactSpec(name, func, inputs, outputs, params, baked, None, target, cpu,
                        list(transforms), source)


def train_spec(func, optimizer, max_grad_norm: float = 0.0) -> TrainSpec:
    """Build the step program of rlxc/train.py for `func` and the scalar recipe."""
    from rlxc.train import step_program

    outs = func.output_shapes()
    if math.prod(outs[0]) != 1:
        raise ValueError(f"--train: the first output of {func.name} is the loss and must have "
                         f"one element, got shape {outs[0]}")
    prog = step_program(func, optimizer, None, max_grad_norm)
    lr = float(optimizer.lr)
    recipe = optimizer.scalar_recipe()  # C expressions of t and lr (rlxc/optim.py)
    src = [recipe[n] for n in prog.scalar_names]
    return TrainSpec(prog, optimizer, lr, list(prog.scalar_names), src,
                     dict(optimizer.hyperparams()))


# -- progress --------------------------------------------------------------------
class Progress:
    """Stage timer: prints a status line to `stream` once a compile passes `after` s,
    and (verbose) a table of per-stage timings at the end."""

    def __init__(self, label: str, verbose: bool = False, stream=None, after: float = 1.0):
        self.label, self.verbose, self.after = label, verbose, after
        self.stream = stream if stream is not None else sys.stderr
        self.timings: list[tuple[str, float]] = []
        self.t0 = time.perf_counter()
        self.current = "starting"
        self._shown = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self._tick, daemon=True)
        self._thread.start()
        return self

    def _tick(self):
        last = None
        while not self._stop.wait(0.25):
            el = time.perf_counter() - self.t0
            if el < self.after:
                continue
            with self._lock:
                cur = self.current
            if cur != last or int(el) != int(el - 0.25):
                self._line(f"rlxc: compiling {self.label}: {cur} ... {el:.1f} s")
                last = cur

    def _line(self, text: str):
        tty = getattr(self.stream, "isatty", lambda: False)()
        if tty:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
        self._shown = True

    @contextmanager
    def stage(self, name: str):
        with self._lock:
            self.current = name
        t = time.perf_counter()
        try:
            yield
        finally:
            self.timings.append((name, time.perf_counter() - t))

    def record(self, name: str, seconds: float):
        self.timings.append((name, seconds))

    def finish(self, ok: bool = True):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        el = time.perf_counter() - self.t0
        if self._shown:
            tty = getattr(self.stream, "isatty", lambda: False)()
            end = "done" if ok else "failed"
            self.stream.write(("\r\033[K" if tty else "") +
                              f"rlxc: compiling {self.label}: {end} in {el:.2f} s\n")
        if self.verbose:
            w = max([len(n) for n, _ in self.timings] + [5])
            self.stream.write(f"rlxc: timings for {self.label} (total {el:.3f} s)\n")
            for n, s in self.timings:
                self.stream.write(f"  {n:<{w}}  {s * 1000:9.1f} ms\n")
        self.stream.flush()


class _NoProgress(Progress):
    def __init__(self):
        super().__init__("", False, stream=open(os.devnull, "w"), after=1e9)


# -- C text helpers ----------------------------------------------------------------
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


def _comment(s: str) -> str:
    """`s` safe inside a C block comment (no terminator, nested opener, trigraph, newline)."""
    return (s.replace("*/", "* /").replace("/*", "/ *").replace("??", "? ?")
            .replace("\n", " ").replace("\r", " "))


def _hexf(x: float) -> str:
    """A C float literal with the exact value of the float32 `x`."""
    x = float(np.float32(x))
    if math.isinf(x) or math.isnan(x):
        raise ValueError(f"non-finite optimizer constant {x}")
    return f"{x.hex()}f" if x != 0 else "0.0f"


def _hexd(x: float) -> str:
    x = float(x)
    return x.hex() if x != 0 else "0.0"


def _fmt_shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _macro(name: str) -> str:
    return re.sub(r"\W", "_", name).upper()


# -- header ----------------------------------------------------------------------
def _error_block() -> str:
    lines = ["#ifndef RLXC_ABI_ERRORS", "#define RLXC_ABI_ERRORS",
             "/* Return codes shared by every rlxc-generated header. */",
             f"#define RLX_OK {RLX_OK}"]
    lines += [f"#define {k} {v}  /* {ERROR_DOCS[k]} */" for k, v in ERROR_CODES.items()]
    lines.append("#endif")
    return "\n".join(lines)


def emit_header(spec: ArtifactSpec) -> str:
    n = spec.name
    guard = f"RLXC_{_macro(n)}_H"
    sig = []
    for kind, lst in (("input", spec.inputs), ("output", spec.outputs), ("param", spec.params)):
        for i, t in enumerate(lst):
            extra = " (baked)" if t.baked else ""
            sig.append(f" *   {kind:<6} {i:>2}  {_comment(t.name):<16} {t.dtype} "
                       f"{_fmt_shape(t.shape)}{extra}")
    sizes = []
    for kind, lst in (("INPUT", spec.inputs), ("OUTPUT", spec.outputs), ("PARAM", spec.params)):
        for i, t in enumerate(lst):
            sizes.append(f"#define {_macro(n)}_{kind}{i}_NUMEL {t.numel}u  "
                         f"/* {_comment(t.name)} */")
    train = spec.train is not None
    train_doc = ""
    train_decl = ""
    if train:
        tr = spec.train
        train_doc = f""" *
 * Training (compiled with --train --optimizer {tr.optimizer.kind}, lr {tr.lr:g}):
 *   {n}_train_step runs forward + backward + the {tr.optimizer.kind} update on the params
 *   held in the context (all of them are trained) and on the optimizer state
 *   kept there (zero-initialised on the first step; set_param does not reset
 *   it).  *loss receives the loss *before* the update.  On any error the
 *   params and the optimizer state are left unchanged."""
        train_decl = f"""
/* One optimizer step (see the header comment); lr must be finite and >= 0.
 * inputs: as for {n}_run.  Returns RLX_OK or an error code. */
int {n}_train_step({n}_ctx *ctx, const float *const *inputs, float lr, float *loss);
"""
    return f"""/* {n}.h: the C interface of the rlxc-compiled model "{_comment(n)}".
 *
 * Generated by rlxc {_version()} (C ABI version {ABI_VERSION}) for target {spec.target}
 * (cpu {_comment(spec.cpu)}); IR sha256 {spec.ir_hash()[:16]}...  Do not edit.
 *
 * Purpose: run (and, if compiled with --train, train) the model from C or C++
 * by linking lib{n}.so.  Everything the model needs lives in a context: its
 * workspace, its params and (training) its optimizer state.  Contexts are
 * independent: two threads may run two contexts at the same time; one context
 * must not be used by two threads at once.
 *
 * Usage:
 *   {n}_ctx *ctx = {n}_create();              NULL when out of memory
 *   if ({n}_check_abi() != RLX_OK) ...         header and library disagree
 *   {n}_set_param(ctx, "w", w, count);         every param that is not baked
 *   const float *in[] = {{x, ...}};             one pointer per input, in order
 *   float *out[] = {{y, ...}};                  caller-owned output buffers
 *   if ({n}_run(ctx, in, out) != RLX_OK)
 *       fprintf(stderr, "%s\\n", {n}_last_error(ctx));
 *   {n}_destroy(ctx);
 *
 * Data: every buffer is a dense row-major (C order) array of its declared
 * shape; counts are element counts.  The pointer tables are typed float for
 * convenience; an input or output whose dtype is not f32 is passed as a
 * pointer to its own element type (i32 -> int32_t, f64 -> double, i1 ->
 * uint8_t 0/1) cast to (const) float *.
 *
 * Params: baked ones (compiled with --params) are valid from {n}_create on;
 * {n}_set_param copies new data into the context (baked data is never
 * written).  Running with a param that is neither baked nor set returns
 * RLX_ERR_PARAM_UNSET; a wrong element count returns RLX_ERR_COUNT.
 *
 * Errors: every int-returning call gives RLX_OK (0) or one of the RLX_ERR_*
 * codes below; {n}_last_error(ctx) describes the last failure on ctx.
 *
 * Signature:
{chr(10).join(sig) if sig else ' *   (no arguments)'}{train_doc}
 */
#ifndef {guard}
#define {guard}

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

{_error_block()}

#define {_macro(n)}_ABI_VERSION {ABI_VERSION}u
#define {_macro(n)}_IR_HASH {c_string(spec.ir_hash())}
#define {_macro(n)}_NUM_INPUTS {len(spec.inputs)}
#define {_macro(n)}_NUM_OUTPUTS {len(spec.outputs)}
#define {_macro(n)}_NUM_PARAMS {len(spec.params)}
#define {_macro(n)}_HAS_TRAIN_STEP {1 if train else 0}
{chr(10).join(sizes)}

/* An opaque context: workspace, params{", optimizer state" if train else ""} and the last error. */
typedef struct {n}_ctx {n}_ctx;

/* A new context (baked params loaded, others unset), or NULL if out of memory. */
{n}_ctx *{n}_create(void);
/* Frees the context and everything it owns; NULL is ignored. */
void {n}_destroy({n}_ctx *ctx);

/* Runs the model: inputs[i] points at input i, outputs[i] at a buffer for
 * output i (see the signature above).  Returns RLX_OK or an error code. */
int {n}_run({n}_ctx *ctx, const float *const *inputs, float *const *outputs);
{train_decl}
/* A description of the last error on ctx ("" if none); valid until the next
 * call on ctx.  ctx may be NULL (then it describes a failed create). */
const char *{n}_last_error({n}_ctx *ctx);

/* Copies count elements of data into param `name` (count must equal the
 * param's element count). */
int {n}_set_param({n}_ctx *ctx, const char *name, const float *data, size_t count);
/* Copies param `name` (count elements) into out. */
int {n}_get_param({n}_ctx *ctx, const char *name, float *out, size_t count);
/* 1 when param i is baked or set in ctx, 0 otherwise (or i out of range). */
int {n}_param_is_set({n}_ctx *ctx, int i);

/* Process-wide: threads the compiled code may use per call (0 = all cores,
 * the default; OMP_NUM_THREADS is honoured).  Not tied to a context. */
void {n}_set_num_threads(int n);

/* Metadata (no context needed).  Indices out of range give NULL / -1 / 0. */
uint32_t {n}_abi_version(void);
const char *{n}_ir_hash(void);
int {n}_num_inputs(void);
int {n}_num_outputs(void);
int {n}_num_params(void);
const char *{n}_input_name(int i);
const char *{n}_input_dtype(int i);     /* "f32", "f64", "i1", "i32", "i64" */
int {n}_input_rank(int i);
const int64_t *{n}_input_shape(int i);  /* rank dims */
size_t {n}_input_numel(int i);
const char *{n}_output_name(int i);
const char *{n}_output_dtype(int i);
int {n}_output_rank(int i);
const int64_t *{n}_output_shape(int i);
size_t {n}_output_numel(int i);
const char *{n}_param_name(int i);
const char *{n}_param_dtype(int i);
int {n}_param_rank(int i);
const int64_t *{n}_param_shape(int i);
size_t {n}_param_numel(int i);

/* RLX_OK when the library linked at run time implements the ABI and the
 * model this header describes; call it once at start-up. */
static inline int {n}_check_abi(void)
{{
    const char *h = {n}_ir_hash();
    const char *m = {_macro(n)}_IR_HASH;
    if ({n}_abi_version() != {_macro(n)}_ABI_VERSION || h == NULL)
        return RLX_ERR_ARG;
    while (*h && *h == *m) {{
        ++h;
        ++m;
    }}
    return *h == *m ? RLX_OK : RLX_ERR_ARG;
}}

#ifdef __cplusplus
}}
#endif

#endif /* {guard} */
"""


def _version() -> str:
    try:
        import rlxc

        return rlxc.__version__
    except Exception:  # pragma: no cover
        return "unknown"


# -- glue ------------------------------------------------------------------------
def _blob_layout(spec: ArtifactSpec) -> tuple[dict, int]:
    off, layout = 0, {}
    for t in spec.params:
        if t.baked:
            off = -(-off // BLOB_ALIGN) * BLOB_ALIGN
            layout[t.name] = off
            off += spec.baked[t.name].nbytes
    return layout, off


def _tables(prefix: str, lst: list, blob: dict | None = None) -> str:
    lines = []
    for i, t in enumerate(lst):
        dims = ", ".join(str(d) for d in t.shape) or "0"
        lines.append(f"static const int64_t {prefix}_dims{i}[] = {{{dims}}};")
    rows = []
    for i, t in enumerate(lst):
        off = blob.get(t.name, -1) if blob is not None else -1
        esz = np.dtype(NP_DTYPES[t.dtype]).itemsize
        rows.append(f"    {{{c_string(t.name)}, {c_string(t.dtype)}, {len(t.shape)}, "
                    f"{prefix}_dims{i}, {t.numel}u, {esz}u, {off}}},")
    if not rows:
        rows.append("    {\"\", \"\", 0, NULL, 0u, 0u, -1},")
    lines.append(f"static const rlx_tensor {prefix}[] = {{\n" + "\n".join(rows) + "\n};")
    return "\n".join(lines) + "\n"


def emit_glue(spec: ArtifactSpec, kernel_sym: str, step_sym: str | None = None,
              errors: dict | None = None) -> str:
    """The C glue implementing NAME.h on top of the kernel entry points.

    `errors` maps (kernel symbol, return code) to the message of that code."""
    n = spec.name
    nin, nout, npar = len(spec.inputs), len(spec.outputs), len(spec.params)
    layout, _ = _blob_layout(spec)
    has_blob = bool(layout)
    train = spec.train
    parts = [f"""/* Generated by rlxc {_version()}: the C ABI of model {_comment(n)} (see {n}.h). */
#define _POSIX_C_SOURCE 200112L
#include "{n}.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define API __attribute__((visibility("default")))
#define NIN {nin}
#define NOUT {nout}
#define NPAR {npar}
#define ALIGN 64

extern int32_t rlx_{kernel_sym}(void **inputs, void **outputs, void **params, void *workspace);
extern int64_t rlx_{kernel_sym}_workspace_size(void);
"""]
    if has_blob:
        parts.append(f"extern const unsigned char rlx_{n}_blob[];\n")
    if train:
        parts.append(f"extern int32_t rlx_{step_sym}(void **inputs, void **outputs, "
                     f"void **params, void *workspace);\n"
                     f"extern int64_t rlx_{step_sym}_workspace_size(void);\n")
    parts.append("""
typedef struct {
    const char *name;
    const char *dtype;
    int rank;
    const int64_t *dims;
    size_t numel;
    size_t esize;
    long long blob_off; /* byte offset of baked data in the blob, -1 if none */
} rlx_tensor;
""")
    parts.append(_tables("IN", spec.inputs))
    parts.append(_tables("OUT", spec.outputs))
    parts.append(_tables("PAR", spec.params, layout))
    nslot = 0
    if train:
        prog = train.program
        nslot = len(prog.slot_args)
        par_idx = {t.name: i for i, t in enumerate(spec.params)}
        slot_par = ", ".join(str(par_idx[p]) for p, _ in prog.slot_args) or "0"
        hp_lines = "\n".join(f"static const double hp_{re.sub(r'[^0-9A-Za-z_]', '_', k)} = "
                             f"{_hexd(v)}; /* {v!r} */" for k, v in train.hp.items()
                             if any(f"hp_{k}" in src[1] for src in train.scalar_src
                                    if src[0] == "expr"))
        sc_lines = []
        for i, (nm, src) in enumerate(zip(train.scalar_names, train.scalar_src)):
            if src[0] == "lr":
                sc_lines.append(f"    s[{i}] = (float)(double)lr; /* {nm} */")
            elif src[0] == "const":
                sc_lines.append(f"    s[{i}] = {_hexf(src[1])}; /* {nm} */")
            else:
                sc_lines.append(f"    s[{i}] = (float)({src[1]}); /* {nm} */")
        parts.append(f"""
#define NSLOT {nslot}
#define NSCAL {len(train.scalar_names)}
/* the param each optimizer slot belongs to (step-function order: param-major) */
static const int SLOT_PAR[] = {{{slot_par}}};
{hp_lines}

/* Optimizer.step_scalars(t, lr) of rlxc/optim.py: float64, rounded once. */
static void step_scalars(float *s, int64_t t, float lr)
{{
    (void)t;
{chr(10).join(sc_lines)}
}}
""")
    parts.append(f"""
struct {n}_ctx {{
    void *ws;
    void *par[NPAR > 0 ? NPAR : 1];   /* current data; NULL = unset */
    void *own[NPAR > 0 ? NPAR : 1];   /* owned copy (NULL until set / trained) */
""")
    if train:
        parts.append("""    void *step_ws;
    void *next[NPAR > 0 ? NPAR : 1];  /* train: new params are written here, then swapped */
    void *slot[NSLOT > 0 ? NSLOT : 1];
    void *slot_next[NSLOT > 0 ? NSLOT : 1];
    int64_t t;                          /* updates done */
""")
    parts.append(f"""    char err[512];
}};

static char create_err[128] = "";

/* the messages of the kernels' non-zero return codes (lowering/cpu/driver.py's errors table) */
static const char *kernel_error(int which, int32_t rc)
{{
    (void)which;
    (void)rc;
@KERNEL_ERRORS@    return "unknown failure";
}}

/* defined (weak) by kernels with parallel loops; absent otherwise */
extern void rlxc_set_num_threads(int32_t n) __attribute__((weak));

static int fail({n}_ctx *c, int code, const char *fmt, ...)
{{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return code;
}}

static void *alloc_aligned(size_t bytes)
{{
    void *p = NULL;
    if (posix_memalign(&p, ALIGN, bytes ? bytes : ALIGN) != 0)
        return NULL;
    return p;
}}

static int find_param(const char *name)
{{
    int i;
    for (i = 0; i < NPAR; ++i)
        if (strcmp(PAR[i].name, name) == 0)
            return i;
    return -1;
}}

static int unknown_param({n}_ctx *c, const char *name)
{{
    size_t used;
    int i;
    used = (size_t)snprintf(c->err, sizeof c->err, "unknown param \\"%s\\"; valid params:", name);
    for (i = 0; i < NPAR && used < sizeof c->err; ++i)
        used += (size_t)snprintf(c->err + used, sizeof c->err - used, "%s \\"%s\\"",
                                 i ? "," : "", PAR[i].name);
    if (NPAR == 0 && used < sizeof c->err)
        snprintf(c->err + used, sizeof c->err - used, " (none)");
    return RLX_ERR_UNKNOWN_NAME;
}}

static int check_params({n}_ctx *c)
{{
    int i;
    for (i = 0; i < NPAR; ++i)
        if (c->par[i] == NULL)
            return fail(c, RLX_ERR_PARAM_UNSET,
                        "param \\"%s\\" is not set: call {n}_set_param(ctx, \\"%s\\", data, %zu) "
                        "or bake it with rlxc compile --params", PAR[i].name, PAR[i].name,
                        PAR[i].numel);
    return RLX_OK;
}}

static int check_ptrs({n}_ctx *c, const void *const *p, int n, const rlx_tensor *t,
                      const char *what)
{{
    int i;
    if (n > 0 && p == NULL)
        return fail(c, RLX_ERR_NULL, "%s table is NULL (%d pointers expected)", what, n);
    for (i = 0; i < n; ++i)
        if (p[i] == NULL && t[i].numel > 0)
            return fail(c, RLX_ERR_NULL, "%s %d (\\"%s\\") is NULL", what, i, t[i].name);
    return RLX_OK;
}}

API {n}_ctx *{n}_create(void)
{{
    {n}_ctx *c = ({n}_ctx *)calloc(1, sizeof *c);
    int i;
    if (c == NULL) {{
        snprintf(create_err, sizeof create_err, "{n}_create: out of memory");
        return NULL;
    }}
    c->ws = alloc_aligned((size_t)rlx_{kernel_sym}_workspace_size());
    if (c->ws == NULL) {{
        free(c);
        snprintf(create_err, sizeof create_err, "{n}_create: cannot allocate the workspace");
        return NULL;
    }}
    for (i = 0; i < NPAR; ++i)
        if (PAR[i].blob_off >= 0)
            c->par[i] = (void *)({"rlx_" + n + "_blob + PAR[i].blob_off" if has_blob else "NULL"});
    (void)i;
    return c;
}}

API void {n}_destroy({n}_ctx *c)
{{
    int i;
    if (c == NULL)
        return;
    for (i = 0; i < NPAR; ++i) {{
        free(c->own[i]);
""")
    if train:
        parts.append("""        free(c->next[i]);
    }
    for (i = 0; i < NSLOT; ++i) {
        free(c->slot[i]);
        free(c->slot_next[i]);
    }
    free(c->step_ws);
""")
    else:
        parts.append("    }\n")
    parts.append(f"""    free(c->ws);
    free(c);
}}

API const char *{n}_last_error({n}_ctx *c)
{{
    return c ? c->err : create_err;
}}

API int {n}_run({n}_ctx *c, const float *const *inputs, float *const *outputs)
{{
    int32_t rc;
    int st;
    if (c == NULL)
        return RLX_ERR_NULL;
    c->err[0] = '\\0';
    if ((st = check_ptrs(c, (const void *const *)inputs, NIN, IN, "input")) != RLX_OK ||
        (st = check_ptrs(c, (const void *const *)outputs, NOUT, OUT, "output")) != RLX_OK ||
        (st = check_params(c)) != RLX_OK)
        return st;
    rc = rlx_{kernel_sym}((void **)inputs, (void **)outputs, c->par, c->ws);
    if (rc != 0)
        return fail(c, RLX_ERR_KERNEL, "%s", kernel_error(0, rc));
    return RLX_OK;
}}

API int {n}_set_param({n}_ctx *c, const char *name, const float *data, size_t count)
{{
    int i;
    size_t bytes;
    if (c == NULL)
        return RLX_ERR_NULL;
    c->err[0] = '\\0';
    if (name == NULL)
        return fail(c, RLX_ERR_NULL, "set_param: name is NULL");
    if ((i = find_param(name)) < 0)
        return unknown_param(c, name);
    if (count != PAR[i].numel)
        return fail(c, RLX_ERR_COUNT, "set_param: param \\"%s\\" has %zu elements, got %zu",
                    name, PAR[i].numel, count);
    if (data == NULL && count > 0)
        return fail(c, RLX_ERR_NULL, "set_param: data for \\"%s\\" is NULL", name);
    bytes = count * PAR[i].esize;
    if (c->own[i] == NULL && (c->own[i] = alloc_aligned(bytes)) == NULL)
        return fail(c, RLX_ERR_NOMEM, "set_param: out of memory for \\"%s\\"", name);
    if (bytes)
        memcpy(c->own[i], data, bytes);
    c->par[i] = c->own[i];
    return RLX_OK;
}}

API int {n}_get_param({n}_ctx *c, const char *name, float *out, size_t count)
{{
    int i;
    if (c == NULL)
        return RLX_ERR_NULL;
    c->err[0] = '\\0';
    if (name == NULL)
        return fail(c, RLX_ERR_NULL, "get_param: name is NULL");
    if ((i = find_param(name)) < 0)
        return unknown_param(c, name);
    if (count != PAR[i].numel)
        return fail(c, RLX_ERR_COUNT, "get_param: param \\"%s\\" has %zu elements, got %zu",
                    name, PAR[i].numel, count);
    if (c->par[i] == NULL)
        return fail(c, RLX_ERR_PARAM_UNSET, "get_param: param \\"%s\\" is not set", name);
    if (out == NULL && count > 0)
        return fail(c, RLX_ERR_NULL, "get_param: out is NULL");
    if (count)
        memcpy(out, c->par[i], count * PAR[i].esize);
    return RLX_OK;
}}

API int {n}_param_is_set({n}_ctx *c, int i)
{{
    return c != NULL && i >= 0 && i < NPAR && c->par[i] != NULL;
}}
""")
    if train:
        prog = train.program
        nw = len(prog.wrt)
        # the step function's signature: data | params | slots | opt_scalars  (inputs are
        # data, slots and scalars in that order; params are the kernel's params table)
        parts.append(f"""
API int {n}_train_step({n}_ctx *c, const float *const *inputs, float lr, float *loss)
{{
    void *sin[NIN + NSLOT + 1];
    void *sout[1 + NPAR + NSLOT];
    float scal[NSCAL > 0 ? NSCAL : 1];
    float lossv = 0.0f;
    int i, st;
    int32_t rc;
    if (c == NULL)
        return RLX_ERR_NULL;
    c->err[0] = '\\0';
    if ((st = check_ptrs(c, (const void *const *)inputs, NIN, IN, "input")) != RLX_OK ||
        (st = check_params(c)) != RLX_OK)
        return st;
    if (!(lr >= 0.0f) || isinf(lr))
        return fail(c, RLX_ERR_ARG, "train_step: lr must be finite and >= 0, got %g", (double)lr);
    if (loss == NULL)
        return fail(c, RLX_ERR_NULL, "train_step: loss is NULL");
    if (c->step_ws == NULL &&
        (c->step_ws = alloc_aligned((size_t)rlx_{step_sym}_workspace_size())) == NULL)
        return fail(c, RLX_ERR_NOMEM, "train_step: cannot allocate the workspace");
    for (i = 0; i < NPAR; ++i) {{
        size_t bytes = PAR[i].numel * PAR[i].esize;
        if (c->own[i] == NULL && (c->own[i] = alloc_aligned(bytes)) == NULL)
            return fail(c, RLX_ERR_NOMEM, "train_step: out of memory");
        if (c->par[i] != c->own[i]) {{ /* baked: take a private copy first */
            if (bytes)
                memcpy(c->own[i], c->par[i], bytes);
            c->par[i] = c->own[i];
        }}
        if (c->next[i] == NULL && (c->next[i] = alloc_aligned(bytes)) == NULL)
            return fail(c, RLX_ERR_NOMEM, "train_step: out of memory");
    }}
    for (i = 0; i < NSLOT; ++i) {{
        size_t bytes = PAR[SLOT_PAR[i]].numel * sizeof(float);
        if (c->slot[i] == NULL) {{
            if ((c->slot[i] = alloc_aligned(bytes)) == NULL)
                return fail(c, RLX_ERR_NOMEM, "train_step: out of memory");
            memset(c->slot[i], 0, bytes);
        }}
        if (c->slot_next[i] == NULL && (c->slot_next[i] = alloc_aligned(bytes)) == NULL)
            return fail(c, RLX_ERR_NOMEM, "train_step: out of memory");
    }}
    step_scalars(scal, c->t + 1, lr);
    for (i = 0; i < NIN; ++i)
        sin[i] = (void *)inputs[i];
    for (i = 0; i < NSLOT; ++i)
        sin[NIN + i] = c->slot[i];
    sin[NIN + NSLOT] = scal;
    sout[0] = &lossv;
    for (i = 0; i < {nw}; ++i)
        sout[1 + i] = c->next[i];
    for (i = 0; i < NSLOT; ++i)
        sout[1 + {nw} + i] = c->slot_next[i];
    rc = rlx_{step_sym}(sin, sout, c->par, c->step_ws);
    if (rc != 0)
        return fail(c, RLX_ERR_KERNEL, "train_step: %s", kernel_error(1, rc));
    for (i = 0; i < NPAR; ++i) {{
        void *tmp = c->own[i];
        c->own[i] = c->next[i];
        c->next[i] = tmp;
        c->par[i] = c->own[i];
    }}
    for (i = 0; i < NSLOT; ++i) {{
        void *tmp = c->slot[i];
        c->slot[i] = c->slot_next[i];
        c->slot_next[i] = tmp;
    }}
    c->t += 1;
    *loss = lossv;
    return RLX_OK;
}}
""")
    parts.append(f"""
API void {n}_set_num_threads(int n)
{{
    if (rlxc_set_num_threads != NULL)
        rlxc_set_num_threads(n < 0 ? 0 : n);
}}
API uint32_t {n}_abi_version(void) {{ return {ABI_VERSION}u; }}
API const char *{n}_ir_hash(void) {{ return {c_string(spec.ir_hash())}; }}
API int {n}_num_inputs(void) {{ return NIN; }}
API int {n}_num_outputs(void) {{ return NOUT; }}
API int {n}_num_params(void) {{ return NPAR; }}
""")
    for kind, tab, cnt in (("input", "IN", "NIN"), ("output", "OUT", "NOUT"),
                           ("param", "PAR", "NPAR")):
        parts.append(f"""
API const char *{n}_{kind}_name(int i) {{ return i >= 0 && i < {cnt} ? {tab}[i].name : NULL; }}
API const char *{n}_{kind}_dtype(int i) {{ return i >= 0 && i < {cnt} ? {tab}[i].dtype : NULL; }}
API int {n}_{kind}_rank(int i) {{ return i >= 0 && i < {cnt} ? {tab}[i].rank : -1; }}
API const int64_t *{n}_{kind}_shape(int i) {{ return i >= 0 && i < {cnt} ? {tab}[i].dims : NULL; }}
API size_t {n}_{kind}_numel(int i) {{ return i >= 0 && i < {cnt} ? {tab}[i].numel : 0u; }}
""")
    ke = []
    for (sym, code), msg in sorted((errors or {}).items()):
        which = 0 if sym == kernel_sym else 1
        ke.append(f"    if (which == {which} && rc == {code})\n        return {c_string(msg)};\n")
    return "".join(parts).replace("@KERNEL_ERRORS@", "".join(ke))


def emit_blob_asm(sym: str, blob_path: str, size: int) -> str:
    """GNU assembler source that embeds `blob_path` as the hidden symbol `sym`."""
    if '"' in blob_path or "\\" in blob_path or "\n" in blob_path:
        raise ValueError(f"cannot .incbin a path with quotes or backslashes: {blob_path!r}")
    return f"""    .section .rodata.{sym},"a",@progbits
    .balign {BLOB_ALIGN}
    .globl {sym}
    .hidden {sym}
    .type {sym},@object
{sym}:
    .incbin "{blob_path}"
    .size {sym}, {size}
    .section .note.GNU-stack,"",@progbits
"""


# -- Python package and JSON ---------------------------------------------------------
def emit_package(spec: ArtifactSpec) -> str:
    n = spec.name
    doc_sig = "\n".join(f"    {k} {t.name!r}: {t.dtype} {list(t.shape)}"
                        for k, lst in (("input ", spec.inputs), ("output", spec.outputs),
                                       ("param ", spec.params)) for t in lst)
    return f'''"""Compiled rlxc model {n!r} (generated by rlxc compile; do not edit).

    import {n}
    outs = {n}.run({", ".join(f"{t.name}=..." for t in spec.inputs if t.name.isidentifier())})

A thin wrapper over rlxc.runtime.load: it needs NumPy and rlxc.runtime only,
never the compiler.  `{n}.module` is the loaded CompiledModule (run,
set_param, get_param{", train_step" if spec.train else ""}, metadata).

{doc_sig}
"""
import os as _os

from rlxc.runtime.loader import load as _load

_here = _os.path.dirname(_os.path.abspath(__file__))
_dir = _here if _os.path.isfile(_os.path.join(_here, {f"{n}.json"!r})) else _os.path.dirname(_here)

module = _load(_dir, {n!r})
metadata = module.metadata
inputs, outputs, params = module.inputs, module.outputs, module.params
run = module.run
set_param = module.set_param
set_params = module.set_params
get_param = module.get_param
input_names = module.input_names
param_names = module.param_names
{"train_step = module.train_step" if spec.train else ""}

__all__ = ["module", "metadata", "inputs", "outputs", "params", "run", "set_param", "set_params",
           "get_param", "input_names", "param_names"{', "train_step"' if spec.train else ""}]
'''


def emit_metadata(spec: ArtifactSpec, lib_sha256: str) -> dict:
    def tl(lst, baked=False):
        out = []
        for t in lst:
            d = {"name": t.name, "shape": list(t.shape), "dtype": t.dtype}
            if baked:
                d["baked"] = t.baked
            out.append(d)
        return out

    train = None
    if spec.train is not None:
        tr = spec.train
        train = {"optimizer": tr.optimizer.kind, "lr": tr.lr, "hyperparams": tr.hp,
                 "slots": list(tr.program.slots), "scalars": tr.scalar_names,
                 "max_grad_norm": tr.program.max_grad_norm,
                 "step_ir_hash": tr.program.func.ir_hash()}
    cpu_name, arch = spec.cpu, None
    try:
        from rlxc.lowering.cpu.target import resolve_target

        tgt, cpu_name, _ = resolve_target(spec.cpu)
        arch = tgt.arch
    except Exception:  # pragma: no cover
        pass
    n = spec.name
    return {
        "format": ARTIFACT_FORMAT,
        "abi_version": ABI_VERSION,
        "rlxc_version": _version(),
        "name": n,
        "target": spec.target,
        "cpu": spec.cpu,
        "cpu_name": cpu_name,
        "cpu_arch": arch,
        "ir_hash": spec.ir_hash(),
        "library": f"lib{n}.so",
        "library_sha256": lib_sha256,
        "header": f"{n}.h",
        "package": n,
        "inputs": tl(spec.inputs),
        "outputs": tl(spec.outputs),
        "params": tl(spec.params, True),
        "train": train,
        "transforms": list(spec.transforms),
        "source": spec.source,
        "sgemm": _sgemm_params(spec.cpu),
    }


def _sgemm_params(cpu: str) -> dict | None:
    """The CPU sgemm's derived tile and blocking (lowering/cpu/sgemm_kernels.py)."""
    try:
        from rlxc.lowering.cpu.sgemm_kernels import sgemm_params

        return sgemm_params(cpu)
    except (ValueError, NotImplementedError):
        return None


def dump_metadata(meta: dict) -> str:
    """JSON text with one line per tensor (diff-friendly, still plain JSON)."""
    text = json.dumps(meta, indent=2)
    # collapse the innermost objects and int lists onto one line
    text = re.sub(r"\{\n\s+(\"name\"[^{}]*?)\n\s+\}",
                  lambda m: "{" + re.sub(r"\s*\n\s*", " ", m.group(1)) + "}", text)
    text = re.sub(r"\[\s+([-\d,\s]*?)\s+\]",
                  lambda m: "[" + re.sub(r"\s*,\s*", ", ", m.group(1).strip()) + "]", text)
    return text + "\n"


# -- building --------------------------------------------------------------------------
def _cc(cpu: str = "native") -> str:
    """The C compiler for `cpu`'s target (a cross compiler for another architecture)."""
    from rlxc.lowering.cpu.target import _cc as target_cc

    return target_cc(cpu)


def _run_cc(args: list, what: str) -> None:
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what}: `{' '.join(args)}` failed (exit {proc.returncode}):\n"
                           f"{proc.stderr.strip() or proc.stdout.strip()}")


def check_header(header_path: str, lang: str = "c") -> None:
    """Compile the header alone strictly (c: -std=c99, c++: -std=c++17); raises on warnings."""
    d = os.path.dirname(os.path.abspath(header_path))
    if lang == "c":
        cmd = [_cc(), "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only",
               "-x", "c", "-"]
    else:
        cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
        cmd = [cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only",
               "-x", "c++", "-"]
    src = f'#include "{os.path.basename(header_path)}"\nint main(void) {{ return 0; }}\n'
    proc = subprocess.run(cmd + ["-I", d], input=src, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"header {header_path} does not compile as {lang}:\n{proc.stderr}")


def _write_atomic(path: str, data: bytes | str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path), dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def compile_kernel(module, sym: str, cpu: str, progress: Progress):
    """lowering/cpu/driver.py's CompiledArtifact (object bytes, no .so) of `module` as `rlx_<sym>`."""
    from rlxc.lowering.cpu import driver as backend

    with progress.stage(f"backend {sym}"):
        art = backend.compile_cpu(module, sym, cpu=cpu, link=False)
    for stage, secs in (art.timings or {}).items():
        progress.record(f"  {sym}: {stage}", secs)
    return art


def build_artifact(spec: ArtifactSpec, outdir: str, progress: Progress | None = None) -> dict:
    """Compile `spec` and write the artifact into `outdir`; returns the JSON dict."""
    progress = progress or _NoProgress()
    if spec.target == "cuda":
        return build_cuda_artifact(spec, outdir, progress)
    if spec.target != "cpu":
        raise ValueError(f"unknown target {spec.target!r}; valid: cpu, cuda")
    n = spec.name
    os.makedirs(outdir, exist_ok=True)
    arts = [compile_kernel(spec.func.module, n, spec.cpu, progress)]
    step_sym = None
    if spec.train is not None:
        step_sym = f"{n}_train_step_kernel"
        arts.append(compile_kernel(spec.train.program.func.module, step_sym, spec.cpu,
                                   progress))
    objects = [a.object for a in arts]
    errors = {}
    for a in arts:
        for code, (_, msg) in a.errors.items():
            errors[(a.name, int(code))] = msg
    with tempfile.TemporaryDirectory(prefix="rlxc-aot-") as tmp:
        with progress.stage("header + glue (cc)"):
            header = emit_header(spec)
            with open(os.path.join(tmp, f"{n}.h"), "w") as f:
                f.write(header)
            with open(os.path.join(tmp, "glue.c"), "w") as f:
                f.write(emit_glue(spec, n, step_sym, errors))
            _run_cc([_cc(spec.cpu), "-std=c99", "-O2", "-fPIC", "-fvisibility=hidden", "-Wall",
                     "-Wextra", "-Werror", "-Wno-unused-function", "-c",
                     os.path.join(tmp, "glue.c"), "-I", tmp, "-o",
                     os.path.join(tmp, "glue.o")], "compiling the C glue")
            with open(os.path.join(tmp, "glue.o"), "rb") as f:
                objects.append(f.read())
        layout, size = _blob_layout(spec)
        if layout:
            with progress.stage("baked params (.incbin)"):
                blob = os.path.join(tmp, "params.bin")
                with open(blob, "wb") as f:
                    pos = 0
                    for t in spec.params:
                        if t.name in layout:
                            f.write(b"\0" * (layout[t.name] - pos))
                            data = spec.baked[t.name].tobytes()
                            f.write(data)
                            pos = layout[t.name] + len(data)
                with open(os.path.join(tmp, "blob.s"), "w") as f:
                    f.write(emit_blob_asm(f"rlx_{n}_blob", blob, size))
                _run_cc([_cc(spec.cpu), "-c", os.path.join(tmp, "blob.s"), "-o",
                         os.path.join(tmp, "blob.o")], "assembling the baked params")
                with open(os.path.join(tmp, "blob.o"), "rb") as f:
                    objects.append(f.read())
        with progress.stage("link"):
            from rlxc.lowering.cpu.target import link_shared

            lib = os.path.join(outdir, f"lib{n}.so")
            link_shared(objects, lib, cpu=spec.cpu)
        with progress.stage("write header, package, json"):
            _write_atomic(os.path.join(outdir, f"{n}.h"), header)
            pkg = os.path.join(outdir, n)
            os.makedirs(pkg, exist_ok=True)
            _write_atomic(os.path.join(pkg, "__init__.py"), emit_package(spec))
            meta = emit_metadata(spec, sha256_file(lib))
            _write_atomic(os.path.join(outdir, f"{n}.json"), dump_metadata(meta))
    return meta


def _blob_bytes(spec: ArtifactSpec) -> bytes:
    layout, size = _blob_layout(spec)
    out = bytearray(size)
    for name, off in layout.items():
        data = spec.baked[name].tobytes()
        out[off:off + len(data)] = data
    return bytes(out)


def build_cuda_artifact(spec: ArtifactSpec, outdir: str, progress: Progress | None = None
                        ) -> dict:
    """A CUDA artifact: NAME.rlxcuda (runtime/cuda.py's container: PTX, cubin when ptxas
    is found, launch plan, plus the baked params as blob "params"), NAME.json and NAME/.
    No C ABI: the GPU program is driven by rlxc.runtime (the driver API via ctypes)."""
    from rlxc.runtime.cuda import dump_artifact

    from rlxc.lowering.gpu.driver import compile_cuda

    progress = progress or _NoProgress()
    if spec.train is not None:
        raise ValueError("--train builds a C train step: use --target cpu")
    n = spec.name
    os.makedirs(outdir, exist_ok=True)
    with progress.stage("backend cuda (PTX, ptxas)"):
        art = compile_cuda(spec.func.module, n)
    with progress.stage("write container, package, json"):
        layout, _ = _blob_layout(spec)
        blobs = dict(art.blobs)
        blobs["params"] = _blob_bytes(spec)
        lib = os.path.join(outdir, f"{n}.rlxcuda")
        _write_atomic(lib, dump_artifact(art.meta, blobs))
        pkg = os.path.join(outdir, n)
        os.makedirs(pkg, exist_ok=True)
        _write_atomic(os.path.join(pkg, "__init__.py"), emit_package(spec))
        meta = emit_metadata(spec, sha256_file(lib))
        meta.update(library=f"{n}.rlxcuda", header=None, cpu=None, cpu_name=None,
                    arch=art.meta.get("arch"), cubin=art.cubin is not None,
                    cuda_params={k: [off, spec.baked[k].nbytes] for k, off in layout.items()})
        _write_atomic(os.path.join(outdir, f"{n}.json"), dump_metadata(meta))
    return meta
