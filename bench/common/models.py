"""The Keras models several benchmarks build (any backend; random weights, nothing downloaded).

Each builder returns the uncompiled model; Keras' global dtype policy applies to it
(see `common.keras_tools.global_policy`). Layer names are the same in every benchmark,
so plans and reports name the same layers.
"""

from __future__ import annotations

import warnings
from typing import Any

import keras

from .data import CLASSES

#: The token vocabulary of the text models unless a benchmark gives its own.
VOCABULARY = 1000
#: `keras.applications` models by benchmark name.
APPLICATIONS = {
    "mobilenetv2": "MobileNetV2",
    "mobilenetv3small": "MobileNetV3Small",
    "densenet121": "DenseNet121",
    "resnet50": "ResNet50",
    "efficientnetb0": "EfficientNetB0",
}


def encoder_classifier(
    *,
    length: int | None,
    width: int,
    heads: int,
    blocks: int,
    hidden: int,
    vocabulary: int = VOCABULARY,
    features: int | None = None,
    activation: str = "gelu",
    dropout: float = 0.0,
    logits: bool = False,
    head_dtype: str | None = None,
    classes: int = CLASSES,
    name: str = "transformer",
) -> keras.Model:
    """A BERT-style post-norm Transformer encoder classifier.

    Blocks of `MultiHeadAttention` (attention `dropout`) and a feed-forward
    `Dense(hidden, activation) -> Dense(width)`, each added back and normalised,
    then pooling and a `Dense` head (softmax, or logits).

    Args:
        length: tokens per sample (`None`: any length).
        features: float features per position instead of token ids (a `Dense` embeds them).
        head_dtype: the head's own dtype (e.g. `"float32"` under a mixed policy).
    """
    layers = keras.layers
    if features is None:
        inputs = keras.Input((length,), dtype="int32", name="tokens")
        x = layers.Embedding(vocabulary, width, name="embedding")(inputs)
    else:
        inputs = keras.Input((length, features), name="features")
        x = layers.Dense(width, name="embedding")(inputs)
    for index in range(blocks):
        block = f"block{index}"
        attended = layers.MultiHeadAttention(
            heads, width // heads, dropout=dropout, name=f"{block}_attention"
        )(x, x)
        x = layers.LayerNormalization(name=f"{block}_norm1")(
            layers.Add(name=f"{block}_add1")([x, attended])
        )
        forward = layers.Dense(hidden, activation=activation, name=f"{block}_ff1")(x)
        forward = layers.Dense(width, name=f"{block}_ff2")(forward)
        x = layers.LayerNormalization(name=f"{block}_norm2")(
            layers.Add(name=f"{block}_add2")([x, forward])
        )
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    head = layers.Dense(
        classes, activation=None if logits else "softmax", dtype=head_dtype, name="head"
    )
    return keras.Model(inputs, head(x), name=name)


def decoder_lm(
    *,
    length: int | None,
    vocabulary: int,
    width: int,
    heads: int,
    blocks: int,
    hidden: int,
    dropout: float = 0.0,
    epsilon: float = 1e-3,
    name: str = "gpt",
) -> keras.Model:
    """A GPT-style pre-norm causal decoder with a logits head over the vocabulary.

    Blocks of causal `MultiHeadAttention` (attention `dropout`) and an MLP
    `Dense(hidden, gelu) -> Dense(width)`, each on a normalised input and added
    back. No position embeddings (the causal mask orders the tokens), so it takes
    any length when `length` is `None`.
    """
    layers = keras.layers
    tokens = keras.Input((length,), dtype="int32", name="tokens")
    x = layers.Embedding(vocabulary, width, name="token_embedding")(tokens)
    for index in range(blocks):
        block = f"block{index}"
        normed = layers.LayerNormalization(epsilon=epsilon, name=f"{block}_norm1")(x)
        attended = layers.MultiHeadAttention(
            heads, width // heads, dropout=dropout, name=f"{block}_attention"
        )(normed, normed, use_causal_mask=True)
        x = layers.Add(name=f"{block}_add1")([x, attended])
        normed = layers.LayerNormalization(epsilon=epsilon, name=f"{block}_norm2")(x)
        forward = layers.Dense(hidden, activation="gelu", name=f"{block}_mlp1")(normed)
        forward = layers.Dense(width, name=f"{block}_mlp2")(forward)
        x = layers.Add(name=f"{block}_add2")([x, forward])
    x = layers.LayerNormalization(epsilon=epsilon, name="final_norm")(x)
    return keras.Model(tokens, layers.Dense(vocabulary, name="lm_head")(x), name=name)


