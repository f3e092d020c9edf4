"""TensorBoard scalars and text of the training log (autoprec.runtime.training.TrainingLog)."""

from __future__ import annotations

from autoprec.runtime.training import TrainingLog


def test_training_scalars_count_every_dtype_and_carry_the_loss_scale():
    scalars = TrainingLog.scalars({"a": "float16", "b": "float16", "c": "float32"}, 1024.0)
    assert scalars == {
        "autoprec/loss_scale": 1024.0,
        "autoprec/layers_float32": 1,
        "autoprec/layers_bfloat16": 0,
        "autoprec/layers_float16": 2,
    }
    assert "autoprec/loss_scale" not in TrainingLog.scalars({"a": "bfloat16"}, None)


def test_dtype_table_and_events_text_are_markdown():
    assert (
        TrainingLog.dtype_table({"dense": "float16"})
        == "| layer | dtype |\n|---|---|\n| `dense` | float16 |"
    )
    event = {"step": 3, "kind": "promotion", "layer": "big", "from": "float16", "to": "bfloat16"}
    assert TrainingLog.events_text([{**event, "evidence": "overflow"}]) == (
        "- step 3: promotion `big` float16 -> bfloat16 (overflow)"
    )
