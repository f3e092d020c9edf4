"""Synthetic data the benchmarks' models learn from (NumPy; nothing downloaded).

Each generator takes a NumPy `Generator` and a sample count first, so one seed gives
the same data in every benchmark and process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: Classes of every classifier here.
CLASSES = 10


def marker_tokens(
    rng: np.random.Generator,
    samples: int,
    length: int | None,
    vocabulary: int,
    classes: int = CLASSES,
) -> tuple[np.ndarray, np.ndarray]:
    """Random tokens with the class id (a token below `classes`) at about a quarter of positions."""
    labels = rng.integers(0, classes, samples).astype("int32")
    tokens = rng.integers(classes, vocabulary, (samples, length))
    marked = rng.random((samples, length)) < 0.25
    return np.where(marked, labels[:, None], tokens).astype("int32"), labels


def next_tokens(
    rng: np.random.Generator, samples: int, length: int | None, vocabulary: int, low: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """Tokens from `low` to `vocabulary - 1`; the target at each position a fixed function of its token."""
    tokens = rng.integers(low, vocabulary, (samples, length)).astype("int32")
    return tokens, ((tokens * 7 + 3) % vocabulary).astype("int32")


def offset_images(
    rng: np.random.Generator, samples: int, size: int | None, classes: int = CLASSES
) -> tuple[np.ndarray, np.ndarray]:
    """Noise images with a per-class channel offset (learnable through pooling)."""
    pattern = np.random.default_rng(1234).normal(size=(classes, 1, 1, 3))
    labels = rng.integers(0, classes, samples).astype("int32")
    images = rng.normal(size=(samples, size, size, 3)) + 1.5 * pattern[labels]
    return images.astype("float32"), labels


def seeded(generate: Callable[..., Any], *shape: Any) -> Callable[[int, int], tuple]:
    """`data(seed, samples)`: `generate(np.random.default_rng(seed), samples, *shape)`."""
    return lambda seed, samples: generate(np.random.default_rng(seed), samples, *shape)
