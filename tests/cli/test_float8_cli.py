"""The command line on float8 plans: `show` totals, `diff` lines, `export` to a reloadable model, refusals."""

from __future__ import annotations

import json
import re
from pathlib import Path

import keras
import pytest
from cli.cli_files import run_cli

from autoprec import PrecisionPlan
from autoprec.cli import EXIT_BAD_INPUT, EXIT_OK, main
from autoprec.layers import layer_paths, layer_policy
from autoprec.runtime.float8 import float8_variables

#: The float8 layers of `build_attention_block` in a uniform float8 plan with a bfloat16 head.
FLOAT8_LAYERS = (
    "attention/query_dense",
    "attention/key_dense",
    "attention/value_dense",
    "attention/output_dense",
    "ffn",
)

FLOAT8_POLICY = "float8_from_mixed_bfloat16"


def build_attention_block() -> keras.Model:
    """MultiHeadAttention (four EinsumDense sub-layers), a LayerNormalization, a Dense, a head."""
    inputs = keras.Input((8, 16))
    attended = keras.layers.MultiHeadAttention(2, 8, name="attention")(inputs, inputs)
    hidden = keras.layers.LayerNormalization(name="norm")(keras.layers.Add()([inputs, attended]))
    hidden = keras.layers.Dense(16, activation="relu", name="ffn")(hidden)
    pooled = keras.layers.GlobalAveragePooling1D()(hidden)
    outputs = keras.layers.Dense(3, name="head")(pooled)
    return keras.Model(inputs, outputs, name="attention_block")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A saved model and its plans: bfloat16, float8 (bfloat16 head), float8 on the LayerNormalization."""
    folder = tmp_path_factory.mktemp("float8_cli")
    keras.backend.clear_session()
    keras.utils.set_random_seed(0)
    model = build_attention_block()
    paths = {
        "model": folder / "model.keras",
        "bfloat16": folder / "bfloat16.json",
        "float8": folder / "float8.json",
        "norm_float8": folder / "norm_float8.json",
    }
    model.save(paths["model"])
    PrecisionPlan.uniform(model, "bfloat16").save(paths["bfloat16"])
    float8 = PrecisionPlan.uniform(model, "float8").with_dtype("head", "bfloat16")
    float8.save(paths["float8"])
    data = float8.to_dict()
    data["layers"]["norm"]["dtype"] = (
        "float8"  # hand-edited: Keras has no float8 LayerNormalization
    )
    paths["norm_float8"].write_text(json.dumps(data))
    return paths


def test_the_float8_plan_holds_float8_on_dense_and_einsum_dense_layers_only(files):
    plan = PrecisionPlan.load(files["float8"])
    assert sorted(path for path, dtype in plan.layers.items() if dtype == "float8") == sorted(
        FLOAT8_LAYERS
    )
    assert plan.layers["norm"] == "bfloat16" and plan.layers["head"] == "bfloat16"


def test_show_prints_a_float8_totals_line(files, capsys):
    assert main(["show", str(files["float8"])]) == EXIT_OK
    output = capsys.readouterr().out
    totals = [line for line in output.splitlines() if line.startswith("float8 ")]
    assert len(totals) == 1, output
    assert re.match(rf"float8\s+{len(FLOAT8_LAYERS)} layers\s+[\d,]+ params", totals[0]), totals
    assert re.search(r"^attention/query_dense\s+EinsumDense\s+float8\b", output, re.M), output
    assert main(["show", str(files["bfloat16"])]) == EXIT_OK
    bfloat16_output = capsys.readouterr().out
    assert not [line for line in bfloat16_output.splitlines() if line.startswith("float8 ")]


def test_diff_lists_each_layer_moved_from_bfloat16_to_float8(files, capsys):
    assert main(["diff", str(files["bfloat16"]), str(files["float8"])]) == EXIT_OK
    output = capsys.readouterr().out
    moved = re.findall(r"^~ (\S+)\s+bfloat16 -> float8$", output, re.M)
    assert sorted(moved) == sorted(FLOAT8_LAYERS), output
    assert "norm" not in moved and "head" not in output
    arguments = ["diff", str(files["bfloat16"]), str(files["float8"]), "--json"]
    assert main(arguments) == EXIT_OK
    changed = json.loads(capsys.readouterr().out)["changed"]
    assert {entry["layer"]: entry["second"] for entry in changed} == dict.fromkeys(
        FLOAT8_LAYERS, "float8"
    )


def test_export_writes_a_model_that_plain_keras_reloads_in_float8(files, tmp_path, capsys):
    output = tmp_path / "float8.keras"
    result = run_cli("export", str(files["float8"]), str(files["model"]), "-o", str(output))
    assert result.returncode == EXIT_OK, result.stderr
    assert output.exists() and "written to" in result.stdout
    loaded = keras.models.load_model(output)
    paths = layer_paths(loaded)
    for path in FLOAT8_LAYERS:
        assert layer_policy(paths[path]).name == FLOAT8_POLICY, path
        assert len(float8_variables(paths[path])) == 6, path
    assert layer_policy(paths["norm"]).name == "mixed_bfloat16"
    assert layer_policy(paths["head"]).name == "mixed_bfloat16"
    assert main(["diff", str(files["float8"]), str(output), "--exit-code"]) == EXIT_OK
    capsys.readouterr()


@pytest.mark.parametrize("command", ["show", "export"])
def test_float8_on_a_layer_normalization_is_refused_naming_the_layer(
    files, tmp_path, capsys, command
):
    output = tmp_path / "refused.keras"
    arguments = {
        "show": ["show", str(files["norm_float8"])],
        "export": ["export", str(files["norm_float8"]), str(files["model"]), "-o", str(output)],
    }[command]
    assert main(arguments) == EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip()
    assert "'norm' (LayerNormalization)" in error and "float8" in error, error
    assert "Dense and EinsumDense" in error and len(error.splitlines()) == 1, error
    assert not output.exists()
