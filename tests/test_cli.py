"""The `autoprec` command on real files: success and each bad-input path with its exit code."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import build_mlp

from autoprec import PrecisionPlan
from autoprec.cli import EXIT_BAD_INPUT, EXIT_OK, main


@pytest.fixture
def plan_files(tmp_path):
    plan = PrecisionPlan.uniform(build_mlp(), "bfloat16")
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    plan.save(first)
    plan.with_dtype("dense_2", "float32").save(second)
    return first, second


def test_show_prints_the_plan_table(plan_files, capsys):
    assert main(["show", str(plan_files[0])]) == EXIT_OK
    output = capsys.readouterr().out
    assert "dense_1" in output and "bfloat16" in output


def test_diff_lists_changed_layers(plan_files, capsys):
    assert main(["diff", str(plan_files[0]), str(plan_files[1])]) == EXIT_OK
    assert "~ dense_2" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{broken", "not valid JSON at line 1"),
        ('{"format": "something.else"}', "not an autoprec plan or profile"),
        ('{"format_version": 1, "layers": {"dense": "float8"}}', "unknown dtype 'float8'"),
    ],
)
def test_bad_files_exit_2_with_one_line_naming_the_file(tmp_path, capsys, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["show", str(path)]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip()
    assert message in error and str(path) in error
    assert "Traceback" not in error and len(error.splitlines()) == 1


def test_missing_file_exits_2(tmp_path, capsys):
    assert main(["diff", str(tmp_path / "x.json"), str(tmp_path / "y.json")]) == EXIT_BAD_INPUT
    assert "no such file" in capsys.readouterr().err


def test_debug_shows_traceback(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text("{broken")
    assert main(["--debug", "show", str(path)]) == EXIT_BAD_INPUT
    assert "Traceback" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["demo", "profile", "search", "show", "diff", "hardware"])
def test_help_for_every_command(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert f"usage: autoprec {command}" in capsys.readouterr().out


def test_module_entry_point_runs():
    result = subprocess.run(
        [sys.executable, "-m", "autoprec.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: autoprec" in result.stdout


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == EXIT_BAD_INPUT
    assert "usage: autoprec" in capsys.readouterr().out


def test_plan_json_from_cli_round_trips(plan_files):
    data = json.loads(plan_files[1].read_text())
    assert data["layers"]["dense_2"]["dtype"] == "float32"


@pytest.fixture
def model_and_data(tmp_path):
    import keras
    import numpy as np
    from conftest import classification_data

    model = build_mlp()
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model_path = tmp_path / "model.keras"
    model.save(model_path)
    x, y = classification_data(samples=160)
    data_path = tmp_path / "data.npz"
    np.savez(data_path, x_train=x[:128], y_train=y[:128], x_val=x[128:], y_val=y[128:])
    uncompiled = tmp_path / "uncompiled.keras"
    keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)]).save(uncompiled)
    return model_path, data_path, uncompiled


def test_profile_command_writes_a_profile_that_show_reads(model_and_data, tmp_path, capsys):
    model_path, data_path, _ = model_and_data
    output = tmp_path / "profile.json"
    arguments = ["profile", str(model_path), "--data", str(data_path), "--steps", "2"]
    assert main([*arguments, "-o", str(output)]) == EXIT_OK
    assert output.exists()
    assert main(["show", str(output)]) == EXIT_OK
    assert "dense_1" in capsys.readouterr().out


def test_search_command_writes_a_plan(model_and_data, tmp_path, capsys):
    model_path, data_path, _ = model_and_data
    output = tmp_path / "plan.json"
    arguments = [
        "search", str(model_path), "--data", str(data_path),
        "--budget", "val_accuracy:0.05", "--hardware", "rtx4090", "--trials", "2",
        "--train-steps", "2", "--dtypes", "float32,bf16", "-o", str(output),
    ]  # fmt: skip
    assert main(arguments) == EXIT_OK
    plan = PrecisionPlan.load(output)
    assert set(plan.layers.values()) <= {"float32", "bfloat16"}
    assert "plan written to" in capsys.readouterr().out


def test_search_with_workers_shares_one_journal_study(model_and_data, tmp_path, capsys):
    import optuna

    model_path, data_path, _ = model_and_data
    output = tmp_path / "plan.json"
    arguments = [
        "search", str(model_path), "--data", str(data_path),
        "--budget", "val_accuracy:0.05", "--hardware", "rtx4090", "--trials", "1",
        "--train-steps", "2", "--dtypes", "float32,bf16", "--workers", "2", "-o", str(output),
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


def test_search_refuses_zero_workers(model_and_data, capsys):
    model_path, data_path, _ = model_and_data
    arguments = ["search", str(model_path), "--data", str(data_path), "--budget",
                 "val_accuracy:0.05", "--workers", "0"]  # fmt: skip
    assert main(arguments) == EXIT_BAD_INPUT
    assert "--workers 0" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("make_arguments", "message"),
    [
        (
            lambda m, d, u, t: ["profile", str(m), "--data", str(t / "none.npz")],
            "no such data file",
        ),
        (lambda m, d, u, t: ["profile", str(u), "--data", str(d)], "not compiled"),
        (lambda m, d, u, t: ["profile", str(t / "m.h5"), "--data", str(d)], "no such model file"),
        (lambda m, d, u, t: ["profile", str(m), "--data", "nosuchmodule:load"], "cannot import"),
        (lambda m, d, u, t: ["profile", str(m), "--data", "data.csv"], "module:function"),
        (
            lambda m, d, u, t: ["search", str(m), "--data", str(d), "--budget", "accuracy"],
            "METRIC:MAX_DROP",
        ),
        (
            lambda m, d, u, t: [
                "search",
                str(m),
                "--data",
                str(d),
                "--budget",
                "val_accuracy:0.1",
                "--dtypes",
                "int8",
            ],
            "unknown dtype 'int8'",
        ),
        (lambda m, d, u, t: ["hardware", "rtx9999"], "rtx9999"),
    ],
)
def test_bad_command_input_exits_2_with_one_line(
    model_and_data, tmp_path, capsys, make_arguments, message
):
    model_path, data_path, uncompiled = model_and_data
    assert main(make_arguments(model_path, data_path, uncompiled, tmp_path)) == EXIT_BAD_INPUT
    error = capsys.readouterr().err.strip()
    assert message in error
    assert len(error.splitlines()) == 1 and "Traceback" not in error


def test_npz_missing_arrays_names_them(model_and_data, tmp_path, capsys):
    import numpy as np

    model_path, _, _ = model_and_data
    partial = tmp_path / "partial.npz"
    np.savez(partial, x_train=np.zeros((4, 8)))
    assert main(["profile", str(model_path), "--data", str(partial)]) == EXIT_BAD_INPUT
    assert "y_train, x_val, y_val" in capsys.readouterr().err


def test_hardware_lists_profiles_and_detects_this_machine(capsys):
    assert main(["hardware"]) == EXIT_OK
    listing = capsys.readouterr().out
    assert "rtx4090" in listing and "rtx2080ti" in listing
    assert main(["hardware", "--detect"]) == EXIT_OK
    assert capsys.readouterr().out.strip()
    assert main(["hardware", "RTX 4060 Ti"]) == EXIT_OK