def residual_block(
    inputs: Any, filters: int, stride: int, name: str, use_bias: bool, normalize_projection: bool
) -> Any:
    """Conv-BN-ReLU-Conv-BN plus the shortcut (projected where the shape changes), then ReLU."""
    layers = keras.layers
    x = layers.Conv2D(
        filters, 3, strides=stride, padding="same", use_bias=use_bias, name=f"{name}_conv1"
    )(inputs)
    x = layers.BatchNormalization(name=f"{name}_bn1")(x)
    x = layers.Activation("relu", name=f"{name}_relu1")(x)
    x = layers.Conv2D(filters, 3, padding="same", use_bias=use_bias, name=f"{name}_conv2")(x)
    x = layers.BatchNormalization(name=f"{name}_bn2")(x)
    shortcut = inputs
    if stride != 1 or inputs.shape[-1] != filters:
        shortcut = layers.Conv2D(
            filters, 1, strides=stride, use_bias=use_bias, name=f"{name}_project"
        )(inputs)
        if normalize_projection:
            shortcut = layers.BatchNormalization(name=f"{name}_project_bn")(shortcut)
    x = layers.Add(name=f"{name}_add")([x, shortcut])
    return layers.Activation("relu", name=f"{name}_relu2")(x)


def resnet(
    size: int = 32,
    widths: tuple[int, ...] = (32, 64, 128),
    *,
    use_bias: bool = True,
    normalize_projection: bool = False,
    classes: int = CLASSES,
    name: str = "resnet",
) -> keras.Model:
    """A ResNet-style CNN: stem, one residual block per stage (stride 2 after the first), head.

    `use_bias=False, normalize_projection=True` is the usual ImageNet form (no
    convolution bias before BatchNormalization, projections normalised too).
    """
    layers = keras.layers
    inputs = keras.Input((size, size, 3), name="image")
    x = layers.Conv2D(widths[0], 3, padding="same", use_bias=use_bias, name="stem")(inputs)
    x = layers.BatchNormalization(name="stem_bn")(x)
    x = layers.Activation("relu", name="stem_relu")(x)
    for index, filters in enumerate(widths):
        stride = 1 if index == 0 else 2
        x = residual_block(x, filters, stride, f"stage{index}", use_bias, normalize_projection)
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = layers.Dense(classes, activation="softmax", name="head")(x)
    return keras.Model(inputs, outputs, name=name)


def mlp(
    features: int,
    width: int,
    depth: int,
    *,
    outputs: int = CLASSES,
    activation: str | None = "softmax",
    head_dtype: str | None = None,
    head_bias: float | None = None,
    name: str = "mlp",
) -> keras.Model:
    """`depth` x `Dense(width, relu)` and a `Dense(outputs, activation)` head.

    `head_bias` starts the head's bias there (a regression around that value).
    """
    inputs = keras.Input((features,), name="features")
    x = inputs
    for index in range(depth):
        x = keras.layers.Dense(width, activation="relu", name=f"dense{index}")(x)
    bias = "zeros" if head_bias is None else keras.initializers.Constant(head_bias)
    head = keras.layers.Dense(
        outputs, activation=activation, bias_initializer=bias, dtype=head_dtype, name="head"
    )
    return keras.Model(inputs, head(x), name=name)


def gru_classifier(
    length: int,
    *,
    vocabulary: int = VOCABULARY,
    recurrent: int = 2,
    units: int = 256,
    dense: int | None = None,
    classes: int = CLASSES,
    name: str = "gru_text",
) -> keras.Model:
    """A text classifier: `Embedding(vocabulary, 128)`, `recurrent` x `GRU(units)`, a softmax head.

    `dense`: a `Dense(dense, relu)` between the last GRU and the head.
    """
    layers = keras.layers
    inputs = keras.Input((length,), dtype="int32", name="tokens")
    x = layers.Embedding(vocabulary, 128, name="embedding")(inputs)
    for index in range(recurrent):
        last = index == recurrent - 1
        x = layers.GRU(units, return_sequences=not last, name=f"gru{index + 1}")(x)
    if dense:
        x = layers.Dense(dense, activation="relu", name="dense")(x)
    outputs = layers.Dense(classes, activation="softmax", name="head")(x)
    return keras.Model(inputs, outputs, name=name)


def application(name: str, size: int, classes: int = CLASSES, **options: Any) -> keras.Model:
    """`keras.applications`' model `name` (of `APPLICATIONS`), random weights, `size`x`size` images."""
    builder = getattr(keras.applications, APPLICATIONS[name])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "weights for input shape (224, 224) will be loaded"
        return builder(input_shape=(size, size, 3), weights=None, classes=classes, **options)
