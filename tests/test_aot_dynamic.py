"""AOT and the C ABI of a Func with dynamic dims (issue 14): ONE library for every size.

C programs written here are built with cc against the generated header and run:
forward at sizes 1, 7, 64 (two symbols, one context, sizes growing and shrinking)
compared with NumPy and the interpreter; a --train build stepping at two batch
sizes (train_step, and train_grads + train_apply) compared with Func.train_step;
the error codes of NAME_set_dims.  Then the Python package at two sizes with
Func.run's checks, the CLI (.py factory and .onnx with a dim_param; a graph that is
not size-generic is refused with a message asking for --sizes), a static Func's
header and exported symbols unchanged (golden), and the disk cache of the one
library in a fresh process.
"""
from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import rlxc
from rlxc import export as aot
from rlxc.lowering.artifact.cc import check_header
from rlxc.runtime.errors import ShapeError

HERE = os.path.dirname(os.path.abspath(__file__))
CPU = "x86-64-v3"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "RLXC_NUM_THREADS": "1"}
CFLAGS = ["cc", "-std=c99", "-Wall", "-Wextra", "-Werror"]


def _two(s):
    x = s.input("x", ("B", 8))
    z = s.input("z", ("T", 3))
    h = (x @ s.param("w", (8, 4))).tanh()
    return h, z.mean(0) * s.param("g", (3,)), h.sum(0)


def _two_ref(f, x, z):
    p = f.params()
    h = np.tanh(x.astype(np.float64) @ p["w"])
    return [h, z.astype(np.float64).mean(0) * p["g"], h.sum(0)]


def _tinyd(s):
    x = s.input("x", ("B", 4))
    y = s.input("y", ("B", 1))
    pred = (x @ s.param("w", (4, 8))).tanh() @ s.param("w2", (8, 1)) + s.param("b", (1,))
    return pred.mse(y)


def _build(tmp, f, name, train=None):
    spec = aot.spec_from_func(f, name, cpu=CPU)
    if train is not None:
        spec.train = aot.train_spec(f, train)
    aot.build_artifact(spec, str(tmp))
    return tmp


def _cc(out, name, prog, src):
    (out / f"{prog}.c").write_text(src)
    subprocess.run(CFLAGS + ["-I", str(out), str(out / f"{prog}.c"), "-L", str(out),
                             f"-l{name}", f"-Wl,-rpath,{out}", "-o", str(out / prog)],
                   check=True)
    return str(out / prog)


def _run(cmd, cwd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV, cwd=cwd)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


# -- forward: two symbols, sizes 1, 7, 64 on one context ---------------------------------
FWD_C = textwrap.dedent(r"""
    /* args: B T pairs; reads in_K.bin (inputs in order), writes out_K.bin (outputs) */
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include "twod.h"

    int main(int argc, char **argv)
    {
        twod_ctx *ctx = twod_create();
        int k, i;
        if (ctx == NULL || twod_check_abi() != RLX_OK)
            return 1;
        if (TWOD_NUM_DIMS != 2 || strcmp(TWOD_DIM_NAMES[0], "B") || strcmp(TWOD_DIM_NAMES[1], "T")
            || twod_num_dims() != 2 || strcmp(twod_dim_name(1), "T"))
            return 2;
        for (k = 0; 2 * k + 2 < argc + 1 && 2 * k + 2 <= argc - 1; ++k) {
            int64_t sizes[2];
            const float *in[TWOD_NUM_INPUTS];
            float *out[TWOD_NUM_OUTPUTS];
            char path[64];
            FILE *f;
            sizes[0] = atoll(argv[1 + 2 * k]);
            sizes[1] = atoll(argv[2 + 2 * k]);
            if (twod_set_dims(ctx, sizes) != RLX_OK) {
                fprintf(stderr, "%s\n", twod_last_error(ctx));
                return 3;
            }
            snprintf(path, sizeof path, "in_%d.bin", k);
            f = fopen(path, "rb");
            for (i = 0; i < TWOD_NUM_INPUTS; ++i) {
                float *b = malloc((size_t)twod_input_numel(ctx, i) * sizeof(float));
                if (fread(b, sizeof(float), (size_t)twod_input_numel(ctx, i), f) !=
                    (size_t)twod_input_numel(ctx, i))
                    return 4;
                in[i] = b;
            }
            fclose(f);
            for (i = 0; i < TWOD_NUM_OUTPUTS; ++i)
                out[i] = malloc((size_t)twod_output_numel(ctx, i) * sizeof(float));
            if (twod_run(ctx, in, out) != RLX_OK) {
                fprintf(stderr, "%s\n", twod_last_error(ctx));
                return 5;
            }
            snprintf(path, sizeof path, "out_%d.bin", k);
            f = fopen(path, "wb");
            for (i = 0; i < TWOD_NUM_OUTPUTS; ++i) {
                const int64_t *shp = twod_output_shape(ctx, i);
                int r;
                printf("size %d output %d [", k, i);
                for (r = 0; r < twod_output_rank(i); ++r)
                    printf("%s%lld", r ? ", " : "", (long long)shp[r]);
                printf("]\n");
                fwrite(out[i], sizeof(float), (size_t)twod_output_numel(ctx, i), f);
                free(out[i]);
            }
            fclose(f);
            for (i = 0; i < TWOD_NUM_INPUTS; ++i)
                free((void *)in[i]);
        }
        twod_destroy(ctx);
        return 0;
    }
""")

