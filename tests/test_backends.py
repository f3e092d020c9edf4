"""autoprec on Keras' JAX backend: plans, `apply_plan`, `AutoPrecision`, loss scaling, saving, costs.

Keras fixes its backend when it is first imported, and this test process runs
TensorFlow, so every JAX check runs in one child process started with
`KERAS_BACKEND=jax` and with TensorFlow made unimportable, as on a GPU machine
that has JAX but no TensorFlow. The child runs this same file (`--child`), writes
one JSON value per check, and the tests below assert on those values. A check
that raised is reported with its traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import pytest

_TESTS_DIR = Path(__file__).resolve().parent
_CHILD_TIMEOUT_SECONDS = 300

#: Steps of persistent overflow: more than the ~164 halvings that take Keras'
#: floorless scale from 2**15 to 0.0, after which it writes NaN into the weights.
_OVERFLOW_STEPS = 180


# ---------------------------------------------------------------------------- child side
# Everything below up to "parent side" runs in the JAX child process only.


def _child_mlp():
    from conftest import build_mlp

    model = build_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def _check_environment() -> dict:
    import jax
    import keras

    import autoprec

    return {
        "backend": keras.backend.backend(),
        "jax": jax.__version__,
        "keras": keras.__version__,
        "autoprec": autoprec.__version__,
        # The child blocks TensorFlow with a `None` entry; a real module there means it was imported.
        "tensorflow_imported": sys.modules.get("tensorflow") is not None,
    }


def _output_dtypes(model, sample) -> dict[str, str]:
    """Runs `sample` through every top-level layer of a Functional model; returns output dtypes."""
    import keras

    from autoprec.layers import layer_paths

    paths = {id(layer): path for path, layer in layer_paths(model).items()}
    probed = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    probe = keras.Model(model.inputs, [layer.output for layer in probed])
    outputs = probe(sample)
    return {paths[id(layer)]: str(output.dtype) for layer, output in zip(probed, outputs)}


def _check_uniform_plans() -> dict:
    import numpy as np

    import autoprec

    results = {}
    for dtype in ("float16", "bfloat16"):
        model = _child_mlp()
        plan = autoprec.PrecisionPlan.uniform(model, dtype).with_dtype("dense_2", "float32")
        handle = autoprec.apply_plan(model, plan)
        sample = np.ones((4, 8), "float32")
        results[dtype] = {
            "applied": handle.dtypes,
            "outputs": _output_dtypes(model, sample),
            "variable_dtypes": sorted({str(v.dtype) for v in model.weights}),
        }
    return results


def _check_callback_float16() -> dict:
    import numpy as np
    from conftest import classification_data

    import autoprec

    model = _child_mlp()
    x, y = classification_data()
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("dense_2", "float32")
    history = model.fit(
        x, y, epochs=2, batch_size=32, verbose=0, callbacks=[autoprec.AutoPrecision(plan)]
    )
    return {
        "optimizer": type(model.optimizer).__name__,
        "loss": [float(value) for value in history.history["loss"]],
        "loss_scale": history.history.get("loss_scale"),
        "weights_finite": all(bool(np.isfinite(w).all()) for w in model.get_weights()),
    }


def _check_race() -> dict:
    """The one-liner's race inside a JAX fit: with bfloat16 only, then with float16 too."""
    import dataclasses

    import numpy as np
    from conftest import classification_data, local_with_fast_bfloat16

    import autoprec

    x, y = (np.concatenate([part] * 8) for part in classification_data())  # room to race
    results = {}
    fast = local_with_fast_bfloat16()
    both = dataclasses.replace(fast, fast_dtypes=("bfloat16", "float16"), slow_dtypes=())
    for name, hardware in (("bfloat16", fast), ("float16", both)):
        model = _child_mlp()
        callback = autoprec.AutoPrecision(
            hardware=hardware, auto=autoprec.AutoPlan(decision_seconds=120.0), verbose=0
        )
        history = model.fit(x, y, epochs=2, batch_size=16, verbose=0, callbacks=[callback])
        measured = callback.plan.metadata["measured"]
        results[name] = {
            "timed": list(measured.get("rounds_ms", {})),
            "traces": measured.get("traces"),
            "winner": measured.get("winner"),
            "dtypes": sorted(set(callback.handle.dtypes.values())),
            "loss": [float(value) for value in history.history["loss"]],
            "weights_finite": all(bool(np.isfinite(w).all()) for w in model.get_weights()),
        }
    return results


