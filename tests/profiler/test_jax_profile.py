"""The profiler on Keras' JAX backend records the same `Profile` as on TensorFlow.

This process runs TensorFlow; every JAX check runs in one child process started
with `KERAS_BACKEND=jax` and TensorFlow made unimportable (as on a GPU machine
with JAX and no TensorFlow), on two forced CPU devices. Both sides profile the
same model (Dense, MultiHeadAttention, Add, LayerNormalization, pooling, a
linear head) from the same initial weights on the same batches; the child
writes its profiles as JSON and the tests below compare them slot by slot.

Tolerances, from float32 rounding (two backends' kernels sum in different
orders, and three SGD steps carry the differences on):

- counts, zeros, non-finite and NaN counts: exact;
- largest magnitude, sum of magnitudes, sum of squares: relative 1e-3
  (measured here: at most 5e-4, on the near-zero gradients behind a saturated
  softmax; 3e-7 elsewhere);
- smallest non-zero magnitude: within one binade (it is set by cancellation;
  measured: relative 3e-3 at most), where both sides hold it above the rounding
  noise of the tensor (2^-12 of its largest magnitude); below, each CPU's
  cancellation sets it (2.9e-6 against 1.1e-6 on an AVX2-only host);
- exponent histograms: at most 0.5% of the elements (at least two) in another
  bin (a value next to a power of two may round to either side);
- a tensor that is rounding noise on both sides (its largest magnitude below
  2^-12 of the largest of its kind in the model: the query and key gradients
  behind a saturated softmax) is compared by its counts only: how many zeros,
  what magnitudes, and the float16 verdict read from them, depend on how the
  CPU rounds `exp` (4e-6 against 1.4e-7 on an AVX2-only host, 5e-4 apart on an
  AVX512 one).

The child's XLA compiles its CPU code at LLVM optimisation level 0, which keeps
the child's compile time (most of its run time) down and changes no semantics.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import numpy as np
import pytest
from profiler.reference import assert_matches_reference, cross_backend_model

from autoprec.profiler import Profile, TensorStats, profile
from autoprec.profiler.profile_json import TENSOR_KINDS

pytest.importorskip("jax")

_TESTS_DIR = Path(__file__).resolve().parents[1]
_STEPS = 3
_BATCH = 8
_MAGNITUDE_RTOL = 1e-3
_MOVED_FRACTION = 0.005
#: Binades below the largest magnitude of its kind in which a tensor is rounding noise.
_NOISE_BINADES = 12

#: Tensors whose statistics the JAX measurement must give exactly as NumPy does.
_SPECIAL_TENSORS = {
    "normal": np.random.default_rng(1).normal(scale=3.0, size=(5, 7, 11)).astype(np.float32),
    "special": np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, 0.99999994, -(2.0**-14), 6.0e-8, 1e-40]
        + [-1.4e-45, 3e30, 65504.0, 70000.0, 3e38, -3e38],
        np.float32,
    ),
    "zeros": np.zeros((4, 3), np.float32),
    "subnormal": np.array([1e-41, 0.0, 2e-39, -1.4e-45], np.float32),
}

CHILD = textwrap.dedent(
    """
    import contextlib, dataclasses, io, json, sys
    from pathlib import Path
    sys.modules["tensorflow"] = None  # as on a machine with JAX and no TensorFlow
    import jax, keras, numpy as np
    import autoprec
    from autoprec._backends import jax_probes
    from autoprec.layers import layer_paths
    from autoprec.profiler import ProbeSession, ProfileCallback, TensorStats, profile
    from profiler.reference import cross_backend_model

    folder = Path(sys.argv[1])
    steps, batch = int(sys.argv[2]), int(sys.argv[3])
    arrays = np.load(folder / "arrays.npz")
    x, y = arrays["x"], arrays["y"]
    results = {"devices": len(jax.devices())}

    # The measurement itself, on tensors with every special value.
    special = np.load(folder / "special.npz")
    measure = jax.jit(jax_probes.tensor_statistics)
    results["special"] = {}
    for name in special.files:
        counts, floats = jax.device_get(measure(special[name]))
        raw = jax_probes.host_statistics(counts[None], floats[None])
        results["special"][name] = TensorStats.from_raw(*raw).to_dict()

    def model_with_weights(optimizer=None):
        model = cross_backend_model()
        model.set_weights([arrays[f"w{i}"] for i in range(len(model.weights))])
        model.compile(optimizer=optimizer or keras.optimizers.SGD(0.01), loss="mse")
        return model

    def instance_overrides(model):
        found = [name for name in ("train_step", "compute_loss_and_updates",
                                   "make_train_function", "_autoprec_probe_session")
                 if name in vars(model)]
        found += ["stateless_apply"] if "stateless_apply" in vars(model.optimizer) else []
        found += [path for path, layer in layer_paths(model).items() if "call" in vars(layer)]
        return found

    # The same model, weights and batches as the TensorFlow side.
    model = model_with_weights()
    before = [w.numpy().copy() for w in model.weights + model.optimizer.variables]
    prof = profile(model, (x, y), steps=steps, batch_size=batch, verbose=0)
    prof.save(folder / "jax.json")
    after = [w.numpy() for w in model.weights + model.optimizer.variables]
    results["unchanged"] = all(np.array_equal(b, a) for b, a in zip(before, after))
    results["overrides_after_profile"] = instance_overrides(model)
    results["train_function_probed"] = bool(
        getattr(model.train_function, "_autoprec_probed", False))
    try:
        prof.to_tensorboard(folder / "logs")
        results["tensorboard"] = "written"
    except autoprec.BackendError as error:
        results["tensorboard"] = str(error)

    # Two devices, the batch sharded (keras.distribution), gradients loss-scaled.
    keras.distribution.set_distribution(keras.distribution.DataParallel(devices=jax.devices()))
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.01), initial_scale=1024.0)
    model = model_with_weights(scaled)
    profile(model, (x, y), steps=steps, batch_size=batch, verbose=0).save(
        folder / "jax_data_parallel.json")
    keras.distribution.set_distribution(None)

    # ProfileCallback inside a real fit with steps_per_execution=2; fit runs on after it.
    small = keras.Sequential([keras.Input((6, 8)), keras.layers.Dense(4, name="dense")])
    small.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
    callback = ProfileCallback(steps=3)
    history = small.fit(x, np.zeros((24, 6, 4), "float32"), batch_size=4, epochs=2,
                        verbose=0, callbacks=[callback])
    results["callback"] = {
        "steps": callback.profile.steps,
        "count": callback.profile.layers["dense"].activations["output"].count,
        "epochs": len(history.history["loss"]),
        "overrides": instance_overrides(small),
    }
    with ProbeSession(small) as session:
        small.fit(x, np.zeros((24, 6, 4), "float32"), batch_size=8, epochs=1, verbose=0)
        small.fit(x, np.zeros((24, 6, 4), "float32"), batch_size=8, epochs=1, verbose=0)
        across = session.collect()
    results["session"] = {
        "steps": session.steps_recorded(),
        "count": across.layers["dense"].activations["output"].count,
        "tensors": session.probed_tensor_count,
    }

    # Profiled while the guard's telemetry records the same steps, installed either way round.
    from autoprec.runtime import apply_plan
    from autoprec.runtime.telemetry import GuardTelemetry
    results["with_guard"] = {}
    for order in ("guard_first", "profiler_first"):
        keras.utils.set_random_seed(0)
        guarded = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, name="first"),
                                    keras.layers.Dense(2, name="out")])
        guarded.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
        plan = autoprec.PrecisionPlan.uniform(guarded, "float16").with_dtype("out", "float32")
        handle = apply_plan(guarded, plan)
        guarded.optimizer = autoprec.FlooredLossScaleOptimizer(guarded.optimizer, 1024.0)
        guarded.optimizer.build(guarded.trainable_variables)
        telemetry, session = GuardTelemetry(guarded), ProbeSession(guarded)
        for part in ((telemetry, session) if order == "guard_first" else (session, telemetry)):
            part.install()
        guarded.make_train_function(force=True)
        guarded.fit(x[:, 0], y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        first = session.collect().layers["first"]
        results["with_guard"][order] = {
            "profile_steps": session.steps_recorded(),
            "skipped": telemetry.failed_step(handle.dtypes) is not None,
            "stats": {kind: getattr(first, kind).to_dict()
                      for kind in ("activation", "activation_gradient", "weight_gradient")},
        }
        session.remove()
        telemetry.remove()

    # The automatic mode profiles its first steps on JAX too, then decides.
    rng = np.random.default_rng(0)
    features = rng.normal(size=(64, 8)).astype("float32")
    labels = (features[:, 0] > 0).astype("int32")
    mlp = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                            keras.layers.Dense(2)])
    mlp.compile(optimizer="sgd",
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    device = autoprec.hardware.detect()  # told bfloat16 pays, so the one-liner profiles here
    device = dataclasses.replace(device, fast_dtypes=("bfloat16",), slow_dtypes=("float16",),
                                 bfloat16_flops=2 * device.float32_flops)
    auto = autoprec.AutoPrecision(hardware=device,
                                  auto=autoprec.AutoPlan(profile_steps=2, timing_rounds=1))
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        mlp.fit(features, labels, batch_size=8, epochs=2, verbose=0, callbacks=[auto])
    results["auto"] = {
        "messages": shown.getvalue().splitlines(),
        "profile_steps": None if auto.profile is None else auto.profile.steps,
        "profiled_layers": [] if auto.profile is None else list(auto.profile.layers),
        "plan": None if auto.plan is None else auto.plan.resolve(),
    }
    print("RESULT " + json.dumps(results))
    """
)


def _model_and_data() -> tuple[keras.Model, np.ndarray, np.ndarray]:
    """The model with query and key weights large enough that its logits overflow float16."""
    keras.utils.set_random_seed(0)
    model = cross_backend_model()
    attention = model.get_layer("attention")
    for dense in (attention._query_dense, attention._key_dense):
        dense.kernel.assign(dense.kernel.numpy() * 80.0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(_STEPS * _BATCH, 6, 8)).astype("float32")
    y = rng.normal(size=(_STEPS * _BATCH, 2)).astype("float32")
    return model, x, y


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("jax_profile")
    model, x, y = _model_and_data()
    weights = {f"w{i}": weight for i, weight in enumerate(model.get_weights())}
    np.savez(folder / "arrays.npz", x=x, y=y, **weights)
    np.savez(folder / "special.npz", **_SPECIAL_TENSORS)
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    tensorflow_profile = profile(model, (x, y), steps=_STEPS, batch_size=_BATCH, verbose=0)

    environment = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    environment["XLA_FLAGS"] = (
        "--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0 "
        "--xla_llvm_disable_expensive_passes=true"
    )
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(_TESTS_DIR), environment.get("PYTHONPATH", "")]
    )
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(_STEPS), str(_BATCH)],
        capture_output=True, text=True, timeout=300, env=environment, cwd=folder,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-4000:]
    line = next(x for x in completed.stdout.splitlines() if x.startswith("RESULT "))
    return {
        "tensorflow": tensorflow_profile,
        "jax": Profile.load(folder / "jax.json"),
        "jax_data_parallel": Profile.load(folder / "jax_data_parallel.json"),
        "child": json.loads(line[len("RESULT ") :]),
    }


def _slots(prof: Profile) -> dict[tuple[str, str, str], TensorStats]:
    return {
        (path, kind, key): stats
        for path, layer in prof.layers.items()
        for kind in TENSOR_KINDS
        for key, stats in getattr(layer, kind).items()
    }


def _relative(first: float, second: float) -> float:
    return abs(first - second) / max(abs(first), abs(second), 1e-300)


def _moved(first: TensorStats, second: TensorStats) -> int:
    """How many elements sit in another exponent bin (half the histograms' L1 distance)."""
    return int(np.abs(first.histogram - second.histogram).sum()) // 2


def _noise_slots(prof: Profile) -> set[tuple[str, str, str]]:
    """Slots whose largest magnitude is below 2^-12 of the largest of their kind in the model."""
    slots = _slots(prof)
    largest: dict[str, float] = {}
    for (_, kind, _), stats in slots.items():
        largest[kind] = max(largest.get(kind, 0.0), stats.max_abs or 0.0)
    return {
        slot
        for slot, stats in slots.items()
        if (stats.max_abs or 0.0) < largest[slot[1]] * 2.0**-_NOISE_BINADES
    }


def _noise_layers(*profiles: Profile) -> set[str]:
    """Layers with a rounding-noise gradient on any of `profiles`."""
    return {
        path
        for prof in profiles
        for path, kind, _ in _noise_slots(prof)
        if kind in ("activation_gradients", "weight_gradients")
    }


def _smallest_differs(first: TensorStats, second: TensorStats) -> bool:
    """Whether the smallest non-zero magnitudes differ beyond a binade, above rounding noise."""
    smallest = (first.min_nonzero_abs, second.min_nonzero_abs)
    if None in smallest:
        return smallest != (None, None)
    noise = max(first.max_abs or 0.0, second.max_abs or 0.0) * 2.0**-_NOISE_BINADES
    if min(smallest) < noise:
        return False  # set by each CPU's cancellation
    return abs(math.log2(smallest[0] / smallest[1])) >= 1.0


def _differences(expected: Profile, actual: Profile) -> list[str]:
    """Every slot where `actual` is outside the tolerances (module docstring) of `expected`."""
    wrong = []
    expected_slots, actual_slots = _slots(expected), _slots(actual)
    if set(expected_slots) != set(actual_slots):
        return [f"slots differ: {sorted(set(expected_slots) ^ set(actual_slots))}"]
    noise = _noise_slots(expected) & _noise_slots(actual)
    for slot, first in expected_slots.items():
        second = actual_slots[slot]
        exact = (
            ("count", "nonfinite", "nan")
            if slot in noise
            else ("count", "zeros", "nonfinite", "nan")
        )
        for field in exact:
            if getattr(first, field) != getattr(second, field):
                wrong.append(f"{slot} {field}: {getattr(first, field)} != {getattr(second, field)}")
        if slot in noise:
            continue
        for field in ("max_abs", "sum_abs", "sum_squares"):
            error = _relative(getattr(first, field), getattr(second, field))
            if error > _MAGNITUDE_RTOL:
                wrong.append(f"{slot} {field}: relative difference {error:.2e}")
        if _smallest_differs(first, second):
            wrong.append(
                f"{slot} min_nonzero_abs: {(first.min_nonzero_abs, second.min_nonzero_abs)}"
            )
        if _moved(first, second) > max(2, _MOVED_FRACTION * first.count):
            wrong.append(f"{slot} histogram: {_moved(first, second)} of {first.count} moved")
    return wrong


def _comparison_table(tensorflow_profile: Profile, jax_profile: Profile) -> str:
    """Per layer: largest forward and gradient magnitude on both backends, elements moved."""
    lines = [
        f"{'layer':24s} {'max|x| TF':>11s} {'max|x| JAX':>11s} {'max|g| TF':>11s} "
        f"{'max|g| JAX':>11s} {'moved':>9s}"
    ]
    for path, first in tensorflow_profile.layers.items():
        second = jax_profile.layers[path]
        pairs = [(first.forward, second.forward), (first.gradient, second.gradient)]
        moved = sum(_moved(a, b) for a, b in pairs if a is not None)
        count = sum(a.count for a, _ in pairs if a is not None)
        values = [
            f"{stats.max_abs:11.6g}" if stats else f"{'-':>11s}" for pair in pairs for stats in pair
        ]
        lines.append(f"{path:24s} {' '.join(values)} {moved:4d}/{count:<4d}")
    return "\n".join(lines)


def test_jax_records_what_tensorflow_records_for_every_layer(recorded):
    tensorflow_profile, jax_profile = recorded["tensorflow"], recorded["jax"]
    print("\n" + _comparison_table(tensorflow_profile, jax_profile))
    assert jax_profile.steps == tensorflow_profile.steps == _STEPS
    assert list(jax_profile.layers) == list(tensorflow_profile.layers)
    assert _differences(tensorflow_profile, jax_profile) == []
    logits = [p.layers["attention"].internals["attention_logits"] for p in recorded.values()
              if isinstance(p, Profile)]  # fmt: skip
    assert all(stats.count == _STEPS * _BATCH * 2 * 6 * 6 for stats in logits)
    assert all(stats.max_abs > 65504 for stats in logits)  # above float16's largest


def test_jax_profile_has_the_same_json_and_verdicts(recorded):
    tensorflow_profile, jax_profile = recorded["tensorflow"], recorded["jax"]
    expected, actual = tensorflow_profile.to_dict(), jax_profile.to_dict()
    assert actual.keys() == expected.keys()
    assert actual["fingerprint"] == expected["fingerprint"] is not None
    for path, layer in expected["layers"].items():
        assert actual["layers"][path]["class_name"] == layer["class_name"]
        for kind in TENSOR_KINDS:
            assert actual["layers"][path][kind].keys() == layer[kind].keys(), (path, kind)
    # Verdicts read from rounding-noise gradients are each CPU's; every other verdict matches.
    noise = _noise_layers(tensorflow_profile, jax_profile)
    assert noise <= {"attention/query_dense", "attention/key_dense"}, noise
    assert [p for p in jax_profile.float16_unsafe_layers if p not in noise] == [
        p for p in tensorflow_profile.float16_unsafe_layers if p not in noise
    ]
    for prof in (tensorflow_profile, jax_profile):
        for path in noise & set(prof.float16_unsafe_layers):
            assert "gradients" in prof.float16_unsafe_reasons[path], (
                path,
                prof.float16_unsafe_reasons,
            )
    assert "attention" in jax_profile.float16_unsafe_layers  # its logits overflow float16
    assert jax_profile.suggested_loss_scale == tensorflow_profile.suggested_loss_scale

    def rows(prof: Profile) -> list[list[str]]:  # column widths follow the noise layers'
        lines = [line.split() for line in prof.summary().splitlines()[3:]]
        return [words for words in lines if not words or words[0] not in noise]

    def same(first: str, second: str) -> bool:  # printed figures: 3 digits, rounded either way
        try:
            return math.isclose(float(first), float(second), rel_tol=1e-2)
        except ValueError:
            return first == second

    jax_rows, tensorflow_rows = rows(jax_profile), rows(tensorflow_profile)
    assert [len(row) for row in jax_rows] == [len(row) for row in tensorflow_rows]
    for jax_row, tensorflow_row in zip(jax_rows, tensorflow_rows):
        assert all(map(same, jax_row, tensorflow_row)), (jax_row, tensorflow_row)


def test_jax_measurement_matches_numpy_on_special_values(recorded):
    measured = recorded["child"]["special"]
    assert measured.keys() == _SPECIAL_TENSORS.keys()
    for name, values in _SPECIAL_TENSORS.items():
        stats = TensorStats.from_dict(measured[name], name)
        assert_matches_reference(stats, values)


def test_two_devices_and_a_loss_scale_record_the_single_device_profile(recorded):
    assert recorded["child"]["devices"] == 2
    single, sharded = recorded["jax"], recorded["jax_data_parallel"]
    assert sharded.steps == single.steps
    # Loss-scaled gradients are recorded divided by the scale; the sharded batch is
    # measured whole (every count is the single device's).
    assert _differences(single, sharded) == []


def test_profiling_on_jax_leaves_the_model_as_it_was(recorded):
    child = recorded["child"]
    assert child["unchanged"]
    assert child["overrides_after_profile"] == [] and not child["train_function_probed"]


def test_tensorboard_output_without_tensorflow_says_how_to_get_it(recorded):
    message = recorded["child"]["tensorboard"]
    assert "TensorFlow cannot be imported" in message and "Profile.save(path)" in message


def test_profile_callback_and_probe_session_record_every_step_on_jax(recorded):
    callback, session = recorded["child"]["callback"], recorded["child"]["session"]
    # steps_per_execution=2: the callback sees every second step, each step is recorded.
    assert callback["steps"] == 4 and callback["count"] == 4 * 4 * 6 * 4
    assert callback["epochs"] == 2 and callback["overrides"] == []
    assert session["steps"] == 6 and session["count"] == 6 * 8 * 6 * 4
    assert session["tensors"] == 6  # output, its gradient, kernel, bias and their gradients


def test_profiling_beside_the_guard_telemetry_records_both_in_either_order(recorded):
    runs = recorded["child"]["with_guard"]
    for order, run in runs.items():
        assert run["profile_steps"] == _STEPS and not run["skipped"], order
        assert run["stats"]["activation"]["count"] == _STEPS * _BATCH * 8, order
    assert runs["guard_first"]["stats"] == runs["profiler_first"]["stats"]


def test_auto_precision_decides_from_a_profile_on_jax(recorded):
    auto = recorded["child"]["auto"]
    assert "autoprec: profiling the first 2 steps in float32" in auto["messages"], auto
    assert not any("no profile on this backend" in line for line in auto["messages"])
    assert auto["profile_steps"] == 2
    assert auto["profiled_layers"] == ["dense", "dense_1"]
    assert auto["plan"] and set(auto["plan"]) == {"dense", "dense_1"}