ERR_C = textwrap.dedent(r"""
    #include <stdio.h>
    #include <string.h>
    #include "twod.h"

    #define CHECK(cond) do { if (!(cond)) { printf("FAIL line %d: %s [%s]\n", __LINE__, #cond, \
                                                   twod_last_error(ctx)); return 1; } } while (0)

    int main(void)
    {
        static float x[8 * 64], z[3 * 64], o0[4 * 64], o1[3], o2[4];
        const float *in[2] = {x, z};
        float *out[3] = {o0, o1, o2};
        int64_t ok[2] = {2, 3}, zero_b[2] = {0, 3}, neg_t[2] = {1, -2};
        int64_t huge[2] = {(int64_t)1 << 61, 1}, big_t[2] = {1, (int64_t)1 << 62};
        twod_ctx *ctx = twod_create();
        CHECK(ctx != NULL);
        CHECK(twod_input_numel(ctx, 0) == -1 && twod_output_shape(ctx, 0) == NULL);
        CHECK(twod_run(ctx, in, out) == RLX_ERR_ARG);
        CHECK(strstr(twod_last_error(ctx), "call twod_set_dims(ctx, sizes) first") != NULL);
        CHECK(twod_set_dims(ctx, NULL) == RLX_ERR_NULL);
        CHECK(twod_set_dims(NULL, ok) == RLX_ERR_NULL);
        CHECK(twod_set_dims(ctx, zero_b) == RLX_ERR_ARG);
        CHECK(strstr(twod_last_error(ctx), "dimension 'B' (sizes[0]) is 0") != NULL);
        CHECK(twod_set_dims(ctx, ok) == RLX_OK && twod_last_error(ctx)[0] == '\0');
        CHECK(twod_input_numel(ctx, 0) == 16 && twod_input_numel(ctx, 1) == 9);
        CHECK(twod_output_numel(ctx, 0) == 8 && twod_output_numel(ctx, 2) == 4);
        CHECK(twod_output_numel(ctx, 3) == -1 && twod_input_numel(ctx, -1) == -1);
        CHECK(twod_set_dims(ctx, neg_t) == RLX_ERR_ARG);
        CHECK(strstr(twod_last_error(ctx), "dimension 'T' (sizes[1]) is -2") != NULL);
        CHECK(twod_set_dims(ctx, huge) == RLX_ERR_ARG);
        CHECK(strstr(twod_last_error(ctx), "sizes too large (B=2305843009213693952, T=1)"));
        CHECK(twod_set_dims(ctx, big_t) == RLX_ERR_ARG);
        CHECK(strstr(twod_last_error(ctx), "input 1 (\"z\") would exceed") != NULL);
        /* a refused set_dims leaves the last good sizes current */
        CHECK(twod_input_shape(ctx, 0)[0] == 2 && twod_input_shape(ctx, 1)[0] == 3);
        CHECK(twod_run(ctx, in, out) == RLX_OK);
        CHECK(twod_dim_name(2) == NULL && twod_dim_name(-1) == NULL);
        twod_destroy(ctx);
        printf("errors: OK\n");
        return 0;
    }
""")


