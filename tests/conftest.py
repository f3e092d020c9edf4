"""Shared fixtures: small real Keras models and data, built fresh for each test."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    """Each test starts with a clean Keras session, float32 global policy and fixed seeds."""
    keras.backend.clear_session()
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    yield
    keras.config.set_dtype_policy("float32")


def build_mlp(input_dim: int = 8, classes: int = 3) -> keras.Model:
    """A small Functional classifier: Dense, Dropout, Dense, Dense(softmax)."""
    inputs = keras.Input((input_dim,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.Dropout(0.1)(hidden)
    hidden = keras.layers.Dense(16, activation="relu")(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax")(hidden)
    return keras.Model(inputs, outputs, name="mlp")


def build_cnn(classes: int = 3) -> keras.Model:
    """A small Sequential CNN on 12x12x1 images."""
    return keras.Sequential(
        [
            keras.Input((12, 12, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(classes, activation="softmax"),
        ],
        name="cnn",
    )


def build_attention_model(sequence: int = 8, features: int = 8, classes: int = 2) -> keras.Model:
    """A Functional model with MultiHeadAttention, LayerNormalization and a softmax head."""
    inputs = keras.Input((sequence, features))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, name="attention")(
        inputs, inputs
    )
    hidden = keras.layers.Add()([inputs, attended])
    hidden = keras.layers.LayerNormalization()(hidden)
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax")(hidden)
    return keras.Model(inputs, outputs, name="attention_model")


def classification_data(
    samples: int = 128, input_dim: int = 8, classes: int = 3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Linearly separable-ish synthetic classification data."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(samples, input_dim)).astype("float32")
    weights = rng.normal(size=(input_dim, classes)).astype("float32")
    y = np.argmax(x @ weights, axis=1).astype("int32")
    return x, y


@pytest.fixture
def mlp() -> keras.Model:
    return build_mlp()


@pytest.fixture
def cnn() -> keras.Model:
    return build_cnn()


@pytest.fixture
def attention_model() -> keras.Model:
    return build_attention_model()


@pytest.fixture
def classification() -> tuple[np.ndarray, np.ndarray]:
    return classification_data()


def local_with_fast_bfloat16():
    """This device as `detect()` sees it, told that bfloat16 runs fast here.

    The one-liner then profiles and times its candidates on this CPU whatever the
    host runs fast (`hardware.is_local` holds for a detected profile): what it
    measures is real, only the choice of what to measure is forced.
    """
    import dataclasses

    from autoprec.hardware import detect

    device = detect()
    return dataclasses.replace(
        device,
        fast_dtypes=("bfloat16",),
        slow_dtypes=("float16",),
        bfloat16_flops=device.bfloat16_flops or 2 * (device.float32_flops or 1e11),
    )


#: Test modules whose shared fixtures take minutes on 2 cores: the whole module is `long`.
LONG_MODULES = (
    "tests/profiler/test_jax_profile.py",
    "tests/test_bench_fp8.py",
    "tests/test_bench_guard.py",
    "tests/test_bench_oneliner.py",
    "tests/test_gpu_bench.py",
)

#: Tests that take over ~14 s on 2 cores (measured with `--durations`; parametrized ones by
#: name, every case): `long`, run by CI after the default suite (`pytest -m long`).
LONG_TESTS = (
    "4",
    "tests/auto/test_decide.py::test_automatic_mode_gets_costs_for_a_keras_hub_bert_fed_dicts",
    "tests/cli/test_commands.py::test_search_reuses_a_profile_and_refuses_another_models",
    "tests/cli/test_commands.py::test_search_with_workers_shares_one_journal_study",
    "tests/cost/test_measure.py::test_calibrate_times_a_keras_hub_bert_at_the_shapes_of_its_dict_batch",
    "tests/demo/test_run.py::test_cli_demo_quick_exits_zero",
    "tests/demo/test_run.py::test_run_demo_quick_prints_the_verdicts_its_figures_support",
    "tests/hardware/test_builtin.py::test_names_cover_the_rtx_table_and_cpu_classes",
    "tests/profiler/test_runner.py::test_mirrored_strategy_sums_replicas",
    "tests/profiler/test_runner.py::test_profile_leaves_weights_optimizer_and_graph_unchanged",
    "tests/runtime/test_composite.py::test_random_plans_train_keras_hub_models",
    "tests/runtime/test_float8.py::test_float8_sub_layers_of_attention_survive_save_and_load",
    "tests/runtime/test_float8.py::test_the_guard_promotes_a_float8_layer_whose_scale_lags_a_growing_amax",
    "tests/runtime/test_float8_jax.py::test_float8_trains_saves_and_is_guarded_on_jax",
    "tests/runtime/test_saving.py::test_sigkill_while_saving_never_leaves_a_broken_plan",
    "tests/search/test_confirmation.py::test_measuring_adds_rounds_only_while_undecided_and_stops_at_the_time_cap",
    "tests/search/test_driver.py::test_failing_confirmation_falls_back_to_the_next_plan",
    "tests/search/test_driver.py::test_measured_step_confirms_the_final_plan_against_uniform_plans",
    "tests/search/test_driver.py::test_search_finds_mixed_plan_where_uniform_policies_fail",
    "tests/search/test_driver.py::test_the_plan_costs_no_more_than_any_uniform_or_heuristic_plan_within_budget",
    "tests/search/test_float8_search.py::test_a_search_on_fp8_hardware_puts_wide_dense_layers_in_float8_and_keeps_the_head_out",
    "tests/search/test_floor.py::test_round_to_keeps_8_significant_bits_in_bfloat16_and_11_in_float16",
    "tests/search/test_resume.py::test_search_killed_mid_study_resumes_without_losing_or_duplicating_trials",
    "tests/search/test_selection.py::test_a_measured_choice_records_its_step_times",
    "tests/search/test_selection.py::test_finalists_are_keras_global_policies_and_protections_the_profile_lets_go",
    "tests/search/test_study.py::test_keyboard_interrupt_keeps_finished_trials_and_plan",
    "tests/search/test_study.py::test_resume_accumulates_without_duplicate_warm_starts",
    "tests/search/test_study.py::test_two_processes_share_one_study",
    "tests/search/test_workers.py::test_two_processes_search_one_study_and_the_caller_gets_its_best_plan",
    "tests/test_backends.py::test_autoprec_imports_on_jax_without_tensorflow",
    "tests/test_callback.py::test_mirrored_strategy_on_two_logical_cpus",
    "tests/test_callback.py::test_one_liner_with_a_budget_runs_a_short_search_before_training",
    "tests/test_docs.py::test_tutorial_runs_top_to_bottom",
    "tests/test_examples.py::test_example_runs_in_smoke_mode",
    "tests/test_jax_guard_and_search.py::test_guard_and_search_on_jax",
    "tests/test_model_zoo.py::test_guard_rescues_a_float16_plan_whose_inputs_overflow",
    "tests/test_model_zoo.py::test_one_liner_trains_and_its_checkpoint_reloads_whole",
    "tests/test_model_zoo.py::test_short_search_runs_every_trial",
    "tests/test_multi_device.py::test_jax_data_parallel_promotes_a_layer_that_overflows_on_one_replica",
)


def pytest_collection_modifyitems(config, items):
    """Marks the tests of `LONG_MODULES` and `LONG_TESTS` `long`."""
    for item in items:
        node = item.nodeid.split("[")[0]
        if node.split("::")[0] in LONG_MODULES or node in LONG_TESTS:
            item.add_marker(pytest.mark.long)
