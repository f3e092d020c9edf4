"""The `autoprec` command on real files: success and each bad-input path with its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import build_mlp

from autoprec import PrecisionPlan
from autoprec.cli import EXIT_BAD_INPUT, EXIT_INTERNAL, EXIT_OK, build_parser, main

#: Native lines TensorFlow writes while it loads; none may reach the command's stderr.
FRAMEWORK_NOISE = ("tensorflow", "onednn", "cuda", "absl", "cpu_feature_guard")


def run_cli(*arguments: str, cwd=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Runs `python -m autoprec ARGUMENTS` in a fresh process, without TF_CPP_MIN_LOG_LEVEL set."""
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-m", "autoprec", *arguments],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
    )


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


def test_module_entry_points_run():
    for module in ("autoprec", "autoprec.cli"):
        result = subprocess.run(
            [sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        assert "usage: autoprec" in result.stdout


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == EXIT_BAD_INPUT
    assert "usage: autoprec" in capsys.readouterr().out


def test_plan_json_from_cli_round_trips(plan_files):
    data = json.loads(plan_files[1].read_text())
    assert data["layers"]["dense_2"]["dtype"] == "float32"


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    """One compiled MLP `.keras` file, its `.npz` data and an uncompiled model, for the module."""
    import keras
    import numpy as np
    from conftest import classification_data

    folder = tmp_path_factory.mktemp("cli_model")
    keras.backend.clear_session()  # the state each test starts from (conftest)
    keras.utils.set_random_seed(0)
    model = build_mlp()
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model_path = folder / "model.keras"
    model.save(model_path)
    x, y = classification_data(samples=160)
    data_path = folder / "data.npz"
    np.savez(data_path, x_train=x[:128], y_train=y[:128], x_val=x[128:], y_val=y[128:])
    uncompiled = folder / "uncompiled.keras"
    keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)]).save(uncompiled)
    return model_path, data_path, uncompiled


@pytest.fixture(scope="module")
def model_plans(model_and_data, tmp_path_factory):
    """A bfloat16 plan that fits the model file, and a plan of another model."""
    import keras

    folder = tmp_path_factory.mktemp("cli_plans")
    fitting, other = folder / "plan.json", folder / "other.json"
    model = keras.saving.load_model(model_and_data[0], compile=False)
    PrecisionPlan.uniform(model, "bfloat16").with_dtype(model.layers[-1].name, "float32").save(
        fitting
    )
    foreign = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3, name="other_head")])
    PrecisionPlan.uniform(foreign, "bfloat16").save(other)
    return fitting, other


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


# ---------------------------------------------------------------------- fast and quiet

_IMPORTS_CHECK = """
import sys
import autoprec
heavy = ("tensorflow", "keras", "optuna")
after_import = [name for name in heavy if name in sys.modules]
import autoprec.cli
for argv in (["--help"], ["search", "--help"], ["export", "--help"]):
    try:
        autoprec.cli.main(argv)
    except SystemExit:
        pass
after_help = [name for name in heavy if name in sys.modules]
print("RESULT", after_import, after_help)
"""


def test_import_and_help_load_no_framework():
    result = subprocess.run(
        [sys.executable, "-c", _IMPORTS_CHECK], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "RESULT [] []" in result.stdout, result.stdout[-500:]


def test_help_and_version_answer_fast():
    started = time.perf_counter()
    result = run_cli("--help")
    elapsed = time.perf_counter() - started
    assert result.returncode == 0 and "usage: autoprec" in result.stdout
    assert elapsed < 3.0, f"autoprec --help took {elapsed:.1f} s (a framework import costs ~5 s)"
    version = run_cli("--version")
    import autoprec

    assert version.returncode == 0
    assert version.stdout.strip() == f"autoprec {autoprec.__version__}"


def test_missing_file_is_one_line_on_stderr(tmp_path):
    missing = tmp_path / "missing.json"
    result = run_cli("show", str(missing))
    assert result.returncode == EXIT_BAD_INPUT
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("autoprec: error: ") and str(missing) in lines[0]
    assert not any(word in result.stderr.lower() for word in FRAMEWORK_NOISE)


def test_export_in_a_fresh_process_prints_no_framework_lines(model_and_data, model_plans, tmp_path):
    """Loads TensorFlow and Keras: their start-up lines and load warnings are dropped."""
    output = tmp_path / "exported.keras"
    result = run_cli("export", str(model_plans[0]), str(model_and_data[0]), "-o", str(output))
    assert result.returncode == EXIT_OK, result.stderr
    assert result.stderr == "", result.stderr
    assert output.exists() and "written to" in result.stdout


def test_usage_errors_are_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["search", "model.keras"])
    assert exit_info.value.code == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert error.startswith("autoprec: error: search: ") and "--data" in error
    assert len(error.splitlines()) == 1


# ---------------------------------------------------------------------- flags and aliases


def test_deprecated_flags_still_work_with_a_warning(capsys):
    base = ["search", "model.keras", "--data", "d.npz", "--budget", "val_loss:1%"]
    defaults = build_parser().parse_args(base)
    assert (defaults.n_trials, defaults.steps_per_trial) == (20, 20)
    old = build_parser().parse_args([*base, "--trials", "3", "--train-steps", "5"])
    assert (old.n_trials, old.steps_per_trial) == (3, 5)
    warnings = capsys.readouterr().err
    assert "--trials is deprecated; use --n-trials" in warnings
    assert "--train-steps is deprecated; use --steps-per-trial" in warnings
    assert build_parser().parse_args(["demo", "--trials", "2"]).n_trials == 2
    search_help = build_parser()._subparsers._group_actions[0].choices["search"].format_help()
    assert "--n-trials" in search_help and "--trials" not in search_help


# ---------------------------------------------------------------------- --json and --exit-code


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


def test_hardware_json(capsys):
    assert main(["hardware", "--json"]) == EXIT_OK
    listed = json.loads(capsys.readouterr().out)["profiles"]
    assert "rtx4090" in [profile["name"] for profile in listed]
    assert main(["hardware", "RTX 4090", "--json"]) == EXIT_OK
    one = json.loads(capsys.readouterr().out)["profile"]
    assert one["name"] == "rtx4090" and "bfloat16" in one["fast_dtypes"]


# ---------------------------------------------------------------------- export and show MODEL


def test_export_stores_the_plan_that_show_and_load_model_read(
    model_and_data, model_plans, tmp_path, capsys
):
    import autoprec

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


def test_show_model_without_a_stored_plan_exits_2(model_and_data, capsys):
    assert main(["show", str(model_and_data[0])]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert "no precision plan is stored" in error and str(model_and_data[0]) in error


# ---------------------------------------------------------------------- search --profile


def test_search_reuses_a_profile_and_refuses_another_models(
    model_and_data, model_plans, tmp_path, capsys
):
    import keras

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
    import numpy as np

    other = tmp_path / "other_profile.json"
    profile(foreign, (np.zeros((8, 8), "float32"), np.zeros(8, "int32")), steps=1).save(other)
    assert main([*search, "--profile", str(other)]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert "recorded for another model" in error and str(other) in error
    assert main([*search, "--profile", str(model_plans[0])]) == EXIT_BAD_INPUT
    assert "not a profile" in capsys.readouterr().err
