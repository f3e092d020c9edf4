"""The guard on several devices: JAX's `keras.distribution` and TensorFlow's `MirroredStrategy`.

Each backend runs in its own child process on two virtual CPU devices
(`--xla_force_host_platform_device_count=2` for JAX, two logical CPUs for
TensorFlow, set before either initialises); both children start at once and
print one JSON line the tests read. In each run a float16 layer ("big")
overflows from the third step on, on one replica's half of every global batch
only (its second half: the second replica's under data parallelism), or on one
device's shard of the layer's kernel (JAX `ModelParallel`). The guard must see
it (the amax over the whole global batch), skip that step on every replica,
promote the layer once, and leave every replica's weights finite and equal.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

COMMON = textwrap.dedent(
    """
    import json
    import numpy as np

    def build(keras, big_columns=slice(None)):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="first"),
                                  keras.layers.Dense(8, name="big"),
                                  keras.layers.Dense(1, name="out")])
        model.get_layer("out").trainable = False  # float32 training from here diverges
        model.compile(optimizer=keras.optimizers.SGD(1e-6), loss="mse")
        for name, value in (("first", 0.25), ("big", 100.0), ("out", 1e-6)):
            kernel, bias = model.get_layer(name).get_weights()
            if name == "big":
                kernel[:] = 0.01
                kernel[:, big_columns] = value
            else:
                kernel[:] = value
            model.get_layer(name).set_weights([kernel, bias])
        return model

    def data(second_half_only=True):
        # 6 global batches of 8; from the third on, the huge rows overflow "big" in float16.
        x = np.ones((48, 4), "float32")
        for batch in range(2, 6):
            start = 8 * batch + (4 if second_half_only else 0)
            x[start : 8 * batch + 8] = 1000.0
        return x, np.zeros((48, 1), "float32")

    def train(autoprec, model, x, y):
        plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
        callback = autoprec.AutoPrecision(
            plan, loss_scale=autoprec.LossScale(initial=1.0), verbose=0
        )
        history = model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                            callbacks=[callback])
        return callback, history, {
            "events": [dict(event) for event in callback.plan.events],
            "dtypes": {layer.name: layer.compute_dtype for layer in model.layers},
            "iterations": int(np.asarray(model.optimizer.iterations.numpy())),
            "skipped": int(np.asarray(model.optimizer.non_finite_steps.numpy())),
        }

    def agreement(copies):
        # {path: [finite on every copy, every copy equal to the first]}
        return {
            path: [all(bool(np.isfinite(c).all()) for c in values),
                   all(np.array_equal(c, values[0]) for c in values)]
            for path, values in copies.items()
        }
    """
)

JAX_CHILD = COMMON + textwrap.dedent(
    """
    import sys
    sys.modules["tensorflow"] = None
    import jax, keras, autoprec

    devices = jax.devices()
    results = {"devices": len(devices)}

    def shards(model):
        return {v.path: [np.asarray(s.data) for s in v.value.addressable_shards]
                for v in model.weights}

    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
    model = build(keras)
    x, y = data()
    # Where the third global batch's rows go: the largest value on each device.
    layout = keras.distribution.distribution().get_data_layout((8, 4)).backend_layout
    placed = jax.device_put(x[16:24], layout)
    results["placement"] = sorted(
        [shard.device.id, float(np.max(np.asarray(shard.data)))]
        for shard in placed.addressable_shards
    )
    _, history, run = train(autoprec, model, x, y)
    run["agreement"] = agreement(shards(model))
    run["copies"] = {p: len(c) for p, c in shards(model).items()}
    results["data_parallel"] = run

    # ModelParallel: the kernel of "big" is split across the devices by its columns, and only
    # the second device's columns are large: the overflow starts in one device's shard.
    mesh = keras.distribution.DeviceMesh((1, len(devices)), ["batch", "model"], devices=devices)
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map[".*big/kernel"] = (None, "model")
    layout_map[".*big/bias"] = ("model",)
    keras.distribution.set_distribution(
        keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
    )
    model = build(keras, big_columns=slice(4, 8))
    x, y = data(second_half_only=False)
    _, history, run = train(autoprec, model, x, y)
    copies = shards(model)
    run["agreement"] = agreement({p: c for p, c in copies.items() if "big" not in p})
    run["big_shards"] = [list(c.shape) for c in copies[model.get_layer("big").kernel.path]]
    run["finite"] = all(bool(np.isfinite(c).all()) for cs in copies.values() for c in cs)
    results["model_parallel"] = run
    print("RESULT " + json.dumps(results))
    """
)

TF_CHILD = COMMON + textwrap.dedent(
    """
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras, autoprec

    strategy = tf.distribute.MirroredStrategy(
        [device.name for device in tf.config.list_logical_devices("CPU")]
    )
    with strategy.scope():
        model = build(keras)
    x, y = data()
    batches = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(x).batch(8))
    third = list(batches)[2]
    placement = [float(np.max(v)) for v in strategy.experimental_local_results(third)]
    _, history, run = train(autoprec, model, x, y)
    run["placement"] = placement
    copies = {v.path: [np.asarray(c) for c in strategy.experimental_local_results(v.value)]
              for v in model.weights}
    run["replicas"] = strategy.num_replicas_in_sync
    run["agreement"] = agreement(copies)
    run["copies"] = {p: len(c) for p, c in copies.items()}
    run["logs"] = {key: [float(v) for v in values] for key, values in history.history.items()}
    print("RESULT " + json.dumps({"mirrored": run}))
    """
)


def _environment(backend: str) -> dict[str, str]:
    environment = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if backend == "jax":
        environment["JAX_PLATFORMS"] = "cpu"
        environment["XLA_FLAGS"] = " ".join(
            [environment.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=2"]
        ).strip()
    return environment


@pytest.fixture(scope="module")
def results() -> dict:
    """Runs both children at once; returns their results by run name."""
    children = {}
    if _has_jax():
        children["jax"] = subprocess.Popen(
            [sys.executable, "-c", JAX_CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=_environment("jax"), cwd=ROOT,
        )  # fmt: skip
    children["tensorflow"] = subprocess.Popen(
        [sys.executable, "-c", TF_CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=_environment("tensorflow"), cwd=ROOT,
    )  # fmt: skip
    combined = {}
    for name, child in children.items():
        stdout, stderr = child.communicate(timeout=300)
        assert child.returncode == 0, f"{name} child failed:\n{stderr[-3000:]}"
        line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
        combined.update(json.loads(line[len("RESULT ") :]))
    return combined


def _has_jax() -> bool:
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def _check_promoted_once(run: dict) -> None:
    """One promotion, of "big" at step 3, from float16; "first" stays float16."""
    assert len(run["events"]) == 1, run["events"]
    event = run["events"][0]
    assert event["kind"] == "promotion" and event["layer"] == "big", event
    assert event["step"] == 3 and event["from"] == "float16" and event["to"] != "float16"
    assert "inputs amax 1000" in event["evidence"]  # the huge half's values, seen globally
    assert run["dtypes"] == {"first": "float16", "big": event["to"], "out": "float32"}


def _check_steps(run: dict) -> None:
    """Step 3 is skipped on every replica and replayed; the 3 steps after the promotion run."""
    assert run["skipped"] == 1 and run["iterations"] == 5


@pytest.fixture(scope="module")
def jax_results(results) -> dict:
    if "data_parallel" not in results:
        pytest.skip("JAX is not installed")
    return results


def test_jax_data_parallel_promotes_a_layer_that_overflows_on_one_replica(jax_results):
    run = jax_results["data_parallel"]
    assert jax_results["devices"] == 2
    assert jax_results["placement"] == [[0, 1.0], [1, 1000.0]]  # the huge rows: device 1 only
    _check_promoted_once(run)
    _check_steps(run)


def test_jax_data_parallel_replicas_keep_equal_finite_weights(jax_results):
    run = jax_results["data_parallel"]
    assert set(run["copies"].values()) == {2}
    assert all(finite and equal for finite, equal in run["agreement"].values()), run["agreement"]


def test_jax_model_parallel_sees_an_overflow_in_one_devices_shard(jax_results):
    run = jax_results["model_parallel"]
    assert run["big_shards"] == [[8, 4], [8, 4]]  # the kernel is split across the devices
    _check_promoted_once(run)
    _check_steps(run)
    assert run["finite"]
    assert all(finite and equal for finite, equal in run["agreement"].values()), run["agreement"]


def test_mirrored_strategy_promotes_a_layer_that_overflows_on_one_replica(results):
    run = results["mirrored"]
    assert run["replicas"] == 2
    assert run["placement"] == [1.0, 1000.0]  # the huge rows: the second replica only
    _check_promoted_once(run)
    _check_steps(run)


def test_mirrored_strategy_skips_the_step_on_every_replica(results):
    run = results["mirrored"]
    assert set(run["copies"].values()) == {2}
    assert all(finite and equal for finite, equal in run["agreement"].values()), run["agreement"]
    logs = run["logs"]
    assert logs["skipped_steps"] == [1.0]
    assert all(value == value for value in logs["loss"])  # the skipped step left no NaN
