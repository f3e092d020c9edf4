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


@pytest.fixture(autouse=True)
def _own_decision_memory(tmp_path_factory, monkeypatch):
    """Each test starts with an empty memory of decisions: nothing recalled from another test."""
    from autoprec.decision import memory

    folder = tmp_path_factory.mktemp("decisions")
    monkeypatch.setattr(memory, "memory_dir", lambda: folder)


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


def local_with_fast_16bit():
    """This device told that bfloat16 and float16 both run fast: ranges then decide, so it profiles."""
    import dataclasses

    device = local_with_fast_bfloat16()
    return dataclasses.replace(
        device,
        fast_dtypes=("bfloat16", "float16"),
        slow_dtypes=(),
        float16_flops=device.bfloat16_flops,
    )


#: Test modules whose shared fixtures (a JAX child process, a benchmark run) take tens of
#: seconds to minutes on 2 cores: the whole module is `slow` (`pytest -m slow`), so that
#: CI's `long` stage stays within its time.
SLOW_MODULES = (
    "tests/backends/test_jax.py",
    "tests/backends/test_jax_probes.py",
    "tests/profiler/test_jax_profile.py",
    "tests/test_backends.py",
    "tests/test_bench_fp8.py",
    "tests/test_bench_guard.py",
    "tests/test_bench_oneliner.py",
    "tests/test_gpu_bench.py",
    "tests/test_multi_device.py",
    "tests/runtime/test_float8_jax.py",
)

#: Whole modules of `long` tests.
LONG_MODULES = ("tests/test_reload_keras_hub.py",)