def _train_on_overflow(floor: float | None) -> dict:
    """Trains a float16 regressor through a long overflow, then on normal data, one sample a step.

    The first `_OVERFLOW_STEPS` inputs are 1e4, which overflow float16 in the forward
    pass at any loss scale; the last 10 are 0.01. A floorless scale reaches 0.0 during
    the overflow, and the first normal step then unscales zero gradients by zero.
    """
    import keras
    import numpy as np

    import autoprec

    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(
        16, activation="relu", kernel_initializer="ones", dtype="mixed_float16"
    )(inputs)
    outputs = keras.layers.Dense(1, dtype="mixed_float16")(hidden)
    model = keras.Model(inputs, outputs)
    optimizer = autoprec.FlooredLossScaleOptimizer(keras.optimizers.Adam(), floor=floor)
    model.compile(optimizer=optimizer, loss="mse")
    x = np.concatenate([np.full((_OVERFLOW_STEPS, 8), 1e4), np.full((10, 8), 0.01)])
    y = np.zeros((len(x), 1), "float32")
    model.fit(x.astype("float32"), y, epochs=1, batch_size=1, shuffle=False, verbose=0)
    return {
        "loss_scale": autoprec.runtime.current_loss_scale(model.optimizer),
        "non_finite_steps": int(np.asarray(model.optimizer.non_finite_steps.value)),
        "consecutive_non_finite_steps": int(
            np.asarray(model.optimizer.consecutive_non_finite_steps.value)
        ),
        "weights_finite": all(bool(np.isfinite(w).all()) for w in model.get_weights()),
    }


def _check_loss_scale_floor() -> dict:
    return {"floor_1": _train_on_overflow(1.0), "no_floor": _train_on_overflow(None)}


def _attention_plan(model):
    """float16 everywhere except the attention block (bfloat16) and the softmax head (float32).

    JAX's XLA CPU compiler has no float16 x float16 -> float32 dot, which Keras' fused
    attention uses for its logits, so a float16 attention block cannot train here
    (it can on a GPU); bfloat16 can.
    """
    import autoprec

    plan = autoprec.PrecisionPlan.uniform(model, "float16")
    return plan.with_dtype("attention", "bfloat16").with_dtype("dense", "float32")


def _check_save_load(work_dir: str) -> dict:
    import keras
    import numpy as np
    from conftest import build_attention_model

    import autoprec
    from autoprec.layers import layer_paths

    model = build_attention_model()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8, 8)).astype("float32")
    y = rng.integers(0, 2, size=(32,)).astype("int32")
    model.fit(
        x, y, epochs=1, batch_size=8, verbose=0,
        callbacks=[autoprec.AutoPrecision(_attention_plan(model), verbose=0)],
    )  # fmt: skip
    predictions = model.predict(x, verbose=0)
    path = autoprec.save_model(model, os.path.join(work_dir, "attention.keras"))
    restored = autoprec.load_model(path)
    before = {p: layer.compute_dtype for p, layer in layer_paths(model).items()}
    after = {p: layer.compute_dtype for p, layer in layer_paths(restored).items()}
    restored_predictions = restored.predict(x, verbose=0)
    restored_history = restored.fit(x, y, epochs=1, batch_size=8, verbose=0)
    return {
        "dtypes_before": before,
        "dtypes_after": after,
        "optimizer_before": type(model.optimizer).__name__,
        "optimizer_after": type(restored.optimizer).__name__,
        "loss_scale_before": autoprec.runtime.current_loss_scale(model.optimizer),
        "loss_scale_after": autoprec.runtime.current_loss_scale(restored.optimizer),
        "predictions_equal": bool(np.allclose(predictions, restored_predictions)),
        "retrained_loss_finite": bool(np.isfinite(restored_history.history["loss"]).all()),
        "keras_backend": keras.backend.backend(),
    }


def _check_plan_from_tensorflow(plan_path: str) -> dict:
    from conftest import build_attention_model

    import autoprec
    from autoprec.layers import layer_paths

    model = build_attention_model()
    plan = autoprec.PrecisionPlan.load(plan_path)
    handle = autoprec.apply_plan(model, plan)
    return {
        "paths": list(layer_paths(model)),
        "applied": handle.dtypes,
        "compute_dtypes": {p: layer.compute_dtype for p, layer in layer_paths(model).items()},
    }


