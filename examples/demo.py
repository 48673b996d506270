"""End-to-end demo: trace an MLP, transform it, compile it to native code, run it.

Run with `make demo` (which installs everything into .venv first).
"""
import time

import numpy as np

import rlxc


def mlp(s):
    x = s.input("x", (32, 64))
    y = s.input("y", (32,), "i32")
    h = x.linear(s.param("w1", (64, 128)), s.param("b1", (128,))).relu()
    logits = h.linear(s.param("w2", (128, 10)), s.param("b2", (10,)))
    return logits.cross_entropy(y)


def main():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 64)).astype(np.float32)
    y = rng.integers(0, 10, size=32).astype(np.int32)

    f = rlxc.Func("mlp", mlp).init_randn(seed=1234, stddev=0.1)
    print(f"traced {f!r}")
    print("\n".join(f.mlir().splitlines()[:6]) + "\n  ...")

    device = rlxc.default_device()
    t = time.perf_counter()
    (loss,) = f.run(x=x, y=y)  # compiles on first call, cached afterwards
    print(f"\nloss on {device}: {float(loss):.6f}  (first call, incl. compile: "
          f"{time.perf_counter() - t:.2f} s)")
    (ref,) = f.run_on("interp", x=x, y=y)
    print(f"loss on the reference interpreter: {float(ref):.6f}")
    assert np.allclose(loss, ref, rtol=1e-4), "native and reference disagree"

    vg = f.value_and_grad_all()
    outs = vg.run(x=x, y=y)
    print(f"\nvalue_and_grad_all: loss {float(outs[0]):.6f}, grad norms " +
          ", ".join(f"{n}={np.linalg.norm(g):.4f}" for n, g in zip(f.param_names(), outs[1:])))

    per_example = f.grad(["x"]).vmap(["x", "y"], 4)
    print(f"vmap(grad) over a batch of 4 models' inputs: output shape "
          f"{per_example.run(x=np.stack([x] * 4), y=np.stack([y] * 4))[0].shape}")

    if device != "interp":
        jitted = f.jit()
        jitted.run(x=x, y=y)
        t = time.perf_counter()
        for _ in range(100):
            jitted.run(x=x, y=y)
        print(f"\njitted forward: {(time.perf_counter() - t) * 1e4:.1f} us per call")
    print("\ndemo OK")


if __name__ == "__main__":
    main()