#: The longest tests on 2 cores (measured with `--durations=0`: the default run's longest,
#: down to ~4.5 s a test; parametrized ones by name, every case): `long`, run by CI after the default suite (`pytest -m long`).
LONG_TESTS = (
    "tests/runtime/test_telemetry.py::test_a_jit_compiled_step_keeps_the_batch_it_skipped",
    "tests/test_bench_first_epoch.py::test_the_rerun_in_a_fresh_process_recalls_what_the_first_fit_kept",
    "tests/decision/test_memory.py::test_remember_false_neither_reads_nor_writes",
    "tests/decision/test_decide.py::test_automatic_mode_gets_costs_for_a_keras_hub_bert_fed_dicts",
    "tests/decision/test_decide.py::test_automatic_mode_measures_costs_on_a_padded_dataset",
    "tests/decision/test_race.py::test_the_one_liner_keeps_the_plan_whose_whole_step_measured_fastest",
    "tests/decision/test_race.py::test_the_one_liner_times_nothing_where_costs_are_predicted_or_timing_is_off",
    "tests/cli/test_commands.py::test_profile_command_writes_a_profile_that_show_reads",
    "tests/cli/test_commands.py::test_search_command_emulates_float16_when_asked",
    "tests/cli/test_commands.py::test_search_command_writes_a_plan",
    "tests/cli/test_commands.py::test_search_reuses_a_profile_and_refuses_another_models",
    "tests/cli/test_commands.py::test_search_with_workers_shares_one_journal_study",
    "tests/cli/test_float8_cli.py::test_export_writes_a_model_that_plain_keras_reloads_in_float8",
    "tests/cli/test_quiet.py::test_a_quiet_framework_import_leaves_no_trace",
    "tests/cli/test_quiet.py::test_export_in_a_fresh_process_prints_no_framework_lines",
    "tests/core/test_messages.py::test_the_logger_is_autoprec_and_the_root_logger_is_left_alone",
    "tests/cost/test_boundaries.py::test_calibrate_times_mixed_steps_fits_their_boundaries_and_caches_them",
    "tests/cost/test_measure.py::test_calibrate_measures_then_reuses_cache_and_invalidates_on_change",
    "tests/cost/test_measure.py::test_calibrate_times_a_keras_hub_bert_at_the_shapes_of_its_dict_batch",
    "tests/cost/test_steps.py::test_whole_steps_per_dtype_make_uniform_estimates_exact",
    "tests/demo/test_run.py::test_cli_demo_quick_exits_zero",
    "tests/demo/test_run.py::test_run_demo_quick_prints_the_verdicts_its_figures_support",
    "tests/hardware/test_builtin.py::test_names_cover_the_rtx_table_and_cpu_classes",
    "tests/profiler/test_float8_ranges.py::test_conv2d_gets_no_float8_ranges_and_einsum_dense_does",
    "tests/profiler/test_runner.py::test_recurrent_layers_are_profiled_at_their_outputs_and_cells_keep_weights",
    "tests/profiler/test_runner.py::test_mirrored_strategy_sums_replicas",
    "tests/profiler/test_runner.py::test_profile_callback_with_jit_compile_stops_recording_after_steps",
    "tests/profiler/test_runner.py::test_profile_leaves_weights_optimizer_and_graph_unchanged",
    "tests/runtime/test_composite.py::test_random_plans_train_keras_hub_models",
    "tests/runtime/test_float8.py::test_an_infinite_input_batch_through_float8_layers_never_reaches_the_weights",
    "tests/runtime/test_float8.py::test_extend_optimizer_is_a_no_op_when_every_variable_is_known",
    "tests/runtime/test_float8.py::test_float8_sub_layers_of_attention_survive_save_and_load",
    "tests/runtime/test_float8.py::test_loss_scaling_goes_with_a_float16_source_only",
    "tests/runtime/test_float8.py::test_steady_inputs_keep_their_scales",
    "tests/runtime/test_float8.py::test_the_callback_trains_float8_with_the_optimizer_state_kept_and_retraces_nothing_on_refit",
    "tests/runtime/test_float8.py::test_the_guard_promotes_a_float8_layer_whose_scale_lags_a_growing_amax",
    "tests/runtime/test_float8_jax.py::test_float8_trains_saves_and_is_guarded_on_jax",
    "tests/runtime/test_guard.py::test_asking_for_a_guard_on_keras_numpy_backend_is_a_clear_error",
    "tests/runtime/test_saving.py::test_keras_own_save_reloads_optimizer_state_and_the_plan",
    "tests/runtime/test_saving.py::test_reload_keeps_nested_dtypes_weights_and_optimizer_state",
    "tests/runtime/test_saving.py::test_sigkill_while_saving_never_leaves_a_broken_plan",
    "tests/runtime/test_training.py::test_a_second_fit_reapplies_rechecks_and_retraces_nothing",
    "tests/search/test_selection.py::test_protections_are_the_softmax_normalisation_and_output_layers_in_model_order",
    "tests/search/test_selection.py::test_a_plan_that_misses_the_budget_trained_longer_gives_way_to_the_next",
    "tests/search/test_evaluator.py::test_measuring_adds_rounds_only_while_undecided_and_stops_at_the_time_cap",
    "tests/search/test_selection.py::test_order_by_measurement_times_each_candidate_and_reorders_real_trials",
    "tests/search/test_driver.py::test_failing_confirmation_falls_back_to_the_next_plan",
    "tests/search/test_driver.py::test_failing_trial_is_marked_failed_and_search_goes_on",
    "tests/search/test_driver.py::test_measured_step_confirms_the_final_plan_against_uniform_plans",
    "tests/search/test_driver.py::test_search_finds_mixed_plan_where_uniform_policies_fail",
    "tests/search/test_driver.py::test_search_on_a_backend_without_the_guard_is_refused_naming_the_supported_ones",
    "tests/search/test_driver.py::test_the_plan_costs_no_more_than_any_uniform_or_heuristic_plan_within_budget",
    "tests/search/test_evaluator.py::test_emulated_float16_trains_like_native_float16_with_every_update_applied",
    "tests/search/test_evaluator.py::test_training_and_timing_leave_the_user_model_unchanged",
    "tests/search/test_warm_start.py::test_after_the_warm_starts_a_neighbour_repairs_a_faster_plan_that_missed_the_budget",
    "tests/search/test_evaluator.py::test_a_vacuous_budget_lengthens_training_until_the_baseline_misses_it",
    "tests/search/test_evaluator.py::test_the_reference_s_validation_outputs_are_kept_at_its_final_fidelity",
    "tests/search/test_selection.py::test_keras_global_policy_with_a_container_is_trained_once_and_judged_by_the_budget",
    "tests/search/test_selection.py::test_the_best_plan_with_a_protection_dropped_runs_through_the_trial_objective",
    "tests/search/test_heuristic.py::test_float8_goes_to_wide_layers_only_and_never_to_the_head",
    "tests/search/test_heuristic.py::test_outlier_input_features_keep_their_layer_out_of_float8",
    "tests/search/test_driver.py::test_a_search_on_fp8_hardware_puts_wide_dense_layers_in_float8_and_keeps_the_head_out",
    "tests/search/test_budget.py::test_round_to_keeps_8_significant_bits_in_bfloat16_and_11_in_float16",
    "tests/search/test_study.py::test_a_16_bit_head_that_holds_a_short_trial_is_refused_for_its_rounding_floor",
    "tests/search/test_study.py::test_a_classifier_s_16_bit_head_keeps_a_negligible_floor_and_is_trained",
    "tests/search/test_study.py::test_a_trial_records_its_stages_and_the_same_assignment_is_trained_once",
    "tests/search/test_study.py::test_search_on_a_classifier_may_still_return_a_16_bit_head",
    "tests/search/test_study.py::test_search_on_a_far_regression_never_returns_a_16_bit_head_and_says_why_once",
    "tests/search/test_postgres.py::test_a_trial_of_a_killed_process_is_failed_and_enqueued_again_with_its_assignment",
    "tests/search/test_study.py::test_search_killed_mid_study_resumes_without_losing_or_duplicating_trials",
    "tests/search/test_selection.py::test_a_measured_choice_records_its_step_times",
    "tests/search/test_selection.py::test_finalists_are_keras_global_policies_and_protections_the_profile_lets_go",
    "tests/search/test_selection.py::test_the_ranking_is_one_trial_per_assignment_within_budget_cheapest_first",
    "tests/search/test_selection.py::test_the_result_carries_the_chosen_plan_and_its_metadata",
    "tests/search/test_study.py::test_an_assignment_already_trained_is_reused_across_runs_of_one_study",
    "tests/search/test_study.py::test_keyboard_interrupt_keeps_finished_trials_and_plan",
    "tests/search/test_study.py::test_resume_accumulates_without_duplicate_warm_starts",
    "tests/search/test_study.py::test_two_processes_share_one_study",
    "tests/search/test_driver.py::test_the_trial_stage_starts_with_the_warm_starts_and_records_the_reference",
    "tests/search/test_driver.py::test_two_processes_search_one_study_and_the_caller_gets_its_best_plan",
    "tests/test_backends.py::test_autoprec_imports_on_jax_without_tensorflow",
    "tests/test_callback.py::test_attention_model_with_float16_attention_trains",
    "tests/test_callback.py::test_automatic_costs_are_for_the_batch_size_fit_uses",
    "tests/test_callback.py::test_automatic_costs_batch_size_from_a_dataset_or_as_given",
    "tests/test_callback.py::test_jit_compiled_training_with_a_plan",
    "tests/test_callback.py::test_mirrored_strategy_on_two_logical_cpus",
    "tests/test_callback.py::test_mixed_plan_trains_to_float32_loss_within_tolerance",
    "tests/test_callback.py::test_one_liner_profiles_decides_applies_and_reports",
    "tests/test_callback.py::test_one_liner_with_a_budget_runs_a_short_search_before_training",
    "tests/test_docs.py::test_tutorial_runs_top_to_bottom",
    "tests/test_examples.py::test_example_runs_in_smoke_mode",
    "tests/test_jax_guard_and_search.py::test_guard_and_search_on_jax",
    "tests/test_keras_callbacks.py::test_model_checkpoint_keras_file_reloads_optimizer_loss_scale_and_plan",
    "tests/test_keras_callbacks.py::test_terminate_on_nan_lets_a_rescued_run_finish_with_finite_epoch_logs",
    "tests/test_model_zoo.py::test_guard_rescues_a_float16_plan_whose_inputs_overflow",
    "tests/test_model_zoo.py::test_one_liner_trains_and_its_checkpoint_reloads_whole",
    "tests/test_model_zoo.py::test_short_search_runs_every_trial",
    "tests/test_multi_device.py::test_jax_data_parallel_promotes_a_layer_that_overflows_on_one_replica",
    "tests/runtime/test_kernels.py::test_t5_attention_layers_are_checked_as_called_and_nothing_is_misreported",
    "tests/runtime/test_kernels.py::test_a_mixtral_moe_block_whose_experts_differ_from_it_falls_back_with_its_decoder_and_reloads",
    "tests/runtime/test_layer_check.py::test_a_masked_recurrent_layer_in_a_wrapper_trains_in_any_dtypes_and_reloads",
    "tests/runtime/test_composite.py::test_a_guard_promotion_inside_a_composite_layer_moves_the_layer_with_it",
    "tests/runtime/test_telemetry.py::test_overflow_from_the_very_first_step_in_a_conv_model",
    "tests/search/test_driver.py::test_the_search_returns_a_plan_predicted_no_slower_than_any_uniform_policy",
    "tests/test_keras_callbacks.py::test_csv_logger_and_tensorboard_record_every_epoch",
)


def pytest_collection_modifyitems(config, items):
    """Marks the tests of `SLOW_MODULES` `slow`, those of `LONG_MODULES` and `LONG_TESTS` `long`."""
    for item in items:
        node = item.nodeid.split("[")[0]
        module = node.split("::")[0]
        if module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        elif module in LONG_MODULES or node in LONG_TESTS:
            item.add_marker(pytest.mark.long)
