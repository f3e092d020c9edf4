"""Small models the search tests share: a classifier, an attention classifier, a far regression."""

from __future__ import annotations

import contextlib
import dataclasses
import time

import keras
import numpy as np
from conftest import build_mlp, classification_data

from autoprec._core.data import take_batches
from autoprec.search import SearchSettings

#: Search settings that keep a test's search small: 2 train steps, float32 and bfloat16 only.
FAST_SETTINGS = SearchSettings(
    dtypes=("float32", "bfloat16"), steps_per_trial=2, batch_size=32, proxy_batches=1, seed=0
)


def fast(**changes) -> dict:
    """`search()` keywords of a small test search: predicted `rtx4090` costs, silent, FAST_SETTINGS.

    Args:
        **changes: `search()` keywords, or `SearchSettings` fields to change.

    Returns:
        The keywords, `settings=` included.
    """
    fields = {field.name for field in dataclasses.fields(SearchSettings)}
    settings = {key: value for key, value in changes.items() if key in fields}
    keywords = {key: value for key, value in changes.items() if key not in fields}
    return {
        "hardware": "rtx4090",
        "verbose": 0,
        **keywords,
        "settings": dataclasses.replace(FAST_SETTINGS, **settings),
    }


def compiled_mlp() -> keras.Model:
    """The conftest MLP, compiled as the search tests train it."""
    model = build_mlp()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def mlp_data():
    """`(train, validation)` classification data for the MLP."""
    x, y = classification_data(samples=192)
    return (x[:128], y[:128]), (x[128:], y[128:])


def wide_classifier(classes: int = 4) -> keras.Model:
    """Dense 512 layers, a LayerNormalization and a head: 16-bit pays on `rtx4090` at batch 4096."""
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(512, activation="relu", name="wide_in")(inputs)
    hidden = keras.layers.Dense(512, activation="relu", name="wide_out")(hidden)
    hidden = keras.layers.LayerNormalization(name="norm")(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax", name="head")(hidden)
    model = keras.Model(inputs, outputs, name="wide_classifier")
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def attention_classifier(classes: int = 4) -> keras.Model:
    """A wide self-attention block with a feed-forward layer and a softmax head."""
    inputs = keras.Input((8, 64))
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=64, name="attention")(
        inputs, inputs
    )
    hidden = keras.layers.LayerNormalization(name="norm")(keras.layers.Add()([inputs, attended]))
    hidden = keras.layers.Dense(256, activation="relu", name="feed")(hidden)
    hidden = keras.layers.GlobalAveragePooling1D()(hidden)
    outputs = keras.layers.Dense(classes, activation="softmax", name="head")(hidden)
    model = keras.Model(inputs, outputs, name="attention_classifier")
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def labelled(model: keras.Model, samples: int, classes: int = 4, seed: int = 0):
    """Returns `((x, y) train, (x, y) val)`: labels from a fixed random projection (learnable).

    Sequences are labelled from their mean over time, which a pooled model can learn.
    """
    rng = np.random.default_rng(seed)
    shape = tuple(model.inputs[0].shape[1:])
    x = rng.normal(size=(samples, *shape)).astype("float32")
    features = x.mean(axis=1) if len(shape) == 2 else x.reshape(samples, -1)
    projection = rng.normal(size=(features.shape[1], classes)).astype("float32")
    y = np.argmax(features @ projection, axis=1).astype("int32")
    split = samples * 3 // 4
    return (x[:split], y[:split]), (x[split:], y[split:])


def far_regression() -> keras.Model:
    """Wide ReLU layers and a head whose targets sit near 1000: bfloat16 cannot resolve them."""
    inputs = keras.Input((16,))
    hidden = keras.layers.Dense(1024, activation="relu", name="wide1")(inputs)
    hidden = keras.layers.Dense(1024, activation="relu", name="wide2")(hidden)
    outputs = keras.layers.Dense(
        1, name="head", bias_initializer=keras.initializers.Constant(1000.0)
    )(hidden)
    model = keras.Model(inputs, outputs, name="far_regression")
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="mse", metrics=["mae"])
    return model


def far_targets(samples: int = 1024):
    """Returns train and validation data for `far_regression`: 1000 + a small smooth signal."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(samples, 16)).astype("float32")
    weights = rng.normal(size=(16, 1)).astype("float32")
    y = (1000 + 3 * np.tanh(x @ weights / 4)).astype("float32")
    split = samples * 3 // 4
    return (x[:split], y[:split]), (x[split:], y[split:])


@dataclasses.dataclass(frozen=True)
class PreparedSearch:
    """The first stages of a real search, run on a small model: what later stages read."""

    model: keras.Model
    evaluator: object
    context: object


@contextlib.contextmanager
def prepared_search(model=None, data=None, budget=None, **changes):
    """Runs `search()`'s first stages (space, float32 reference, context) on a small model.

    Args:
        model: a compiled model; default `compiled_mlp()`.
        data: `(train, validation)`; default `mlp_data()`.
        budget: a `Budget`; default `val_accuracy` within 0.5.
        **changes: `SearchSettings` fields to change from `FAST_SETTINGS` (`baseline`
            default `None`: training is not lengthened), or `hardware`.

    Yields:
        A `PreparedSearch`; its evaluator is closed afterwards.
    """
    from autoprec.search import Budget, Evaluator
    from autoprec.search.context import SearchContext
    from autoprec.search.driver import prepare

    keywords = fast(**{"baseline": None, **changes})
    settings = keywords["settings"]
    model = compiled_mlp() if model is None else model
    train, val = mlp_data() if data is None else data
    evaluator = Evaluator(
        model,
        take_batches(train, settings.batch_size, settings.steps_per_trial, what="x"),
        take_batches(val, settings.batch_size, settings.validation_steps, what="val"),
        settings.proxy_batches,
        0,
    )
    context = SearchContext(
        model=model,
        evaluator=evaluator,
        budget=budget or Budget("val_accuracy", max_drop=0.5),
        hardware=keywords["hardware"],
        n_trials=2,
        timeout=None,
        storage=None,
        study_name=None,
        study=None,
        sampler=None,
        pruner=None,
        settings=settings,
        verbose=0,
        started=time.perf_counter(),
        train_data=train,
    )
    try:
        yield PreparedSearch(model, evaluator, prepare(context))
    finally:
        evaluator.close()