def _check_profiler_runs() -> dict:
    import numpy as np

    import autoprec

    model = _child_mlp()
    data = (np.ones((8, 8), "float32"), np.zeros((8,), "int32"))
    try:
        profile = autoprec.profile(model, data, steps=1)
    except Exception as error:  # noqa: BLE001 - reported to the parent as a failure
        return {"raised": type(error).__name__, "message": str(error)}
    return {"raised": None, "layers": sorted(profile.layers)}


def _check_cost_and_search() -> dict:
    """Cost prediction, the heuristic plan and a two-trial search on JAX."""
    from conftest import build_mlp, classification_data

    import autoprec

    model = build_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    x, y = classification_data()
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    table = autoprec.predict_costs(model, autoprec.hardware.get("rtx4090"), batch_size=32)
    estimate = autoprec.estimate(model, plan, costs=table, batch_size=32)
    heuristic = autoprec.heuristic_plan(model, hardware="rtx4090")
    result = autoprec.search(
        model,
        (x, y),
        (x, y),
        budget=autoprec.Budget("val_accuracy", max_drop=0.5),
        hardware="rtx4090",
        n_trials=2,
        settings=autoprec.SearchSettings(
            seed=0,
        ),
    )  # fmt: skip
    return {
        "estimated_step_seconds": float(estimate.step_seconds),
        "heuristic_counts": heuristic.dtype_counts(),
        "search_plan_layers": len(result.plan.layers),
    }


def _check_calibrate(work_dir: str) -> dict:
    """`calibrate` on JAX: measured per-layer costs, whole steps, cache reuse, estimate, plan."""
    import numpy as np
    from conftest import build_cnn, build_mlp, classification_data

    import autoprec

    cache_dir = os.path.join(work_dir, "costs")
    settings = dict(
        dtypes=("float32", "bfloat16"), repeats=2, cache_dir=cache_dir, verbose=0,
        hardware="cpu-avx512-bf16",
    )  # fmt: skip
    model = build_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    x, y = classification_data()
    first = autoprec.calibrate(model, (x[:16], y[:16]), **settings)
    second = autoprec.calibrate(model, (x[:16], y[:16]), **settings)
    estimate = autoprec.estimate(model, "float32", costs=first)
    plan = autoprec.heuristic_plan(model, costs=first, hardware="cpu-avx512-bf16")
    cnn = build_cnn()
    images = np.random.default_rng(0).normal(size=(8, 12, 12, 1)).astype("float32")
    # float32 only: each layer and dtype costs a compilation, and the MLP covers bfloat16.
    cnn_table = autoprec.calibrate(
        cnn, images, measure_model_step=False, **dict(settings, dtypes=("float32",))
    )
    return {
        "source": first.source,
        "versions": first.versions,
        "first_stats": first.stats,
        "second_stats": second.stats,
        "layer_sources": {path: record.source for path, record in first.layers.items()},
        "seconds": {path: record.seconds for path, record in first.layers.items()},
        "second_seconds": {path: record.seconds for path, record in second.layers.items()},
        "measured_steps": first.measured_step_seconds_by_dtype,
        "float32_estimate": estimate.float32_step_seconds,
        "estimate_source": estimate.source,
        "plan_layers": len(plan.layers),
        "cnn_stats": cnn_table.stats,
        "cnn_seconds": {path: record.seconds for path, record in cnn_table.layers.items()},
        "cast_seconds": first.cast_seconds,
        "tensorflow_imported": sys.modules.get("tensorflow") is not None,
    }


