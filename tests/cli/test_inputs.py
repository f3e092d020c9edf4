"""`autoprec.cli`: models, data, plans, profiles, budgets and dtypes read from real files."""

from __future__ import annotations

import textwrap
import zipfile

import numpy as np
import pytest
from cli.cli_files import write_model_and_data, write_model_plans, write_plan_files
from profiler.reference import synthetic_profile

from autoprec import Budget, PrecisionPlan
from autoprec.cli import (
    EXIT_BAD_INPUT,
    UsageError,
    build_parser,
    load_data,
    load_keras_model,
    load_plan,
    load_profile_for,
    main,
    parse_budget,
    parse_dtypes,
    read_json_kind,
    search_keyword_arguments,
)
from autoprec.errors import AutoprecError


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory):
    return write_model_and_data(tmp_path_factory.mktemp("cli_inputs"))


@pytest.fixture
def plan_files(tmp_path):
    return write_plan_files(tmp_path)


def test_usage_error_is_what_callers_catch():
    assert issubclass(UsageError, AutoprecError) and issubclass(UsageError, ValueError)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{broken", "not valid JSON at line 1"),
        ('{"format": "something.else"}', "not an autoprec plan or profile"),
        ('{"format_version": 1, "layers": {"dense": "float4"}}', "unknown dtype 'float4'"),
        ('{"format_version": 1, "default": "float8"}', "float8 cannot be a plan's default"),
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
    model_path, _, _ = model_and_data
    partial = tmp_path / "partial.npz"
    np.savez(partial, x_train=np.zeros((4, 8)))
    assert main(["profile", str(model_path), "--data", str(partial)]) == EXIT_BAD_INPUT
    assert "y_train, x_val, y_val" in capsys.readouterr().err


def test_load_data_reads_the_four_arrays_of_an_npz_file(model_and_data):
    data = load_data(str(model_and_data[1]))
    (x_train, y_train), (x_val, y_val) = data["train"], data["val"]
    assert x_train.shape == (128, 8) and y_train.shape == (128,)
    assert x_val.shape == (32, 8) and y_val.shape == (32,)


def test_load_data_refuses_an_unreadable_npz_file(tmp_path):
    broken = tmp_path / "broken.npz"
    broken.write_text("not a zip archive")
    with pytest.raises(UsageError, match=r"broken\.npz: not a readable \.npz file"):
        load_data(str(broken))


def test_load_data_calls_a_module_function_from_the_working_folder(tmp_path, monkeypatch):
    (tmp_path / "cli_inputs_data.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            def load():
                x = np.arange(12, dtype="float32").reshape(6, 2)
                return (x, x[:, 0]), (x[:2], x[:2, 0])

            def single():
                return np.zeros(3)

            NOT_CALLABLE = 1
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # removed after the test with the module
    data = load_data("cli_inputs_data:load")
    assert data["train"][0].shape == (6, 2) and data["val"][1].tolist() == [0.0, 2.0]
    with pytest.raises(UsageError, match=r"single\(\) must return \(train_data, val_data\)"):
        load_data("cli_inputs_data:single")
    with pytest.raises(UsageError, match="cli_inputs_data has no function 'NOT_CALLABLE'"):
        load_data("cli_inputs_data:NOT_CALLABLE")


def test_read_json_kind_tells_plans_from_profiles(plan_files, tmp_path):
    kind, data = read_json_kind(str(plan_files[0]))
    assert kind == "plan" and data["layers"]["dense_1"]["dtype"] == "bfloat16"
    profile_path = tmp_path / "profile.json"
    synthetic_profile().save(profile_path)
    kind, data = read_json_kind(str(profile_path))
    assert kind == "profile" and data["kind"] == "autoprec.profile"
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(UsageError, match=r"list\.json: not an autoprec plan or profile \(format"):
        read_json_kind(str(listed))


def test_load_plan_reads_plan_files_and_refuses_profiles(plan_files, tmp_path):
    plan = load_plan(str(plan_files[1]))
    assert isinstance(plan, PrecisionPlan) and plan.layers["dense_2"] == "float32"
    profile_path = tmp_path / "profile.json"
    synthetic_profile().save(profile_path)
    with pytest.raises(UsageError, match="this is a profile, not a precision plan"):
        load_plan(str(profile_path))


def test_plan_json_from_cli_round_trips(plan_files):
    import json

    data = json.loads(plan_files[1].read_text())
    assert data["layers"]["dense_2"]["dtype"] == "float32"


def test_load_plan_from_model_checks_the_archive(model_and_data, tmp_path):
    with pytest.raises(UsageError, match=r"missing\.keras: no such model file"):
        load_plan(str(tmp_path / "missing.keras"))
    fake = tmp_path / "fake.keras"
    fake.write_text("plain text")
    with pytest.raises(UsageError, match=r"fake\.keras: not a \.keras archive"):
        load_plan(str(fake))
    with pytest.raises(UsageError, match="no precision plan is stored in this model"):
        load_plan(str(model_and_data[0]))


def test_load_keras_model_checks_suffix_and_compile(model_and_data, tmp_path):
    model_path, _, uncompiled = model_and_data
    model = load_keras_model(str(model_path))
    assert model.compiled and model.optimizer is not None
    with pytest.raises(UsageError, match="the model is not compiled"):
        load_keras_model(str(uncompiled))
    assert load_keras_model(str(uncompiled), require_compiled=False).layers
    wrong = tmp_path / "model.h5"
    wrong.write_text("")
    with pytest.raises(UsageError, match=r"expected a \.keras file"):
        load_keras_model(str(wrong))
    corrupt = tmp_path / "corrupt.keras"
    corrupt.write_text("not an archive")
    with pytest.raises(AutoprecError, match=r"corrupt\.keras: not a \.keras archive"):
        load_keras_model(str(corrupt))
    not_a_model = tmp_path / "not_a_model.keras"
    with zipfile.ZipFile(not_a_model, "w") as archive:
        archive.writestr("notes.txt", "no model here")
    with pytest.raises(UsageError, match=r"not_a_model\.keras: cannot load the model: "):
        load_keras_model(str(not_a_model))


def test_load_profile_for_refuses_a_plan(model_and_data, tmp_path):
    model_plans = write_model_plans(model_and_data[0], tmp_path)
    model = load_keras_model(str(model_and_data[0]))
    with pytest.raises(UsageError, match="this is a plan, not a profile"):
        load_profile_for(str(model_plans[0]), model)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("val_accuracy:0.005", Budget("val_accuracy", max_drop=0.005)),
        ("val_loss:2%", Budget("val_loss", max_relative_drop=0.02)),
        ("val_score:0.01:max", Budget("val_score", max_drop=0.01, mode="max")),
    ],
)
def test_parse_budget(text, expected):
    assert parse_budget(text) == expected


