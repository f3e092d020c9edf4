"""`autoprec.cli`: each command on real files, its text and `--json` output, its exit code."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
from cli.cli_files import write_model_and_data, write_model_plans, write_plan_files

import autoprec
from autoprec import PrecisionPlan
from autoprec.cli import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_OK, diff_to_dict, main


@pytest.fixture
def plan_files(tmp_path):
    return write_plan_files(tmp_path)


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    """One compiled MLP `.keras` file, its `.npz` data and an uncompiled model, for the module."""
    return write_model_and_data(tmp_path_factory.mktemp("cli_model"))


@pytest.fixture(scope="module")
def model_plans(model_and_data, tmp_path_factory):
    """A bfloat16 plan that fits the model file, and a plan of another model."""
    return write_model_plans(model_and_data[0], tmp_path_factory.mktemp("cli_plans"))


# ---------------------------------------------------------------------- show and diff


def test_show_prints_the_plan_table(plan_files, capsys):
    assert main(["show", str(plan_files[0])]) == EXIT_OK
    output = capsys.readouterr().out
    assert "dense_1" in output and "bfloat16" in output


def test_diff_lists_changed_layers(plan_files, capsys):
    assert main(["diff", str(plan_files[0]), str(plan_files[1])]) == EXIT_OK
    assert "~ dense_2" in capsys.readouterr().out


def test_show_json_is_the_plan(plan_files, capsys):
    assert main(["show", str(plan_files[1]), "--json"]) == EXIT_OK
    shown = json.loads(capsys.readouterr().out)
    assert shown["kind"] == "plan" and shown["source"] == str(plan_files[1])
    assert shown["plan"] == json.loads(plan_files[1].read_text())


def test_diff_json_and_exit_code(plan_files, capsys, tmp_path):
    first, second = (str(path) for path in plan_files)
    assert main(["diff", first, second, "--json", "--exit-code"]) == EXIT_INTERNAL
    difference = json.loads(capsys.readouterr().out)
    assert difference == {
        "first": first,
        "second": second,
        "identical": False,
        "default": None,
        "changed": [{"layer": "dense_2", "first": "bfloat16", "second": "float32"}],
        "only_in_first": [],
        "only_in_second": [],
        "rules": None,
    }
    ruled = tmp_path / "ruled.json"
    PrecisionPlan.load(first).with_rule(path="dense_2", dtype="bfloat16").save(ruled)
    assert main(["diff", first, str(ruled), "--json", "--exit-code"]) == EXIT_INTERNAL
    rules = json.loads(capsys.readouterr().out)["rules"]
    assert rules["first"] == [] and rules["second"][0]["path"] == "dense_2", rules
    assert main(["diff", first, first, "--exit-code"]) == EXIT_OK
    assert "plans are identical" in capsys.readouterr().out
    assert main(["diff", first, second]) == EXIT_OK  # without --exit-code: 0 either way


def test_diff_to_dict_names_layers_only_in_one_plan_and_the_default():
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(4, name="a"), keras.layers.Dense(2, name="b")]
    )
    first = PrecisionPlan.uniform(model, "bfloat16")
    second = PrecisionPlan({"a": "bfloat16", "c": "float16"}, default="float32")
    described = diff_to_dict("one.json", "two.json", first.diff(second))
    assert described["identical"] is False
    assert described["only_in_first"] == ["b"] and described["only_in_second"] == ["c"]
    assert described["default"] == {"first": "bfloat16", "second": "float32"}
    assert diff_to_dict("x", "x", first.diff(first))["identical"] is True


# ---------------------------------------------------------------------- hardware


def test_hardware_lists_profiles_and_detects_this_machine(capsys):
    assert main(["hardware"]) == EXIT_OK
    listing = capsys.readouterr().out
    assert "rtx4090" in listing and "rtx2080ti" in listing
    assert main(["hardware", "--detect"]) == EXIT_OK
    assert capsys.readouterr().out.strip()
    assert main(["hardware", "RTX 4060 Ti"]) == EXIT_OK


def test_hardware_json(capsys):
    assert main(["hardware", "--json"]) == EXIT_OK
    listed = json.loads(capsys.readouterr().out)["profiles"]
    assert "rtx4090" in [profile["name"] for profile in listed]
    assert main(["hardware", "RTX 4090", "--json"]) == EXIT_OK
    one = json.loads(capsys.readouterr().out)["profile"]
    assert one["name"] == "rtx4090" and "bfloat16" in one["fast_dtypes"]


def test_hardware_refuses_a_name_with_detect(capsys):
    assert main(["hardware", "rtx4090", "--detect"]) == EXIT_BAD_INPUT
    assert "give NAME ('rtx4090') or --detect, not both" in capsys.readouterr().err


# ---------------------------------------------------------------------- profile and search


def test_profile_command_writes_a_profile_that_show_reads(model_and_data, tmp_path, capsys):
    model_path, data_path, _ = model_and_data
    output = tmp_path / "profile.json"
    arguments = ["profile", str(model_path), "--data", str(data_path), "--steps", "2"]
    assert main([*arguments, "-o", str(output)]) == EXIT_OK
    assert output.exists()
    assert main(["show", str(output)]) == EXIT_OK
    assert "dense_1" in capsys.readouterr().out
    assert main(["show", str(output), "--json"]) == EXIT_OK
    shown = json.loads(capsys.readouterr().out)
    assert shown["kind"] == "profile" and shown["profile"]["layers"]["dense_1"]


def test_search_command_writes_a_plan(model_and_data, tmp_path, capsys):
    model_path, data_path, _ = model_and_data
    output = tmp_path / "plan.json"
    arguments = [
        "search", str(model_path), "--data", str(data_path),
        "--budget", "val_accuracy:0.05", "--hardware", "rtx4090", "--n-trials", "2",
        "--steps-per-trial", "2", "--dtypes", "float32,bf16", "-o", str(output),
    ]  # fmt: skip
    assert main(arguments) == EXIT_OK
    plan = PrecisionPlan.load(output)
    assert set(plan.layers.values()) <= {"float32", "bfloat16"}
    assert plan.metadata["search"]["float16_trials"] is None  # float16 was not asked for
    assert "plan written to" in capsys.readouterr().out


def test_search_command_emulates_float16_when_asked(model_and_data, tmp_path):
    model_path, data_path, _ = model_and_data
    output = tmp_path / "plan.json"
    arguments = [
        "search", str(model_path), "--data", str(data_path),
        "--budget", "val_accuracy:0.05", "--hardware", "rtx4090", "--n-trials", "2",
        "--steps-per-trial", "2", "--dtypes", "float32,float16", "--float16-trials", "emulated",
        "-o", str(output),
    ]  # fmt: skip
    assert main(arguments) == EXIT_OK
    assert PrecisionPlan.load(output).metadata["search"]["float16_trials"] == "emulated"


def test_search_with_workers_shares_one_journal_study(model_and_data, tmp_path, capsys):
    import optuna

    model_path, data_path, _ = model_and_data
    output = tmp_path / "plan.json"
    arguments = [
        "search", str(model_path), "--data", str(data_path),
        "--budget", "val_accuracy:0.05", "--hardware", "rtx4090", "--n-trials", "1",
        "--steps-per-trial", "2", "--dtypes", "float32,bf16", "--workers", "2", "-o", str(output),
    ]  # fmt: skip
    assert main(arguments) == EXIT_OK
    assert PrecisionPlan.load(output).layers
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(f"{output}.search.log")
    )
    study = optuna.load_study(study_name="autoprec", storage=storage)
    finished = [trial for trial in study.trials if trial.state.is_finished()]
    assert len(finished) >= 2  # one trial from each process, at least
    assert "plan written to" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--workers", "0"], "--workers 0"), (["--n-trials", "0"], "--n-trials 0")],
)
def test_search_refuses_zero_workers_or_trials(model_and_data, capsys, flags, message):
    model_path, data_path, _ = model_and_data
    arguments = ["search", str(model_path), "--data", str(data_path), "--budget",
                 "val_accuracy:0.05", *flags]  # fmt: skip
    assert main(arguments) == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_search_reuses_a_profile_and_refuses_another_models(
    model_and_data, model_plans, tmp_path, capsys
):
    from autoprec import profile

    model_path, data_path, _ = model_and_data
    recorded = tmp_path / "profile.json"
    arguments = ["profile", str(model_path), "--data", str(data_path), "--steps", "2"]
    assert main([*arguments, "-o", str(recorded)]) == EXIT_OK
    output = tmp_path / "plan.json"
    search = [
        "search", str(model_path), "--data", str(data_path), "--budget", "val_accuracy:0.5",
        "--hardware", "rtx4090", "--n-trials", "1", "--steps-per-trial", "2",
        "--dtypes", "float32,float16", "--verbose", "0", "-o", str(output),
    ]  # fmt: skip
    assert main([*search, "--profile", str(recorded)]) == EXIT_OK
    assert PrecisionPlan.load(output).layers
    capsys.readouterr()

    foreign = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    foreign.compile("adam", "sparse_categorical_crossentropy")

    other = tmp_path / "other_profile.json"
    profile(foreign, (np.zeros((8, 8), "float32"), np.zeros(8, "int32")), steps=1).save(other)
    assert main([*search, "--profile", str(other)]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert "recorded for another model" in error and str(other) in error
    assert main([*search, "--profile", str(model_plans[0])]) == EXIT_BAD_INPUT
    assert "not a profile" in capsys.readouterr().err


# ---------------------------------------------------------------------- export and show MODEL


def test_export_stores_the_plan_that_show_and_load_model_read(
    model_and_data, model_plans, tmp_path, capsys
):
    output = tmp_path / "mixed.keras"
    arguments = ["export", str(model_plans[0]), str(model_and_data[0]), "-o", str(output)]
    assert main(arguments) == EXIT_OK
    capsys.readouterr()
    assert main(["show", str(output), "--json"]) == EXIT_OK
    stored = json.loads(capsys.readouterr().out)["plan"]
    assert stored["layers"] == json.loads(model_plans[0].read_text())["layers"]
    model = autoprec.load_model(output)
    assert model.layers[1].dtype_policy.name == "mixed_bfloat16"
    assert model.layers[-1].dtype_policy.name == "float32"
    assert main(["diff", str(model_plans[0]), str(output), "--exit-code"]) == EXIT_OK


def test_export_refuses_a_plan_of_another_model(model_and_data, model_plans, tmp_path, capsys):
    output = tmp_path / "wrong.keras"
    arguments = ["export", str(model_plans[1]), str(model_and_data[0]), "-o", str(output)]
    assert main(arguments) == EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip()
    assert "'other_head'" in error and str(model_plans[1]) in error
    assert len(error.splitlines()) == 1 and not output.exists()


def test_export_refuses_an_output_that_is_not_keras(model_and_data, model_plans, tmp_path, capsys):
    output = tmp_path / "mixed.h5"
    arguments = ["export", str(model_plans[0]), str(model_and_data[0]), "-o", str(output)]
    assert main(arguments) == EXIT_BAD_INPUT
    assert "the output must end in '.keras'" in capsys.readouterr().err
    assert not output.exists()


def test_show_model_without_a_stored_plan_exits_2(model_and_data, capsys):
    assert main(["show", str(model_and_data[0])]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert "no precision plan is stored" in error and str(model_and_data[0]) in error