def _run_child(results_path: str, plan_path: str, work_dir: str) -> None:
    # As on a GPU machine without TensorFlow: any import of it fails.
    sys.modules["tensorflow"] = None  # type: ignore[assignment]
    sys.path.insert(0, str(_TESTS_DIR))
    import keras

    checks = {
        "environment": _check_environment,
        "uniform_plans": _check_uniform_plans,
        "callback_float16": _check_callback_float16,
        "race": _check_race,
        "loss_scale_floor": _check_loss_scale_floor,
        "save_load": lambda: _check_save_load(work_dir),
        "plan_from_tensorflow": lambda: _check_plan_from_tensorflow(plan_path),
        "profiler_runs": _check_profiler_runs,
        "cost_and_search": _check_cost_and_search,
        "calibrate": lambda: _check_calibrate(work_dir),
    }
    results = {}
    for name, check in checks.items():
        keras.backend.clear_session()
        keras.config.set_dtype_policy("float32")
        keras.utils.set_random_seed(0)
        started = time.perf_counter()
        try:
            results[name] = {"ok": True, "value": check()}
        except Exception:  # noqa: BLE001 - every failure goes back to the parent
            results[name] = {"ok": False, "traceback": traceback.format_exc()}
        results[name]["seconds"] = round(time.perf_counter() - started, 2)
    Path(results_path).write_text(json.dumps(results, indent=1, default=str))


# ---------------------------------------------------------------------------- parent side


@pytest.fixture(scope="module")
def tensorflow_side(tmp_path_factory):
    """The attention model's layer paths and a mixed plan for it, made under TensorFlow."""
    import keras
    from conftest import build_attention_model

    import autoprec
    from autoprec.layers import layer_paths

    assert keras.backend.backend() == "tensorflow"
    keras.backend.clear_session()
    model = build_attention_model()
    plan = (
        autoprec.PrecisionPlan.uniform(model, "bfloat16")
        .with_dtype("attention/query_dense", "float16")
        .with_dtype("attention/softmax", "float32")
        .with_dtype("dense", "float32")
    )
    plan_path = tmp_path_factory.mktemp("tf") / "plan.json"
    plan.save(plan_path)
    return {"paths": list(layer_paths(model)), "plan": plan, "plan_path": str(plan_path)}


@pytest.fixture(scope="module")
def jax_results(tensorflow_side, tmp_path_factory):
    """Runs every JAX check once in a child process and returns `{check: value}`."""
    pytest.importorskip("jax", reason="jax is not installed: pip install 'jax[cpu]'")
    work_dir = tmp_path_factory.mktemp("jax")
    results_path = work_dir / "results.json"
    env = dict(os.environ, KERAS_BACKEND="jax", TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
    completed = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            str(results_path),
            tensorflow_side["plan_path"],
            str(work_dir),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=_CHILD_TIMEOUT_SECONDS,
    )
    assert completed.returncode == 0 and results_path.exists(), (
        f"JAX child failed (rc={completed.returncode}):\n{completed.stderr[-4000:]}"
    )
    return json.loads(results_path.read_text())


def _value(jax_results: dict, check: str):
    result = jax_results[check]
    if not result["ok"]:
        pytest.fail(f"JAX check {check!r} raised:\n{result['traceback']}")
    return result["value"]


def test_autoprec_imports_on_jax_without_tensorflow(jax_results):
    environment = _value(jax_results, "environment")
    assert environment["backend"] == "jax"
    assert environment["tensorflow_imported"] is False


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_uniform_plan_sets_outputs_to_the_compute_dtype_and_keeps_float32_variables(
    jax_results, dtype
):
    result = _value(jax_results, "uniform_plans")[dtype]
    assert result["applied"]["dense"] == dtype
    assert result["outputs"]["dense"] == dtype
    assert result["outputs"]["dense_1"] == dtype
    assert result["outputs"]["dense_2"] == "float32"
    assert result["variable_dtypes"] == ["float32"]


def test_float16_plan_wraps_optimizer_and_trains_finitely_on_jax(jax_results):
    result = _value(jax_results, "callback_float16")
    assert result["optimizer"] == "FlooredLossScaleOptimizer"
    assert result["loss_scale"] == [2.0**15, 2.0**15]
    assert all(value == value and abs(value) < 1e6 for value in result["loss"])
    assert result["weights_finite"]


def test_the_one_liner_races_its_candidates_inside_a_jax_fit(jax_results):
    results = _value(jax_results, "race")
    # float32 runs the step fit traced; with loss scaling added for float16 it is traced again.
    assert results["bfloat16"]["timed"][:2] == ["float32", "mixed_bfloat16"]
    assert results["bfloat16"]["traces"] == len(results["bfloat16"]["timed"]) - 1
    assert "mixed_float16" in results["float16"]["timed"]
    assert results["float16"]["traces"] == len(results["float16"]["timed"])
    for result in results.values():
        assert result["winner"] in result["timed"]
        assert result["weights_finite"] and all(np.isfinite(result["loss"]))