@pytest.mark.parametrize("text", ["accuracy", "val_accuracy:", ":0.1", "val_loss:0.1:up"])
def test_parse_budget_refuses_malformed_text(text):
    with pytest.raises(UsageError, match=r"--budget .*use METRIC:MAX_DROP"):
        parse_budget(text)


def test_parse_budget_names_the_flag_on_a_bad_amount():
    with pytest.raises(UsageError, match=r"--budget 'val_loss:abc'"):
        parse_budget("val_loss:abc")


def test_parse_dtypes():
    assert parse_dtypes(None) is None and parse_dtypes("") is None
    assert parse_dtypes("float32, bf16,fp16") == ("float32", "bfloat16", "float16")
    with pytest.raises(UsageError, match="unknown dtype 'int8'"):
        parse_dtypes("float32,int8")


def test_search_keyword_arguments_carry_every_search_flag():
    args = build_parser().parse_args(
        [
            "search", "model.keras", "--data", "d.npz", "--budget", "val_loss:1%",
            "--hardware", "rtx4090", "--n-trials", "4", "--timeout", "30", "--seed", "7",
            "--steps-per-trial", "6", "--validation-steps", "2", "--batch-size", "16",
            "--dtypes", "fp32,bf16", "--float16-trials", "emulated", "--verbose", "2",
            "-o", "out.json",
        ]
    )  # fmt: skip
    budget = parse_budget(args.budget)
    arguments = search_keyword_arguments(args, budget, None)
    assert arguments["budget"] is budget
    assert (arguments["hardware"], arguments["n_trials"]) == ("rtx4090", 4)
    assert (arguments["timeout"], arguments["verbose"]) == (30.0, 2)
    settings = arguments["settings"]
    assert (settings.seed, settings.plan_path, settings.steps_per_trial) == (7, "out.json", 6)
    assert (settings.validation_steps, settings.batch_size) == (2, 16)
    assert settings.dtypes == ("float32", "bfloat16") and settings.float16_trials == "emulated"
    assert settings.profile is None
