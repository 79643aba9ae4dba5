"""benchmarks/bn_kernels_tf115.py and its program: inception_v1 against TensorFlow 1.15, op by op (issue 37).

The benchmark is not a test (it builds inception_v1 in two interpreters); these
tests check what would make its tables wrong: the float64 references are the
batch norm and its gradient (against finite differences), an op's error is
reported where it was planted and is 0 where there is none, the first parting
is named at the planted sign flip, the routed gradients (the counterfactual)
follow the other interpreter's pattern and maxima, and the judgement counts a
planted fault as beyond the floor and refuses to judge when nothing was compared.
"""

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import _bn_program as program
from benchmarks import bn_kernels_tf115 as bench

RNG = np.random.RandomState(3)


def test_the_references_are_batch_norm_and_its_gradient():
    x = RNG.normal(0.5, 2.0, (2, 3, 3, 4))
    scale, offset, dy = RNG.uniform(0.5, 2.0, 4), RNG.normal(size=4), RNG.normal(size=x.shape)
    y, mean, variance, inverse, xhat = bench.reference_forward(x, scale, offset, 1e-3)
    flat = x.reshape(-1, 4)
    assert np.allclose(mean, flat.mean(0)) and np.allclose(variance, flat.var(0, ddof=1))
    assert np.allclose(y.reshape(-1, 4).mean(0), offset) and not np.allclose(y, x)
    dx, dscale, doffset = bench.reference_backward(dy, scale, inverse, xhat)

    def loss(value):  # sum(dy * y), whose gradient in x is dx
        return float((dy * bench.reference_forward(value, scale, offset, 1e-3)[0]).sum())
    step = 1e-6
    for index in [(0, 0, 0, 0), (1, 2, 1, 3), (0, 1, 2, 2)]:
        up, down = x.copy(), x.copy()
        up[index] += step
        down[index] -= step
        assert dx[index] == pytest.approx((loss(up) - loss(down)) / (2 * step), rel=1e-5)
    assert np.allclose(doffset, dy.reshape(-1, 4).sum(0))
    assert np.allclose(dscale, (dy.reshape(-1, 4) * xhat).sum(0))


def _inputs():
    arrays = {"l0_x": RNG.normal(size=(1, 4, 4, 3)).astype(np.float32), "l0_scale": np.ones(3, np.float32),
              "l0_offset": np.zeros(3, np.float32), "l0_dy": RNG.normal(size=(1, 4, 4, 3)).astype(np.float32)}
    return [({"op": "net/bn/FusedBatchNormV3", "epsilon": 1e-3}, arrays)]


def _exact(inputs):
    layer, arrays = inputs[0]
    y, mean, variance, inverse, xhat = bench.reference_forward(arrays["l0_x"], arrays["l0_scale"],
                                                               arrays["l0_offset"], layer["epsilon"])
    dx, dscale, doffset = bench.reference_backward(arrays["l0_dy"], arrays["l0_scale"], inverse, xhat)
    return {f"l0_{part}": value for part, value in zip(bench.PARTS, (y, mean, variance, dx, dscale, doffset))}


def test_an_op_error_is_reported_where_planted():
    inputs = _inputs()
    outputs = _exact(inputs)
    [clean] = bench.op_errors(inputs, outputs)
    assert all(clean[part] == 0 for part in bench.PARTS)
    outputs["l0_dx"] = outputs["l0_dx"].copy()
    outputs["l0_dx"][0, 1, 2, 0] += 1e-3
    [planted] = bench.op_errors(inputs, outputs)
    assert planted["dx"] == pytest.approx(1e-3) and planted["y"] == 0
    relative = 1e-3 / planted["largest"]["dx"]
    assert f"dx {relative:.1e} (1.15) / 0.0e+00 (2.21)" in bench.summary([planted], [clean])
    row = bench.op_rows(inputs, [planted], [clean])[0]
    assert "1.0e-03 / 0.0e+00" in row


def _captures(flip: bool, elsewhere: float = 0.0):
    """Two captures of one batch norm and its gradient: the old one's output changes
    sign at one element (``flip``), its incoming gradient differs there by that
    element's value, and by ``elsewhere`` at another element."""
    y = np.array([[[[0.5], [-0.2], [1e-6], [2.0]]]], np.float32)
    dy = np.array([[[[1e-3], [0.0], [2e-3], [5e-4]]]], np.float32)
    y_old, dy_old = y.copy(), dy.copy()
    if flip:
        y_old[0, 0, 2, 0] = -1e-6
        dy_old[0, 0, 2, 0] = 0.0
    dy_old[0, 0, 0, 0] += elsewhere
    layers = [{"op": "net/bn/FusedBatchNormV3", "kind": "forward", "epsilon": 1e-3,
               "inputs": ["x:0", "scale:0", "offset:0"], "outputs": ["y:0", "mean:0", "var:0"]},
              {"op": "gradients/net/bn/FusedBatchNormV3_grad/FusedBatchNormGradV3", "kind": "gradient",
               "epsilon": 1e-3, "inputs": ["dy:0", "x:0", "scale:0"], "outputs": ["dx:0", "ds:0", "do:0"]}]
    x = RNG.normal(size=y.shape).astype(np.float32)
    common = {"x:0": x, "scale:0": np.ones(1, np.float32), "offset:0": np.zeros(1, np.float32)}
    new = ({"layers": layers}, dict(common, **{"y:0": y, "dy:0": dy}))
    old = ({"layers": layers}, dict(common, **{"y:0": y_old, "dy:0": dy_old}))
    return old, new


