"""Quantization-aware training: the forward and backward see quantized weights
(straight-through estimator), the update goes to float32 master weights, and
the fused Trainer step carries rlx.fake_quant in its one compiled graph."""
import numpy as np
import pytest
from test_train import DEVICES, assert_params, batches, ref_loop, tiny

from rlxc.lowp import parse_format, quantize, quantize_named
from rlxc.optim import SGD, Adam

F32 = np.float32
NVF4 = parse_format("nvf4")


def q_nvf4(name, a):
    return quantize(a, *NVF4)


@pytest.mark.parametrize("device", DEVICES)
def test_forward_sees_quantized_weights(device):
    f, (b,) = tiny(), batches(1)
    qparams = {n: q_nvf4(n, a) for n, a in f.params().items()}
    want = f.with_params(qparams).run_on(device, b)[0]
    g, loss = f.train_step(SGD(0.1), b, quant="nvf4", device=device)
    assert loss == pytest.approx(float(want), rel=0 if device == "interp" else 1e-6)
    assert loss != pytest.approx(float(f.run_on(device, b)[0]), rel=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_master_weights_move_by_straight_through_gradient(device):
    f, data = tiny(), batches(3)
    opt, g = SGD(0.05), f
    for b in data:
        g, _ = g.train_step(opt, b, quant="nvf4", device=device)
    ref, _ = ref_loop(f, SGD(0.05), data, quant=q_nvf4)
    assert_params(g.params(), ref, device)
    w1 = g.params()["w1"]
    assert w1.dtype == F32
    assert not np.array_equal(w1, q_nvf4("w1", w1))  # masters stay off the fp4 grid
    # the STE gradient of step 1 is the gradient at the quantized weights
    vg = f.value_and_grad(f.param_names())
    qp = {n: q_nvf4(n, a) for n, a in f.params().items()}
    grads = vg.run_on("interp", {**data[0], **qp})[1:]
    g1, _ = f.train_step(SGD(0.05), data[0], quant="nvf4", device=device)
    for (n, p0), gr in zip(f.params().items(), grads):
        np.testing.assert_allclose(g1.params()[n], p0 - F32(0.05) * gr, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_trainer_runs_qat_inside_the_fused_step(device):
    f, data = tiny(), batches(4)
    tr = f.trainer(Adam(0.05), quant="nvf4", max_grad_norm=1.0, device=device)
    text = tr.step_func.mlir()
    assert text.count("rlx.fake_quant") == 4  # one per trained param
    assert text.count("func.func") == 1
    losses = [tr.step(b) for b in data]
    opt, g, ref_losses = Adam(0.05), f, []
    for b in data:
        g, loss = g.train_step(opt, b, quant="nvf4", max_grad_norm=1.0, device=device)
        ref_losses.append(loss)
    assert losses == ref_losses
    for n, a in g.params().items():
        np.testing.assert_array_equal(tr.func.params()[n], a)


@pytest.mark.parametrize("device", DEVICES)
def test_callable_quantizer_matches_format_name(device):
    f, data = tiny(), batches(3)
    by_name = f.trainer(Adam(0.05), quant="f8e4m3", device=device)
    by_fn = f.trainer(Adam(0.05), quant=quantize_named("f8e4m3"), device=device)
    assert "rlx.fake_quant" not in by_fn.step_func.mlir()  # run on the host instead
    for b in data:
        assert by_name.step(b) == pytest.approx(by_fn.step(b), rel=1e-6)
    assert_params(by_fn.func.params(), by_name.func.params(), device)
    opt, g = Adam(0.05), f
    for b in data:
        g, _ = g.train_step(opt, b, quant=lambda n, a: quantize(a, *parse_format("e4m3")),
                            device=device)
    assert_params(g.params(), by_name.func.params(), device)


def test_quantized_training_still_learns():
    f, data = tiny(), batches(1)
    tr = f.trainer(Adam(0.02), quant="f8e4m3", device="interp")
    first = tr.step(data[0])
    for _ in range(60):
        last = tr.step(data[0])
    assert last < 0.6 * first
