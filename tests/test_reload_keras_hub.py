"""A keras-hub model trained under a plan reloads exactly through `keras.models.load_model`.

Each family trains two steps under a three-dtype plan and is saved by a
`ModelCheckpoint`, then reloaded in fresh processes: one with autoprec imported
(`keras.models.load_model`, then `autoprec.load_model`), one with Keras and keras-hub
only (`compile=False`). Every layer's dtype, the loss scale and bitwise-equal
predictions must come back through every door: autoprec adds no cast Keras does not
rebuild, and where a plan's dtypes meet in a layer's own arithmetic the check gives
that layer one dtype before `fit` steps. A random plan (sub-layers of one block in
three dtypes) does the same.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import zoo_models

import autoprec
from autoprec.layers import describe_model

DTYPES = ("float32", "bfloat16", "float16")
TESTS = Path(__file__).resolve().parent

#: Families checked in every CI run; the others are `slow`.
IN_CI = ("gemma", "dinov2", "rwkv7")

#: Run in a fresh process: loads the file through each door named, writes what it found.
CHILD = r"""
import json, sys
import numpy as np
import keras
path, batch_path, found_path, *doors = sys.argv[1:]
if doors == ["keras_only"]:
    import keras_hub  # noqa: F401  (registers keras-hub's classes, as a user's script does)
else:
    import autoprec
batch = dict(np.load(batch_path))
batch = batch["x"] if list(batch) == ["x"] else batch
found = {"autoprec_imported": "autoprec" in sys.modules}
for door in doors:
    if door == "keras_only":
        model = keras.models.load_model(path, compile=False)
    else:
        model = (keras.models.load_model if door == "keras" else autoprec.load_model)(path)
    optimizer = getattr(model, "optimizer", None)
    scale = getattr(optimizer, "loss_scale_factor", None) if optimizer is not None else None
    result = {"loss_scale": None if scale is None else float(keras.ops.convert_to_numpy(scale))}
    try:
        predictions = keras.ops.convert_to_numpy(model.predict(batch, verbose=0))
        np.save(f"{found_path}.{door}.npy", predictions)
        result["predicted"] = True
    except Exception as error:
        result["predicted"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    from test_reload_keras_hub import own_dtypes  # after the load: Keras alone loaded it
    found[door] = {**result, "dtypes": own_dtypes(model)}
json.dump(found, open(found_path, "w"))
"""


def keras_runnable_plan(model: keras.Model) -> autoprec.PrecisionPlan:
    """Blocks in bfloat16; the backbone's and task's own weighted layers in float32 and float16.

    Those layers are nodes of a functional graph, where Keras casts every input, so
    plain Keras runs the plan as autoprec does.
    """
    plan = autoprec.PrecisionPlan.uniform(model, "bfloat16")
    paths = autoprec.layers.layer_paths(model)
    infos = describe_model(model)
    leaves = [
        path
        for path, layer in paths.items()
        if path.count("/") <= 1
        and layer.weights
        and infos[path].follows is None
        and not any(other.startswith(path + "/") for other in paths)
    ]
    for index, path in enumerate(leaves):
        plan = plan.with_dtype(path, ("float32", "float16")[index % 2])
    return plan


def random_plan(model: keras.Model) -> autoprec.PrecisionPlan:
    """Every layer a random dtype, sub-layers of one block included."""
    rng = np.random.default_rng(7)
    plan = autoprec.PrecisionPlan.uniform(model, "float32")
    for path, info in describe_model(model).items():
        if info.follows is None:
            plan = plan.with_dtype(path, str(rng.choice(DTYPES)))
    return plan


def own_dtypes(model: keras.Model) -> dict[str, str]:
    """Each layer's dtype by its autoprec path, which a reload that renames layers keeps."""
    return {
        path: autoprec.layers.layer_policy(layer).name
        for path, layer in autoprec.layers.layer_paths(model).items()
        if layer.path
    }


def load_in_fresh_process(saved: Path, batch_file: Path, *doors: str) -> dict:
    found_path = saved.with_suffix(f".{doors[0]}.json")
    environment = {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONPATH": f"{TESTS.parent}:{TESTS}",
    }
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, str(saved), str(batch_file), str(found_path), *doors],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
        cwd=saved.parent,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    found = json.loads(found_path.read_text())
    for door in doors:
        if found[door]["predicted"] is True:
            found[door]["predictions"] = np.load(f"{found_path}.{door}.npy")
    return found