@pytest.fixture(scope="module")
def twod(tmp_path_factory):
    f = rlxc.Func("twod", _two).init_randn(seed=2, stddev=0.4)
    out = _build(tmp_path_factory.mktemp("twod"), f, "twod")
    return f, out


def test_c_forward_one_library_at_sizes_1_7_64(twod):
    f, out = twod
    sizes = [(1, 1), (64, 130), (7, 3), (1, 64)]    # grows, shrinks: one context
    r = np.random.default_rng(0)
    data = []
    for k, (B, T) in enumerate(sizes):
        x = r.normal(size=(B, 8)).astype(np.float32)
        z = r.normal(size=(T, 3)).astype(np.float32)
        (out / f"in_{k}.bin").write_bytes(x.tobytes() + z.tobytes())
        data.append((x, z))
    prog = _cc(out, "twod", "fwd", FWD_C)
    text = _run([prog] + [str(v) for s in sizes for v in s], out)
    for k, ((B, T), (x, z)) in enumerate(zip(sizes, data)):
        assert f"size {k} output 0 [{B}, 4]" in text and f"size {k} output 1 [3]" in text
        flat = np.frombuffer((out / f"out_{k}.bin").read_bytes(), np.float32)
        got = np.split(flat, [B * 4, B * 4 + 3])
        interp = f.run_on("interp", x=x, z=z)
        for g, want, ref in zip(got, _two_ref(f, x, z), interp):
            np.testing.assert_allclose(g.reshape(want.shape), want, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(g.reshape(ref.shape), ref, rtol=1e-5, atol=1e-5)
    hdr = (out / "twod.h").read_text()
    check_header(str(out / "twod.h"), "c")
    check_header(str(out / "twod.h"), "c++")
    assert "int64_t twod_output_numel(twod_ctx *ctx, int i);" in hdr
    assert "TWOD_INPUT0_NUMEL:" in hdr and "#define TWOD_INPUT0_NUMEL" not in hdr
    assert "#define TWOD_PARAM0_NUMEL 32u" in hdr   # params stay static


def test_c_set_dims_error_codes(twod):
    _, out = twod
    assert "errors: OK" in _run([_cc(out, "twod", "errs", ERR_C)], out)


# -- --train: two batch sizes, train_step and train_grads + train_apply ------------------
TRAIN_C = textwrap.dedent(r"""
    /* args: B per step; reads in_K.bin (x then y); ctx a: train_step, ctx b: train_grads
     * (scale 1) + train_apply; prints the losses, writes params_a.bin, params_b.bin */
    #include <stdio.h>
    #include <stdlib.h>
    #include "tinyd.h"

    static int save(tinyd_ctx *c, const char *path)
    {
        FILE *f = fopen(path, "wb");
        int i;
        for (i = 0; i < tinyd_num_params(); ++i) {
            float buf[64];
            if (tinyd_get_param(c, tinyd_param_name(i), buf, tinyd_param_numel(i)) != RLX_OK)
                return 1;
            fwrite(buf, sizeof(float), tinyd_param_numel(i), f);
        }
        fclose(f);
        return 0;
    }

    int main(int argc, char **argv)
    {
        tinyd_ctx *a = tinyd_create(), *b = tinyd_create();
        static float x[4 * 256], y[256], grads[TINYD_NUM_GRADS];
        const float *in[2] = {x, y};
        int k;
        for (k = 1; k < argc; ++k) {
            int64_t B = atoll(argv[k]);
            float la, lb;
            char path[64];
            FILE *f;
            snprintf(path, sizeof path, "in_%d.bin", k - 1);
            f = fopen(path, "rb");
            if (fread(x, sizeof(float), (size_t)(4 * B), f) != (size_t)(4 * B) ||
                fread(y, sizeof(float), (size_t)B, f) != (size_t)B)
                return 2;
            fclose(f);
            if (tinyd_set_dims(a, &B) || tinyd_set_dims(b, &B) ||
                tinyd_input_numel(a, 0) != 4 * B || tinyd_input_numel(a, 1) != B)
                return 3;
            if (tinyd_train_step(a, in, 0.05f, &la) != RLX_OK ||
                tinyd_train_grads(b, in, 1.0f, &lb, grads) != RLX_OK ||
                tinyd_train_apply(b, grads, 0.05f) != RLX_OK) {
                fprintf(stderr, "%s | %s\n", tinyd_last_error(a), tinyd_last_error(b));
                return 4;
            }
            printf("step %d B=%lld loss %.9g %.9g\n", k, (long long)B, (double)la, (double)lb);
        }
        if (save(a, "params_a.bin") || save(b, "params_b.bin"))
            return 5;
        tinyd_destroy(a);
        tinyd_destroy(b);
        return 0;
    }
""")


def test_c_train_step_at_two_batch_sizes_matches_func_train_step(tmp_path):
    f = rlxc.Func("tinyd", _tinyd).init_randn(seed=1, stddev=0.3)
    out = _build(tmp_path, f, "tinyd", rlxc.optim.AdamW(0.05))
    batches = [5, 12, 5, 3]
    r = np.random.default_rng(4)
    opt, ref, want = rlxc.optim.AdamW(0.05), f, []
    for k, B in enumerate(batches):
        x = r.normal(size=(B, 4)).astype(np.float32)
        y = r.normal(size=(B, 1)).astype(np.float32)
        (out / f"in_{k}.bin").write_bytes(x.tobytes() + y.tobytes())
        ref, loss = ref.train_step(opt, {"x": x, "y": y})
        want.append(loss)
    text = _run([_cc(out, "tinyd", "train", TRAIN_C)] + [str(b) for b in batches], out)
    got = [tuple(map(float, m)) for m in re.findall(r"loss (\S+) (\S+)", text)]
    assert len(got) == len(batches), text
    np.testing.assert_allclose([g[0] for g in got], want, rtol=1e-5)
    np.testing.assert_allclose([g[1] for g in got], want, rtol=1e-5)
    flat = np.concatenate([ref.params()[n].ravel() for n in ("w", "w2", "b")])
    for which in ("a", "b"):
        params = np.frombuffer((out / f"params_{which}.bin").read_bytes(), np.float32)
        np.testing.assert_allclose(params, flat, rtol=1e-4, atol=1e-6)
    # the Python package of the same artifact trains at any batch size too
    from rlxc.runtime import load

    m = load(out, new=True)
    r = np.random.default_rng(4)
    for B in batches:
        x = r.normal(size=(B, 4)).astype(np.float32)
        y = r.normal(size=(B, 1)).astype(np.float32)
        m.train_step(x=x, y=y)
    for n in ("w", "w2", "b"):
        np.testing.assert_allclose(m.get_param(n), ref.params()[n], rtol=1e-4, atol=1e-6)


# -- the Python package --------------------------------------------------------------------
def test_package_runs_any_size_with_func_run_checks(twod):
    f, out = twod
    sys.path.insert(0, str(out))
    try:
        pkg = importlib.import_module("twod")
        shipped = importlib.import_module("twod._runtime.loader").load(str(out), new=True)
    finally:
        sys.path.remove(str(out))
    r = np.random.default_rng(3)
    for mod in (pkg, shipped):
        for B, T in ((2, 5), (33, 1)):
            x = r.normal(size=(B, 8)).astype(np.float32)
            z = r.normal(size=(T, 3)).astype(np.float32)
            for g, w in zip(mod.run(x=x, z=z), f.run(x=x, z=z)):
                assert g.shape == w.shape
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    x = np.zeros((0, 8), np.float32)
    z = np.zeros((2, 3), np.float32)
    for mod in (pkg, shipped):
        with pytest.raises(ValueError) as e:
            mod.run(x=x, z=z)
        assert "dimension 'B' is 0 from input 'x'" in str(e.value)
    with pytest.raises(ValueError) as want:
        f.run(x=x, z=z)
    with pytest.raises(ValueError) as got:
        pkg.run(x=x, z=z)
    assert str(got.value) == str(want.value)


def test_package_mismatch_names_the_symbol_and_both_inputs(tmp_path):
    f = rlxc.Func("tinyd", _tinyd).init_randn(seed=1, stddev=0.3)
    _build(tmp_path, f, "tinyd")
    from rlxc.runtime import load

    m = load(tmp_path, new=True)
    x, y = np.ones((3, 4), np.float32), np.ones((5, 1), np.float32)
    with pytest.raises(ShapeError) as got:
        m.run(x=x, y=y)
    with pytest.raises(ShapeError) as want:
        f.run(x=x, y=y)
    assert str(got.value) == str(want.value)
    assert "dimension 'B' is 3 from input 'x' but 5 from input 'y'" in str(got.value)
    np.testing.assert_allclose(m.run(x=x, y=y[:3])[0], f.run(x=x, y=y[:3])[0], rtol=1e-6)


# -- the CLI ----------------------------------------------------------------------------------
def _cli(*args):
    from click.testing import CliRunner

    from rlxc.cli.main import main

    return CliRunner().invoke(main, ["compile", *[str(a) for a in args]])


def test_cli_dynamic_factory_one_library_sizes_and_refusal(tmp_path):
    from rlxc.runtime import load

    src = tmp_path / "m.py"
    src.write_text(textwrap.dedent("""
        import rlxc

        def good():
            def build(s):
                return (s.input("x", ("B", 4)) * s.param("w", (4,))).sum(-1)
            return rlxc.Func("good", build).init_randn(seed=0, stddev=0.5)

        def two():
            def build(s):
                return (s.input("x", ("B", "S", 4)) * s.param("w", (4,))).tanh().sum(1)
            return rlxc.Func("two", build).init_randn(seed=0, stddev=0.5)
    """))
    r = _cli(f"{src}:good", "-o", tmp_path / "g")
    assert r.exit_code == 0, r.output
    m = load(tmp_path / "g", new=True)
    assert m.metadata["dims"] == ["B"] and m.inputs[0].shape == ("B", 4)
    for B in (1, 9):
        x = np.arange(4 * B, dtype=np.float32).reshape(B, 4)
        np.testing.assert_allclose(m.run(x=x)[0], x @ m.get_param("w"), rtol=1e-6)
    r = _cli(f"{src}:good", "-o", tmp_path / "g5", "--sizes", "B=5")   # explicit: one size
    assert r.exit_code == 0, r.output
    assert "dims" not in load(tmp_path / "g5", new=True).metadata
    assert "#define GOOD_INPUT0_NUMEL 20u" in (tmp_path / "g5" / "good.h").read_text()
    r = _cli(f"{src}:good", "-o", tmp_path / "c", "--target", "cuda")
    assert r.exit_code == 1 and "built for the CPU targets only; pass --sizes B=SIZE" in r.output
    r = _cli(f"{src}:good", "--emit", "llvm")   # one size's code
    assert r.exit_code == 1 and "--sizes B=SIZE" in r.output
    r = _cli(f"{src}:good", "--emit", "rlx")
    assert r.exit_code == 0 and "tensor<?x4xf32" in r.output
    r = _cli(f"{src}:two", "-o", tmp_path / "t")
    assert r.exit_code == 1
    assert "has dynamic dimensions ['B', 'S']" in r.output and "not size-generic" in r.output
    assert "--sizes B=SIZE --sizes S=SIZE" in r.output and "Traceback" not in r.output
    r = _cli(f"{src}:two", "-o", tmp_path / "t", "--sizes", "S=3")
    assert r.exit_code == 1 and "also pass --sizes B=SIZE" in r.output
    r = _cli(f"{src}:two", "-o", tmp_path / "t", "--sizes", "S=3", "--sizes", "B=6")
    assert r.exit_code == 0, r.output
    assert load(tmp_path / "t", new=True).run(x=np.ones((6, 3, 4), np.float32))[0].shape == (6, 4)


def test_cli_onnx_dim_param_one_library(tmp_path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto as TP
    from onnx import helper as h
    from onnx import numpy_helper as nh

    from rlxc.runtime import load

    w = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    g = h.make_graph([h.make_node("Gemm", ["x", "w"], ["y"], transB=1)], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, ("batch", 4))],
                     [h.make_tensor_value_info("y", TP.FLOAT, ("batch", 3))],
                     [nh.from_array(w, "w")])
    p = tmp_path / "lin.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(p))
    r = _cli(p, "-o", tmp_path / "o")
    assert r.exit_code == 0, r.output
    m = load(tmp_path / "o", new=True)
    assert m.metadata["dims"] == ["batch"]
    for B in (1, 7, 64):
        x = np.random.default_rng(B).normal(size=(B, 4)).astype(np.float32)
        np.testing.assert_allclose(m.run(x=x)[0], x @ w.T, rtol=1e-5, atol=1e-5)


