"""float8 on Keras' JAX backend: the callback, the optimizer rebuilt inside fit, the guard, saving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

CHILD = textwrap.dedent(
    """
    import json, sys
    sys.modules["tensorflow"] = None  # as on a machine with JAX and no TensorFlow
    import keras, numpy as np, autoprec
    from autoprec.layers import layer_paths, layer_policy
    from test_float8 import build_encoder, encoder_data, float8_plan

    results = {}
    model = build_encoder()
    model.compile("adam", "sparse_categorical_crossentropy")
    x, y = encoder_data(samples=96)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    iterations = int(model.optimizer.iterations.numpy())
    callback = autoprec.AutoPrecision(float8_plan(model), verbose=0)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    embed = model.get_layer("embed")
    results["fit"] = {
        "iterations": int(model.optimizer.iterations.numpy()) - iterations,
        "mode": embed.quantization_mode,
        "scale": float(keras.ops.convert_to_numpy(embed.inputs_scale)),
        "finite": bool(all(np.isfinite(w).all() for w in model.get_weights())),
    }
    function = model.train_function
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[callback])
    results["retraced"] = model.train_function is not function
    model.save("float8.keras")
    loaded = keras.models.load_model("float8.keras")
    query = layer_paths(loaded)["attention/query_dense"]
    results["loaded"] = {
        "policy": layer_policy(query).name,
        "same": bool(np.allclose(loaded.predict(x[:8], verbose=0), model.predict(x[:8], verbose=0), atol=1e-5)),
    }

    model = build_encoder()
    model.compile("adam", "sparse_categorical_crossentropy")
    growth = np.repeat(8.0 ** np.arange(6), 16).astype("float32")[:, None, None]
    guard = autoprec.Guard(float8_check_every=1)
    callback = autoprec.AutoPrecision(float8_plan(model), guard=guard, verbose=0)
    model.fit(x * growth, y, batch_size=16, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    results["guard"] = [dict(e) for e in callback.plan.events]

    # A race inside fit between bfloat16 and float8: one optimizer, each candidate's own scales.
    from autoprec.decision.race import StepRace

    class Racing(keras.callbacks.Callback):
        def __init__(self, race):
            super().__init__()
            self.race = race

        def on_train_batch_begin(self, batch, logs=None):
            if not self.race.finished:
                self.race.begin_step()

        def on_train_batch_end(self, batch, logs=None):
            if not self.race.finished and self.race.end_step():
                self.race.close()

    model = build_encoder()
    model.compile("adam", "sparse_categorical_crossentropy")
    model.fit(x[:16], y[:16], epochs=1, verbose=0)
    candidates = {
        "mixed_bfloat16": autoprec.PrecisionPlan.uniform(model, "bfloat16"),
        "float8": float8_plan(model),
    }
    race = StepRace(model, candidates, rounds=2, steps_per_round=2, max_rounds=2)
    big_x, big_y = encoder_data(samples=16 * 24)
    model.fit(big_x, big_y, batch_size=16, epochs=1, verbose=0, callbacks=[Racing(race)])
    result = race.result()
    finite = bool(all(np.isfinite(w).all() for w in model.get_weights()))
    # Out of float8, JAX overwrites the scales with their zero gradient; going back restarts them.
    lost = float(keras.ops.convert_to_numpy(model.get_layer("embed").inputs_scale))
    history = model.fit(x, y, batch_size=16, epochs=1, verbose=0,
                        callbacks=[autoprec.AutoPrecision(float8_plan(model), verbose=0)])
    results["race"] = {
        "rounds": {name: len(values) for name, values in result.rounds.items()},
        "finite": finite,
        "lost": lost,
        "scale": float(keras.ops.convert_to_numpy(model.get_layer("embed").inputs_scale)),
        "loss": float(history.history["loss"][-1]),
    }
    print("RESULT " + json.dumps(results))
    """
)


def test_float8_trains_saves_and_is_guarded_on_jax(tmp_path):
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
    fit = results["fit"]
    assert fit["iterations"] == 6 and fit["mode"] == "float8" and fit["finite"]
    assert fit["scale"] != 1.0
    assert results["retraced"] is False
    assert results["loaded"] == {"policy": "float8_from_mixed_bfloat16", "same": True}
    promotions = [e for e in results["guard"] if e.get("trigger") == "float8_saturation"]
    assert promotions and promotions[0]["from"] == "float8"
    race = results["race"]
    assert race["rounds"] == {"mixed_bfloat16": 2, "float8": 2} and race["finite"]
    assert race["lost"] == 0.0 and race["scale"] > 0.0 and np.isfinite(race["loss"])
