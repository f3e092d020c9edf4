"""The float8 benchmark's cards, goal and models (`bench/fp8.py`), at realistic or tiny sizes.

Every model takes any sequence length (image size for the CNN), so one model is
predicted at the realistic shapes and trained here at short ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import numpy as np
from common import data
from common.models import decoder_lm, encoder_classifier, mlp

import autoprec

CARDS = ("rtx4090", "rtx5090", "h100")
#: the card the search runs for (by default) and the speedup goal is judged on
GOAL_CARD = "rtx4090"
SPEEDUP_GOAL = 1.3
CLASSES = data.CLASSES
#: what the search and the heuristic may use
PLAN_DTYPES = ("float32", "bfloat16", "float8")
#: the uniform plans every searched or heuristic plan is compared with
UNIFORM = ("float32", "bfloat16", "float8 wherever")
#: fraction of the classifiers' labels replaced by random classes
LABEL_NOISE = 0.2


def budget() -> autoprec.Budget:
    """The budget every plan is held to: validation loss at most 2 % above float32's."""
    return autoprec.Budget("val_loss", max_relative_drop=0.02)


# ---------------------------------------------------------------------- models and data


@dataclasses.dataclass(frozen=True)
class Shapes:
    """Batch and sequence length (image size for the CNN, `None` for the MLP) of one use."""

    batch: int
    length: int | None

    def describe(self, unit: str) -> str:
        """`batch 8 x sequence 1024 (8,192 tokens)`, or `batch 4096` without a length."""
        if self.length is None:
            return f"batch {self.batch:,}"
        if unit == "image":
            return f"batch {self.batch} x {self.length}x{self.length} images"
        return f"batch {self.batch} x {unit} {self.length} ({self.batch * self.length:,} tokens)"


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """One benchmark model: how to build it, its data, the shapes it is predicted and trained at.

    Attributes:
        name: the `--models` name.
        kind: a few words on what it is.
        build: builds the uncompiled model (every length is dynamic).
        data: `data(rng, samples, length)` returns `(x, y)` NumPy arrays.
        predicted: the shapes the step times are predicted for.
        trained: the shapes it trains at here.
        unit: what `length` counts (`"sequence"`, `"image"` or `""`).
        learning_rate: Adam's learning rate (3e-3 for every tiny `--quick` model, which
            must learn in three steps).
    """

    name: str
    kind: str
    build: Callable[[], keras.Model]
    data: Callable[[np.random.Generator, int, int | None], tuple[np.ndarray, np.ndarray]]
    predicted: Shapes
    trained: Shapes
    unit: str = "sequence"
    learning_rate: float = 1e-3


def build_gpt(width: int, blocks: int, heads: int, vocabulary: int) -> keras.Model:
    """A pre-norm GPT-style causal decoder over token ids of any length, logits out."""
    return decoder_lm(
        length=None, vocabulary=vocabulary, width=width, heads=heads, blocks=blocks,
        hidden=4 * width, name="gpt",
    )  # fmt: skip


def build_encoder(width: int, blocks: int, heads: int, vocabulary: int) -> keras.Model:
    """A post-norm Transformer encoder classifier over token ids of any length, logits out."""
    return encoder_classifier(
        length=None, vocabulary=vocabulary, width=width, heads=heads, blocks=blocks,
        hidden=4 * width, logits=True, name="encoder",
    )  # fmt: skip


def build_mlp(features: int, width: int, depth: int) -> keras.Model:
    """`depth` x `Dense(width, relu)` and a `Dense` head, logits out."""
    return mlp(features, width, depth, activation=None, name="mlp")


def build_cnn(filters: tuple[int, ...], hidden_units: int) -> keras.Model:
    """A `Conv2D` stack (stride 2 after the first) over images of any size, pooling, Dense head."""
    layers = keras.layers
    images = keras.Input((None, None, 3), name="image")
    hidden = images
    for index, count in enumerate(filters):
        hidden = layers.Conv2D(
            count,
            3,
            strides=1 if index == 0 else 2,
            padding="same",
            activation="relu",
            name=f"conv{index}",
        )(hidden)
    pooled = layers.GlobalAveragePooling2D(name="pool")(hidden)
    hidden = layers.Dense(hidden_units, activation="relu", name="fc")(pooled)
    logits = layers.Dense(CLASSES, name="head")(hidden)
    return keras.Model(images, logits, name="cnn")