# -- a static Func's ABI is unchanged ----------------------------------------------------------
def _normalized(text: str) -> str:
    text = re.sub(r"[0-9a-f]{64}", "H" * 64, text)
    return re.sub(r"IR sha256 [0-9a-f]{16}", "IR sha256 " + "h" * 16, text)


@pytest.mark.parametrize("name", ["mlp", "tiny"])
def test_static_header_and_exports_are_unchanged(name):
    """The header (and the symbols the glue exports) of the embed_c example models, as
    main produced them before dynamic dims reached the C ABI (fixtures/aot_golden)."""
    from rlxc.lowering.artifact.glue import emit_glue, exported_symbols
    from rlxc.lowering.artifact.header import emit_header

    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples", "embed_c"))
    try:
        import model
    finally:
        sys.path.pop(0)
    f = getattr(model, name)()
    spec = aot.spec_from_func(f, name, cpu=CPU)
    spec.version = "GOLDEN"
    train = name == "tiny"
    if train:
        spec.train = aot.train_spec(f, rlxc.optim.AdamW(0.05))
    gold = os.path.join(HERE, "fixtures", "aot_golden")
    with open(os.path.join(gold, f"{name}.h")) as fh:
        assert _normalized(emit_header(spec)) == fh.read()
    glue = emit_glue(spec, name, f"{name}_train_step_kernel" if train else None, {}, ["avx2"],
                     CPU, f"{name}_train_grads_kernel" if train else None,
                     f"{name}_train_apply_kernel" if train else None)
    with open(os.path.join(gold, f"{name}.exports")) as fh:
        assert exported_symbols(glue, name) == fh.read().split()


