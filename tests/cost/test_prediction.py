"""Tests for autoprec.cost.prediction: the LayerCost value, hand-counted FLOPs per layer class, one
LayerCost per layer (every call of a shared layer summed), and roofline seconds per dtype on
hardware profiles."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from conftest import build_attention_model

from autoprec import cost, hardware
from autoprec.cost import LayerCost, prediction
from autoprec.errors import PlanError
from autoprec.layers import PASS_THROUGH_CLASSES, layer_paths


def test_totals_and_free_layers():
    counted = LayerCost(
        "dense", "Dense", matmul_flops=6.0, vector_flops=1.0, backward_matmul_flops=12.0
    )
    assert (counted.forward_flops, counted.backward_flops) == (7.0, 12.0)
    assert not counted.is_free and not counted.has_float8_path
    assert LayerCost("flatten", "Flatten").is_free
    assert LayerCost("dense", "Dense", float8_matmuls=1).has_float8_path


def test_bytes_moved_in_each_16_and_32_bit_dtype():
    counted = LayerCost("dense", "Dense", activation_elements=10.0, weight_elements=100)
    # Activations 3x in the dtype; float32 master weights read, (cast, read again), updated.
    assert counted.bytes_moved("float32", 2) == 3 * 10 * 2 * 4 + 100 * (4 + 4 + 4)
    assert counted.bytes_moved("bfloat16", 2) == 3 * 10 * 2 * 2 + 100 * (4 + 2 + 4 + 4)
    assert counted.bytes_moved("float16", 2) == counted.bytes_moved("bfloat16", 2)


def test_float8_bytes_add_the_quantize_passes_and_amax_histories():
    counted = LayerCost(
        "dense",
        "Dense",
        activation_elements=10.0,
        weight_elements=100,
        float8_matmuls=1,
        float8_quantized_elements=5.0,
        float8_kernel_elements=100,
    )
    assert counted.float8_quantized_values(2) == 5 * 2 + 100
    per_value = 2 * prediction.ITEMSIZE["bfloat16"] + prediction.FLOAT8_ITEMSIZE
    histories = prediction.FLOAT8_QUANTIZED_TENSORS * prediction.FLOAT8_AMAX_HISTORY * 4 * 3
    assert counted.float8_quantize_bytes(2) == pytest.approx(110 * per_value + histories)
    assert counted.bytes_moved("float8", 2) == pytest.approx(
        counted.bytes_moved("bfloat16", 2) + counted.float8_quantize_bytes(2)
    )
    assert LayerCost("relu", "ReLU").float8_quantize_bytes(2) == 0
    assert prediction.FLOAT8_EXTRA_KERNELS == 3 * prediction.FLOAT8_QUANTIZED_TENSORS


def _single_layer_cost(input_shape, layer, input_dtype="float32") -> cost.LayerCost:
    inputs = keras.Input(input_shape, dtype=input_dtype)
    model = keras.Model(inputs, layer(inputs))
    paths = layer_paths(model)
    path = next(path for path, candidate in paths.items() if candidate is layer)
    return cost.count_costs(model)[path]


# Hand-computed per-sample counts: 2 FLOPs per multiply-add.
@pytest.mark.parametrize(
    "input_shape, make_layer, matmul, vector",
    [
        # 8 -> 16: 2*8*16 matmul; bias 16 + relu 16.
        ((8,), lambda: keras.layers.Dense(16, activation="relu"), 256, 32),
        # rows 5: 2*5*8*16; bias 80.
        ((5, 8), lambda: keras.layers.Dense(16), 1280, 80),
        ((8,), lambda: keras.layers.EinsumDense("ab,bc->ac", output_shape=16), 256, 0),
        # abc,cde->abde with b=5, c=8, d=2, e=4: 2*5*8*2*4.
        (
            (5, 8),
            lambda: keras.layers.EinsumDense("abc,cde->abde", output_shape=(None, 2, 4)),
            640,
            0,
        ),
        # 10x10 outputs x 4 filters x 3x3x1 window: 2*100*4*9; bias+relu on 400.
        ((12, 12, 1), lambda: keras.layers.Conv2D(4, 3, activation="relu"), 7200, 800),
        # groups=2: each filter sees 1 of 2 channels.
        ((12, 12, 2), lambda: keras.layers.Conv2D(4, 3, groups=2, use_bias=False), 7200, 0),
        # 8 positions x 6 filters x 3 x 4 channels.
        ((10, 4), lambda: keras.layers.Conv1D(6, 3, use_bias=False), 1152, 0),
        # 27 positions x 2 filters x 8 window x 1 channel.
        ((4, 4, 4, 1), lambda: keras.layers.Conv3D(2, 2, use_bias=False), 864, 0),
        # 16 input positions x 2 channels x 2x2 window x 3 filters.
        (
            (4, 4, 2),
            lambda: keras.layers.Conv2DTranspose(3, 2, strides=2, use_bias=False),
            768,
            0,
        ),
        # depthwise: 4x4x4 outputs x 3x3 window, vector work.
        ((6, 6, 4), lambda: keras.layers.DepthwiseConv2D(3, use_bias=False), 0, 1152),
        # 8 positions x 4 channels x window 3.
        ((10, 4), lambda: keras.layers.DepthwiseConv1D(3, use_bias=False), 0, 192),
        # separable: depthwise 2*16*4*9 (vector) + pointwise 2*16*4*5 (matmul).
        ((6, 6, 4), lambda: keras.layers.SeparableConv2D(5, 3, use_bias=False), 640, 1152),
        # LSTM: 5 steps x 2*(3+4)*4*4; GRU 3 gates; SimpleRNN 1.
        ((5, 3), lambda: keras.layers.LSTM(4), 1120, 5 * 4 * 10),
        ((5, 3), lambda: keras.layers.GRU(4), 840, 5 * 4 * 9),
        ((5, 3), lambda: keras.layers.SimpleRNN(4), 280, 5 * 4 * 2),
        # normalisation: 8 FLOPs per element.
        ((6, 6, 4), lambda: keras.layers.BatchNormalization(), 0, 8 * 144),
        ((5, 8), lambda: keras.layers.LayerNormalization(), 0, 8 * 40),
        ((6, 6, 4), lambda: keras.layers.GroupNormalization(groups=2), 0, 8 * 144),
        # pooling: 5x5x4 outputs x 2x2 window; global: every input element.
        ((10, 10, 4), lambda: keras.layers.MaxPooling2D(2), 0, 400),
        ((10, 10, 4), lambda: keras.layers.AveragePooling2D(2), 0, 400),
        ((10, 10, 4), lambda: keras.layers.GlobalAveragePooling2D(), 0, 400),
        ((16,), lambda: keras.layers.Activation("tanh"), 0, 64),
        ((16,), lambda: keras.layers.Dropout(0.5), 0, 32),
        ((16,), lambda: keras.layers.Flatten(), 0, 0),
    ],
)
def test_forward_flops_match_hand_counts(input_shape, make_layer, matmul, vector):
    counted = _single_layer_cost(input_shape, make_layer())
    assert counted.matmul_flops == pytest.approx(matmul)
    assert counted.vector_flops == pytest.approx(vector)
    assert counted.backward_matmul_flops == pytest.approx(2 * matmul)


def test_flatten_is_free_and_dense_counts_weights():
    assert _single_layer_cost((4, 4), keras.layers.Flatten()).is_free
    dense = _single_layer_cost((8,), keras.layers.Dense(16))
    assert dense.weight_elements == 8 * 16 + 16
    assert dense.matmul_dims == (8, 16)


def test_merge_layers_count_one_flop_per_extra_input():
    inputs = [keras.Input((8,)) for _ in range(3)]
    added = keras.layers.Add()(inputs[:2])
    multiplied = keras.layers.Multiply()(inputs)
    model = keras.Model(inputs, [added, multiplied])
    counts = cost.count_costs(model, cost.trace_model(model))
    assert counts["add"].vector_flops == 8
    assert counts["multiply"].vector_flops == 16


def test_embedding_gathers_without_forward_flops():
    counted = _single_layer_cost((6,), keras.layers.Embedding(10, 4), input_dtype="int32")
    assert counted.forward_flops == 0
    assert counted.backward_vector_flops == 24
    assert counted.activation_elements == 24 + 6


def test_attention_counts_inner_einsums_and_projections_separately():
    model = build_attention_model(sequence=8, features=8)
    counts = cost.count_costs(model)
    # q.k and softmax.v: 2 heads x 8 x 8 scores x key_dim 4, twice.
    assert counts["attention"].matmul_flops == pytest.approx(2 * (2 * 2 * 8 * 8 * 4))
    # query projection abc,cde->abde: 8 x 8 x 2 x 4.
    assert counts["attention/query_dense"].matmul_flops == pytest.approx(2 * 8 * 8 * 2 * 4)
    assert counts["attention/softmax"].is_free


# The copy classes as they were listed before they were derived from PASS_THROUGH_CLASSES.
_COPY_CLASSES_BEFORE = frozenset(
    {
        "Concatenate",
        "Permute",
        "RepeatVector",
        "ZeroPadding1D",
        "ZeroPadding2D",
        "ZeroPadding3D",
        "Cropping1D",
        "Cropping2D",
        "Cropping3D",
        "UpSampling1D",
        "UpSampling2D",
        "UpSampling3D",
        "Masking",
        "ActivityRegularization",
    }
)


def test_pass_through_categories_come_from_the_one_pass_through_list():
    assert prediction.VIEW_CLASSES <= PASS_THROUGH_CLASSES
    assert prediction.DROPOUT_CLASSES <= PASS_THROUGH_CLASSES
    assert prediction.COPY_CLASSES <= PASS_THROUGH_CLASSES
    assert prediction.COPY_CLASSES == _COPY_CLASSES_BEFORE
    # Every pass-through class falls in exactly one category that the prediction knows.
    categories = (
        prediction.VIEW_CLASSES,
        prediction.DROPOUT_CLASSES,
        prediction.COPY_CLASSES,
        prediction.MERGE_CLASSES,
        prediction.ACTIVATION_CLASSES,
        frozenset(name for name in PASS_THROUGH_CLASSES if "Pooling" in name),
    )
    for name in PASS_THROUGH_CLASSES:
        assert sum(name in category for category in categories) == 1, name


def test_copy_layers_move_elements_without_flops():
    counted = _single_layer_cost((4, 4, 2), keras.layers.ZeroPadding2D(1))
    assert counted.forward_flops == 0
    assert counted.activation_elements == 4 * 4 * 2 + 6 * 6 * 2


def test_count_call_counts_one_call_and_leaves_free_layers_empty():
    inputs = keras.Input((8,))
    dense = keras.layers.Dense(16, use_bias=False, name="dense")
    flatten = keras.layers.Flatten(name="flatten")
    model = keras.Model(inputs, flatten(dense(inputs)))
    trace = cost.trace_model(model)
    fields = prediction.count_call(trace.calls["dense"][0], dense, None, "")
    assert fields["matmul_flops"] == 2 * 8 * 16
    assert fields["float8_matmuls"] == 1 and fields["float8_dims"] == (8, 16)
    assert prediction.count_call(trace.calls["flatten"][0], flatten, None, "") == {}
    assert "note" in prediction.count_call(trace.calls["dense"][0], dense, None, "LSTM")


def test_count_costs_has_every_layer_in_traversal_order(mlp):
    counts = cost.count_costs(mlp)
    assert list(counts) == list(layer_paths(mlp))
    assert all(isinstance(counted, cost.LayerCost) for counted in counts.values())
    assert counts == cost.count_costs(mlp, cost.trace_model(mlp))


def test_a_shared_layer_counts_every_call():
    shared = keras.layers.Dense(4, use_bias=False, name="shared")
    left, right = keras.Input((8,)), keras.Input((8,))
    model = keras.Model([left, right], [shared(left), shared(right)])
    counted = cost.count_costs(model)["shared"]
    assert counted.matmul_flops == pytest.approx(2 * (2 * 8 * 4))
    assert counted.matmul_dims == (8, 4, 8, 4)
    assert counted.float8_matmuls == 2
    assert counted.weight_elements == 8 * 4  # the same weights, not counted twice


def test_a_recurrent_layer_counts_the_recurrence_and_its_cell_nothing():
    model = keras.Sequential([keras.Input((5, 3)), keras.layers.LSTM(4)])
    counts = cost.count_costs(model)
    assert counts["lstm"].matmul_flops == pytest.approx(1120)
    assert counts["lstm/cell"].forward_flops == 0
    assert counts["lstm/cell"].note == "counted in its recurrent layer"


def _wide_mlp() -> keras.Model:
    inputs = keras.Input((512,))
    hidden = keras.layers.Dense(1024, activation="relu")(inputs)
    hidden = keras.layers.Dense(1024, activation="relu")(hidden)
    return keras.Model(inputs, keras.layers.Dense(16)(hidden))


def test_rtx2080ti_never_makes_bfloat16_fast():
    model = _wide_mlp()
    table = cost.predict_costs(model, hardware.get("rtx2080ti"), batch_size=256)
    for path, record in table.layers.items():
        if record.seconds["float32"]:
            assert record.seconds["bfloat16"] > record.seconds["float16"], path
    bf16 = cost.estimate(model, "bfloat16", costs=table)
    fp16 = cost.estimate(model, "float16", costs=table)
    assert bf16.speedup < 1.0 < fp16.speedup
    ampere = cost.estimate(model, "bfloat16", "rtx3090", batch_size=256)
    assert ampere.speedup > 1.0


def test_unaligned_dimensions_lose_the_tensor_core_rate():
    def fp16_over_fp32(units):
        inputs = keras.Input((1024,))
        model = keras.Model(inputs, keras.layers.Dense(units)(inputs))
        record = cost.predict_costs(model, "rtx4090", batch_size=8192).layers["dense"]
        return record.seconds["float16"] / record.seconds["float32"]

    assert fp16_over_fp32(1024) < 0.6
    assert fp16_over_fp32(1020) > 0.8


def test_prediction_takes_dynamic_shapes_from_a_nested_batch(nested_model, nested_batch):
    x, y = nested_batch
    length = x["text"]["tokens"].shape[1]
    with pytest.raises(PlanError, match="pass a batch of inputs"):
        cost.predict_costs(nested_model, "rtx4090", batch_size=8)
    table = cost.predict_costs(nested_model, "rtx4090", batch_size=8, x=(x, y))
    assert table.source == "predicted" and table.stats["predicted"] == len(table.layers)
    projection = table.layers["pair_sum/projection"]
    assert projection.forward_flops == 8 * length * (2 * 4 * 6 + 6)  # (4 -> 6) matmul + bias
    doubled = {"text": {key: np.concatenate([v, v], 1) for key, v in x["text"].items()}}
    doubled["extra"] = x["extra"]
    longer = cost.predict_costs(nested_model, "rtx4090", batch_size=8, x=doubled)
    assert longer.layers["pair_sum/projection"].forward_flops == 2 * projection.forward_flops