def next_token_data(vocabulary: int) -> Callable:
    """Tokens from the first `min(vocabulary // 4, 256)` ids; each target a fixed function of its token.

    The first steps learn which ids occur (the loss falls from about log(vocabulary)
    towards log(used)), later ones the mapping.
    """
    used = min(vocabulary // 4, 256)
    return lambda rng, samples, length: data.next_tokens(rng, samples, length, used, low=0)


def noisy(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    """`labels` with a fifth replaced by random classes: the loss stays well above zero."""
    replaced = rng.random(labels.shape) < LABEL_NOISE
    return np.where(replaced, rng.integers(0, CLASSES, labels.shape), labels).astype("int32")


def marker_tokens(vocabulary: int) -> Callable:
    """Random tokens with the class id (a token below `CLASSES`) at about a quarter of positions.

    A fifth of the labels are then replaced by random classes (`noisy`).
    """

    def generate(rng: np.random.Generator, samples: int, length: int | None):
        tokens, labels = data.marker_tokens(rng, samples, length, vocabulary)
        return tokens, noisy(rng, labels)

    return generate


def class_features(features: int) -> Callable:
    """Gaussian features shifted by a fixed random pattern of their class, labels `noisy`."""

    def generate(rng: np.random.Generator, samples: int, length: int | None):
        pattern = np.random.default_rng(1234).normal(size=(CLASSES, features))
        labels = rng.integers(0, CLASSES, samples).astype("int32")
        x = rng.normal(size=(samples, features)) + 0.5 * pattern[labels]
        return x.astype("float32"), noisy(rng, labels)

    return generate


def model_specs(quick: bool) -> dict[str, ModelSpec]:
    """The four models at their benchmark sizes, or tiny ones (`quick`)."""
    if quick:
        gpt = dict(width=64, blocks=2, heads=4, vocabulary=256)
        encoder = dict(width=64, blocks=1, heads=4, vocabulary=256)
        mlp = dict(features=64, width=256, depth=3)
        cnn = dict(filters=(8, 16, 32), hidden_units=64)
        token_shapes, token_train = Shapes(4, 64), Shapes(4, 16)
        gpt_train = token_train
        mlp_shapes, mlp_train = Shapes(256, None), Shapes(32, None)
        cnn_shapes, cnn_train = Shapes(8, 32), Shapes(8, 16)
    else:
        gpt = dict(width=1024, blocks=4, heads=16, vocabulary=8192)
        encoder = dict(width=1024, blocks=2, heads=16, vocabulary=8192)
        mlp = dict(features=1024, width=4096, depth=3)
        cnn = dict(filters=(64, 128, 256, 512), hidden_units=1024)
        token_shapes, token_train = Shapes(8, 1024), Shapes(8, 32)
        gpt_train = Shapes(4, 32)  # its steps cost the most here: half the batch
        mlp_shapes, mlp_train = Shapes(4096, None), Shapes(64, None)
        cnn_shapes, cnn_train = Shapes(64, 224), Shapes(32, 32)
    specs = {
        "gpt": ModelSpec(
            "gpt",
            "GPT-style causal decoder ({width} wide, {blocks} blocks, {heads} heads, "
            "vocabulary {vocabulary})".format(**gpt),
            lambda: build_gpt(**gpt),
            next_token_data(gpt["vocabulary"]),
            token_shapes,
            gpt_train,
        ),
        "encoder": ModelSpec(
            "encoder",
            "Transformer encoder classifier ({width} wide, {blocks} blocks, {heads} heads, "
            "vocabulary {vocabulary})".format(**encoder),
            lambda: build_encoder(**encoder),
            marker_tokens(encoder["vocabulary"]),
            token_shapes,
            token_train,
            learning_rate=1e-4,  # a post-norm encoder this wide diverges at first above it
        ),
        "mlp": ModelSpec(
            "mlp",
            "wide MLP ({features} features, {depth} x Dense({width}))".format(**mlp),
            lambda: build_mlp(**mlp),
            class_features(mlp["features"]),
            mlp_shapes,
            mlp_train,
            unit="",
            learning_rate=3e-4,
        ),
        "cnn": ModelSpec(
            "cnn",
            "CNN (Conv2D {filters}, Dense({hidden_units}) head)".format(**cnn),
            lambda: build_cnn(**cnn),
            data.offset_images,
            cnn_shapes,
            cnn_train,
            unit="image",
        ),
    }
    if quick:
        return {name: dataclasses.replace(spec, learning_rate=3e-3) for name, spec in specs.items()}
    return specs


MODEL_NAMES = ("gpt", "encoder", "mlp", "cnn")
QUICK_MODELS = ("gpt", "mlp")