# -- the disk cache of the one library -----------------------------------------------------------
CACHE_PY = textwrap.dedent("""
    import numpy as np, rlxc
    import rlxc.lowering.cpu.dynsizes as dynsizes
    from rlxc import cache
    calls = []
    real = dynsizes.compile_dynamic
    dynsizes.compile_dynamic = lambda *a, **k: calls.append(1) or real(*a, **k)

    def build(s):
        return (s.input("x", ("B", 6)) @ s.param("w", (6, 5))).relu()

    f = rlxc.Func("cached_dyn", build).init_randn(seed=5, stddev=0.5)
    for B in (3, 40):
        x = np.random.default_rng(B).normal(size=(B, 6)).astype(np.float32)
        assert np.allclose(f.run(x=x)[0], np.maximum(x @ f.params()["w"], 0), atol=1e-5)
    print("compiles", len(calls), "disk_hits", cache.STATS["disk_hits"])
""")


def test_one_library_is_disk_cached_across_processes(tmp_path):
    env = {**ENV, "RLXC_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", CACHE_PY], capture_output=True, text=True,
                           env=env, timeout=300) for _ in range(2)]
    for p in runs:
        assert p.returncode == 0, p.stdout + p.stderr
    assert "compiles 1 disk_hits 0" in runs[0].stdout
    assert "compiles 0 disk_hits 1" in runs[1].stdout
