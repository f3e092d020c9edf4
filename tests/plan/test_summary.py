"""Plan summaries: the text table of layers and totals (autoprec/plan/plan.py)."""

from __future__ import annotations

from autoprec import PrecisionPlan


def test_summary_lists_layers_and_totals(cnn):
    summary = PrecisionPlan.uniform(cnn, "float32").with_dtype("conv2d", "bfloat16").summary()
    assert "conv2d" in summary and "Conv2D" in summary
    assert "bfloat16     1 layers" in summary
    assert "follows" in summary
    conv_parameters = 3 * 3 * 1 * 4 + 4
    assert f"{conv_parameters:>12,} params" in summary


def test_summary_rows_follow_the_model_and_mark_followers(cnn):
    rows = PrecisionPlan.uniform(cnn, "float32").summary().splitlines()[3:8]
    assert [row.split() for row in rows] == [
        ["conv2d", "Conv2D", "float32", "40"],
        ["batch_normalization", "BatchNormalization", "float32", "16"],
        ["max_pooling2d", "MaxPooling2D", "float32", "0", "follows", "batch_normalization"],
        ["flatten", "Flatten", "float32", "0", "follows", "max_pooling2d"],
        ["dense", "Dense", "float32", "303"],
    ]
    hand = PrecisionPlan({"head": "float16"}).summary().splitlines()[3]
    assert hand.split() == ["head", "?", "float16", "0"]


def test_summary_table_aligns_columns_and_counts_only_decided_layers(mlp):
    plan = (
        PrecisionPlan.uniform(mlp, "bfloat16")
        .with_rule(path="dense_2", dtype="float32")
        .with_event({"step": 2, "layer": "dense"})
    )
    lines = plan.summary().splitlines()
    assert lines[0] == "PrecisionPlan for mlp (default bfloat16, 1 rule(s))"
    assert lines[1].split() == ["layer", "class", "dtype", "params"]
    assert lines[2].split() == ["-" * len("dense_2"), "-" * len("Dropout"), "-" * 8, "-" * 6]
    assert lines[4] == "dropout  Dropout  bfloat16       0  follows dense"
    assert "float32      1 layers            51 params ( 10.9 %)" in lines
    assert "bfloat16     2 layers           416 params ( 89.1 %)" in lines
    assert lines[-3:] == [
        "1 follower(s) take the dtype of the layer they follow",
        "rule: {'path': 'dense_2', 'dtype': 'float32'}",
        "1 event(s): see plan.events",
    ]
    empty = PrecisionPlan(default="float16").summary().splitlines()
    assert empty[0] == "PrecisionPlan for model (default float16, 0 rule(s))"
    assert "float16      0 layers             0 params (  0.0 %)" in empty