def test_the_first_parting_is_named_at_the_planted_sign_flip():
    old, new = _captures(flip=True)
    rows, parting = bench.net_rows(old, new)
    assert "| 1 |" in rows[0] and "at the elements whose ReLU input changed sign" in parting
    assert "2.0e-03 apart" in parting
    old, new = _captures(flip=False, elsewhere=5e-4)
    assert "elsewhere:" in bench.net_rows(old, new)[1] and "changed sign" not in bench.net_rows(old, new)[1]
    old, new = _captures(flip=False)
    assert bench.net_rows(old, new)[1].startswith("first parting: none")


def test_routes_name_the_flipped_batch_norms(tmp_path):
    old, new = _captures(flip=True)
    assert bench.write_routes(str(tmp_path), old, new) == (["net/bn/FusedBatchNormV3"], [])
    old, new = _captures(flip=False)
    assert bench.write_routes(str(tmp_path), old, new) == ([], [])


def test_the_routed_gradients_follow_the_other_pattern_and_maxima(monkeypatch):
    monkeypatch.setattr(program, "ROUTES", {})
    x_value = np.array([[[[1.0], [-2.0]], [[0.5], [3.0]]]], np.float32)
    other_relu = np.array([[[[-1.0], [2.0]], [[0.5], [3.0]]]], np.float32)  # two elements of another sign
    other_pool = np.array([[[[9.0], [-2.0]], [[0.5], [3.0]]]], np.float32)  # the maximum elsewhere
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, x_value.shape)
        bn = tf.identity(x, name="bn")
        program.ROUTES.update({"bn": [other_relu]})
        with graph.gradient_override_map({"Relu": "BnProgramRoutedReluTest", "MaxPool": "BnProgramRoutedPoolTest"}):
            tf.RegisterGradient("BnProgramRoutedReluTest")(program.routed_relu_gradient)
            tf.RegisterGradient("BnProgramRoutedPoolTest")(program.routed_max_pool_gradient)
            relu = tf.nn.relu(bn)
            pool = tf.compat.v1.nn.max_pool(x, [1, 2, 2, 1], [1, 2, 2, 1], "VALID", name="pool")
        plain_relu, plain_pool = tf.nn.relu(x), tf.compat.v1.nn.max_pool(x, [1, 2, 2, 1], [1, 2, 2, 1], "VALID")
        program.ROUTES["pool"] = [other_pool, np.array([[[[9.0]]]], np.float32)]
        routed = tf.gradients(relu, x)[0], tf.gradients(pool, x)[0]
        own = tf.gradients(plain_relu, x)[0], tf.gradients(plain_pool, x)[0]
        with tf.compat.v1.Session() as session:
            (relu_routed, pool_routed), (relu_own, pool_own) = session.run((routed, own), {x: x_value})
    assert np.array_equal(relu_routed, (other_relu > 0).astype(np.float32))
    assert np.array_equal(relu_own, (x_value > 0).astype(np.float32)) and not np.array_equal(relu_own, relu_routed)
    assert pool_routed[0, 0, 0, 0] == 1 and pool_routed.sum() == 1  # the other's maximum
    assert pool_own[0, 1, 1, 0] == 1 and pool_own.sum() == 1       # its own


def test_the_judgement_counts_a_planted_fault_and_refuses_nothing_compared():
    new = {"gradients/w": np.ones(4, np.float32), "gradients/b": np.ones(2, np.float32), "y:0": np.zeros(1)}
    old = {"gradients/w": np.ones(4, np.float32) + 1e-3, "gradients/b": np.ones(2, np.float32), "y:0": np.ones(1)}
    assert bench.judged(old, new, {"gradients/w": 2e-4, "gradients/b": 0.0}) == (1, 1, 0, 0)
    assert bench.judged(old, new, {"gradients/w": 1e-5}) == (1, 0, 1, 0)
    assert bench.judged(old, new, {}) == (1, 0, 0, 1)
    with pytest.raises(ValueError, match="none compared"):
        bench.judged({}, {"y:0": np.zeros(1)}, {})
    with pytest.raises(ValueError, match="none captured"):
        bench.gradient_summary({}, {"y:0": np.zeros(1)})
    assert "1 of 2 over" in bench.gradient_summary(old, new)