def train_and_save(name: str, make_plan, directory: Path) -> dict:
    model, (x, y) = zoo_models.RELOAD_ZOO[name]()
    batch = {key: value[:4] for key, value in x.items()} if isinstance(x, dict) else x[:4]
    model(batch)
    saved = directory / f"{name}.keras"
    model.fit(
        x,
        y,
        epochs=1,
        batch_size=16,
        steps_per_epoch=2,
        verbose=0,
        callbacks=[
            autoprec.AutoPrecision(make_plan(model)),
            keras.callbacks.ModelCheckpoint(saved),
        ],
    )
    batch_file = directory / "batch.npz"
    np.savez(batch_file, **(batch if isinstance(batch, dict) else {"x": batch}))
    scale = getattr(model.optimizer, "loss_scale_factor", None)
    return {
        "name": name,
        "saved": saved,
        "batch_file": batch_file,
        "dtypes": own_dtypes(model),
        "predictions": keras.ops.convert_to_numpy(model.predict(batch, verbose=0)),
        "loss_scale": None if scale is None else float(keras.ops.convert_to_numpy(scale)),
    }


FAMILIES = [
    name if name in IN_CI else pytest.param(name, marks=pytest.mark.slow)
    for name in sorted(zoo_models.RELOAD_ZOO)
]


@pytest.fixture(scope="module", params=FAMILIES)
def trained(request, tmp_path_factory):
    return train_and_save(request.param, keras_runnable_plan, tmp_path_factory.mktemp("run"))


def assert_same(trained: dict, found: dict, door: str) -> None:
    wrong = {
        path: (dtype, found["dtypes"].get(path))
        for path, dtype in trained["dtypes"].items()
        if found["dtypes"].get(path) != dtype
    }
    assert not wrong, f"{trained['name']} ({door}): {len(wrong)} layer(s) in another dtype: {wrong}"
    assert found["predicted"] is True, f"{trained['name']} ({door}): {found['predicted']}"
    assert np.array_equal(found["predictions"], trained["predictions"]), (trained["name"], door)


def test_every_door_reloads_every_layer_s_dtype_and_predicts_bitwise(trained):
    assert len(set(trained["dtypes"].values())) >= 2
    # One door a process, as a user loads: a layer keras-hub names itself
    # (`mixtral_sparse_moe_block`) is named `..._1` by a second load in one process.
    found = {
        door: load_in_fresh_process(trained["saved"], trained["batch_file"], door)
        for door in ("keras", "autoprec")
    }
    assert all(found[door]["autoprec_imported"] for door in found)
    assert_same(trained, found["autoprec"]["autoprec"], "autoprec")
    assert_same(trained, found["keras"]["keras"], "keras")
    for door in ("keras", "autoprec"):
        assert found[door][door]["loss_scale"] == trained["loss_scale"], door
    alone = load_in_fresh_process(trained["saved"], trained["batch_file"], "keras_only")
    assert not alone["autoprec_imported"]
    assert_same(trained, alone["keras_only"], "keras_only")


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("gpt2", marks=pytest.mark.slow),
        pytest.param("bart", marks=pytest.mark.slow),
        pytest.param("gemma", marks=pytest.mark.slow),
        # A block with no `build` of its own that Keras builds by tracing it at load.
        "swin",
    ],
)
def test_a_random_plan_trains_as_keras_runs_it_and_reloads_bitwise_through_both_doors(
    name, tmp_path
):
    trained = train_and_save(name, random_plan, tmp_path)
    assert set(trained["dtypes"].values()) == {"float32", "mixed_bfloat16", "mixed_float16"}
    by_keras = load_in_fresh_process(trained["saved"], trained["batch_file"], "keras")["keras"]
    by_autoprec = load_in_fresh_process(trained["saved"], trained["batch_file"], "autoprec")
    assert_same(trained, by_autoprec["autoprec"], "autoprec")
    assert by_autoprec["autoprec"]["loss_scale"] == trained["loss_scale"]
    assert_same(trained, by_keras, "keras")


def test_keras_uniform_policy_on_a_graph_with_constants_reloads_bitwise(tmp_path):
    # Gemma's graph scales its embeddings by a constant made in their dtype: under a
    # uniform bfloat16 plan it is made again in bfloat16, as a reload makes it.
    trained = train_and_save(
        "gemma", lambda model: autoprec.PrecisionPlan.uniform(model, "bfloat16"), tmp_path
    )
    found = load_in_fresh_process(trained["saved"], trained["batch_file"], "keras")["keras"]
    assert found["dtypes"] == trained["dtypes"]
    assert found["predicted"] is True, found["predicted"]
    assert found["predictions"].tobytes() == trained["predictions"].tobytes()
