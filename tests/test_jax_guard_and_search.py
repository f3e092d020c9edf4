"""The guard's replay of a failed step and the search on Keras' JAX backend (no TensorFlow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("jax")

CHILD = textwrap.dedent(
    """
    import json, sys
    sys.modules["tensorflow"] = None  # as on a machine with JAX and no TensorFlow
    import keras, numpy as np, autoprec

    results = {}

    # A skipped step replayed with amax probes on JAX, attribution from it.
    from autoprec.runtime import apply_plan
    from autoprec.runtime.guard import attribute_step
    from autoprec.runtime.telemetry import GuardTelemetry

    def overflow_model():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="first"),
                                  keras.layers.Dense(8, name="big"),
                                  keras.layers.Dense(1, name="out")])
        model.get_layer("out").trainable = False  # float32 training from here diverges
        model.compile(optimizer=keras.optimizers.SGD(1e-12), loss="mse")
        for name, value in (("first", 0.25), ("big", 100.0), ("out", 1e-6)):
            kernel, bias = model.get_layer(name).get_weights()
            model.get_layer(name).set_weights([np.full_like(kernel, value), bias])
        return model

    x = np.concatenate([np.ones((40, 4)), np.full((80, 4), 1000.0)]).astype("float32")
    y = np.zeros((120, 1), "float32")
    model = overflow_model()
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    handle = apply_plan(model, plan)
    model.optimizer = autoprec.FlooredLossScaleOptimizer(model.optimizer, initial_scale=1024.0)
    model.optimizer.build(model.trainable_variables)
    traces, step = [], model.train_step
    model.train_step = lambda *args: traces.append(1) or step(*args)
    telemetry = GuardTelemetry(model)
    telemetry.install()
    model.make_train_function(force=True)
    failed, traced = [], []

    class Watch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            record = telemetry.failed_step(handle.dtypes)  # the skipped step, replayed with amax probes
            if record is not None:
                failed.append((batch + 1, record))
                traced.append(len(traces))

    model.fit(x[:48], y[:48], batch_size=4, shuffle=False, verbose=0, callbacks=[Watch()])
    step, record = failed[0]
    attribution = attribute_step(record, handle.dtypes)
    results["telemetry"] = {
        "failed_steps": [index for index, _ in failed],
        "cause": attribution.cause,
        "attribution": list(attribution.layers),
        "scale": record.loss_scale,
        "first": [record.layers["first"].output, record.layers["first"].input],
        "big": record.layers["big"].output,
        "traced": traced,
    }

    # Guard: the callback replays failed steps on JAX too, so only the layer that
    # overflowed is promoted.
    model = overflow_model()
    plan = autoprec.PrecisionPlan.uniform(model, "float16").with_dtype("out", "float32")
    callback = autoprec.AutoPrecision(plan, verbose=0)
    history = model.fit(x, y, batch_size=4, epochs=2,
                        shuffle=False, verbose=0, callbacks=[callback])
    results["guard"] = {
        "events": [dict(e) for e in callback.plan.events],
        "dtypes": {l.name: l.compute_dtype for l in model.layers},
        "last_loss": float(history.history["loss"][-1]),
        "bfloat16_fast": autoprec.hardware.detect().is_fast("bfloat16"),
    }

    # Search: the numerical proxy is TensorFlow-only and is skipped, not failed.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    # Wide enough that 16-bit is predicted to pay on the card, so a 16-bit plan is confirmed.
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(2, activation="softmax")])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    result = autoprec.search(model, (x[:192], y[:192]), (x[192:], y[192:]),
                             budget=autoprec.Budget("val_accuracy", max_drop=0.5),
                             hardware="rtx4090", n_trials=4, verbose=0,
                             settings=autoprec.SearchSettings(cost_batch_size=4096,
                                                              steps_per_trial=3))
    results["search"] = {
        "states": [t.state.name for t in result.study.trials],
        "skipped": [t.user_attrs.get("proxy_skipped") for t in result.study.trials],
        "completed_16_bit": [
            sorted(set(t.params.values())) for t in result.study.trials
            if t.state.name == "COMPLETE" and set(t.params.values()) != {"float32"}
        ],
        "confirmation": result.plan.metadata["search"]["confirmation"],
    }
    # Measured here: the finalists' whole steps timed in interleaved rounds on JAX, bfloat16
    # asked for (so a 16-bit finalist is timed whatever this host's costs say of it).
    local = autoprec.search(model, (x[:192], y[:192]), (x[192:], y[192:]),
                            budget=autoprec.Budget("val_accuracy", max_drop=0.5),
                            hardware="local", n_trials=3, verbose=0,
                            settings=autoprec.SearchSettings(steps_per_trial=3,
                                                             dtypes=("float32", "bfloat16")))
    measurement = local.plan.metadata["search"].get("measurement") or {}
    results["local_search"] = {
        "verdict": measurement.get("verdict"),
        "timed": sorted(measurement.get("rounds_timed", {})),
        "leader": measurement.get("leader"),
        "confirmation": local.plan.metadata["search"]["confirmation"],
        "layers": sorted(set(local.plan.resolve().values())),
    }
    print("RESULT " + json.dumps(results))
    """
)


def test_guard_and_search_on_jax(tmp_path):
    environment = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent), environment.get("PYTHONPATH", "")]
    )
    completed = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300,
        env=environment, cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = next(x for x in completed.stdout.splitlines() if x.startswith("RESULT "))
    results = json.loads(line[len("RESULT ") :])

    telemetry = results["telemetry"]
    assert telemetry["failed_steps"] == [11, 12]  # the batches of large inputs, each skipped
    assert telemetry["cause"] == "forward" and telemetry["attribution"] == ["big"]
    assert telemetry["scale"] == 1024.0  # the failed step's own scale, not the halved one
    output, inputs = telemetry["first"]
    assert inputs == 1000.0 and 1000.0 <= output < 65504
    assert telemetry["big"] == float("inf")
    assert len(set(telemetry["traced"])) == 1  # the second replay runs the first one's trace

    guard = results["guard"]
    promoted = {e["layer"] for e in guard["events"] if e["kind"] == "promotion"}
    assert promoted == {"big"}, guard["events"]  # attributed per layer on JAX too
    assert guard["dtypes"]["first"] == "float16"
    # Promoted one step up the ladder this host runs fast: bfloat16, or float32 where it is slow.
    assert guard["dtypes"]["big"] == ("bfloat16" if guard["bfloat16_fast"] else "float32")
    assert guard["last_loss"] == guard["last_loss"]  # finite, not NaN

    search = results["search"]
    assert "FAIL" not in search["states"]
    assert any(search["skipped"])
    assert search["completed_16_bit"]  # 16-bit plans are trained and judged, not failed
    # The longer confirmation of a plan chosen at this low fidelity ran on JAX too.
    assert search["confirmation"]["run"] is True, search["confirmation"]
    assert search["confirmation"]["result"] in ("held", "fell back", "fell back to float32"), (
        search["confirmation"]
    )

    local = results["local_search"]
    # Every finalist was timed in interleaved rounds, float32 among them, and a verdict given.
    assert "float32" in local["timed"] and len(local["timed"]) >= 2, local
    assert local["verdict"] in ("separated", "tie") and local["leader"] in local["timed"]
    assert "run" in local["confirmation"]