def test_loss_scale_floor_holds_under_persistent_overflow_on_jax(jax_results):
    result = _value(jax_results, "loss_scale_floor")
    floored = result["floor_1"]
    assert floored["loss_scale"] == 1.0
    assert floored["non_finite_steps"] == _OVERFLOW_STEPS
    assert floored["consecutive_non_finite_steps"] == 0
    assert floored["weights_finite"]
    # Without the floor the stateless path behaves as Keras' own: the scale reaches
    # 0.0 and the first finite step writes NaN into the weights.
    assert result["no_floor"]["loss_scale"] == 0.0
    assert not result["no_floor"]["weights_finite"]


def test_save_and_load_keep_nested_dtypes_and_loss_scaling_on_jax(jax_results):
    result = _value(jax_results, "save_load")
    assert result["dtypes_after"] == result["dtypes_before"]
    assert result["dtypes_after"]["attention/query_dense"] == "bfloat16"
    assert result["dtypes_after"]["add"] == "float16"
    assert result["optimizer_after"] == "FlooredLossScaleOptimizer"
    assert result["loss_scale_after"] == result["loss_scale_before"]
    assert result["predictions_equal"]
    assert result["retrained_loss_finite"]


def test_plan_written_under_tensorflow_applies_under_jax(jax_results, tensorflow_side):
    result = _value(jax_results, "plan_from_tensorflow")
    assert result["paths"] == tensorflow_side["paths"]
    plan = tensorflow_side["plan"]
    assert result["applied"] == plan.resolve()
    assert result["compute_dtypes"]["attention/query_dense"] == "float16"
    assert result["compute_dtypes"]["attention/key_dense"] == "bfloat16"
    assert result["compute_dtypes"]["attention/softmax"] == "float32"


def test_profiler_runs_on_jax(jax_results):
    result = _value(jax_results, "profiler_runs")
    assert result.get("raised") is None, result
    assert result["layers"]  # every computing layer recorded: tests/profiler/test_jax_profile.py


def test_cost_prediction_and_search_run_on_jax(jax_results):
    result = _value(jax_results, "cost_and_search")
    assert result["estimated_step_seconds"] > 0
    assert sum(result["heuristic_counts"].values()) > 0
    assert result["search_plan_layers"] > 0


def test_calibrate_measures_on_jax_without_tensorflow_and_reuses_its_cache(jax_results):
    result = _value(jax_results, "calibrate")
    assert result["source"] == "measured"
    assert result["versions"]["backend"] == "jax" and "jax" in result["versions"]
    assert "tensorflow" not in result["versions"] and not result["tensorflow_imported"]
    first, second = result["first_stats"], result["second_stats"]
    # dense, dense_1, dense_2 (dropout too) timed in two dtypes; nothing fell back.
    assert first["timed"] >= 6 and first["cached"] == 0 and first["fallback"] == 0
    for path in ("dense", "dense_1", "dense_2"):
        assert result["layer_sources"][path] == "measured"
        assert all(result["seconds"][path][dtype] > 0 for dtype in ("float32", "bfloat16"))
    # On a CPU profile with fast bfloat16, the float32 and bfloat16 whole steps are timed.
    assert set(result["measured_steps"]) == {"float32", "bfloat16"}
    assert first["model_step"] == 2 and first["model_steps_timed"] == 2
    assert result["float32_estimate"] == pytest.approx(result["measured_steps"]["float32"])
    assert result["estimate_source"] == "measured" and result["plan_layers"] > 0
    # The second call measures nothing: every figure comes from the cache.
    assert second["timed"] == 0 and second["model_steps_timed"] == 0
    assert second["cached"] == first["timed"] and second["model_step"] == 2
    assert result["second_seconds"] == result["seconds"]
    # Convolution, BatchNormalization (moving statistics) and pooling are timed too.
    cnn = result["cnn_stats"]
    assert cnn["fallback"] == 0 and cnn["timed"] > 0
    for path in ("conv2d", "batch_normalization", "max_pooling2d", "dense"):
        assert result["cnn_seconds"][path]["float32"] > 0, path
    assert result["cast_seconds"]["bfloat16"]["per_element"] >= 0


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--child":
    _run_child(sys.argv[2], sys.argv[3], sys.argv[4])
