"""The one interface between the profiler's `ProbeSession` and a Keras backend.

`autoprec.profiler.ProbeSession` decides *what* a train step records: which
layers' outputs, which weights, under which names. What differs per backend is
*how* the values are measured inside the compiled step and how they leave it,
and that is all a backend module provides, under the same names:

- `tensorflow`: statistic variables (one copy per replica under a
  `tf.distribute` strategy) updated inside the traced step by custom-gradient
  identities and a wrapped `apply_gradients`;
- `jax_probes`: the train step is a pure function, so each step's statistics
  are returned with its logs: forward values and activation gradients leave
  the differentiated loss function as gradients of zero-valued "sink" inputs,
  weights and weight gradients come from the wrapped `stateless_apply`, and
  the host adds the steps up.

Each module has a `ProbeHooks` class (the protocol below, built with
`ProbeHooks(xla)`), `is_float_tensor(value)`, `xla_can_host_probes()` and
`write_histograms(logdir, series, step, description)`;
`autoprec._backends.profiler_backend()` picks the module once for the active
backend. A slot names one recorded tensor: `(layer path, kind, key)`, with the
kinds of `autoprec.profiler.stats.TENSOR_KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeAlias, runtime_checkable

import numpy as np

#: One recorded tensor: `(layer path, kind, key)`, e.g. `("dense", "activations", "output")`.
Slot: TypeAlias = tuple[str, str, str]

#: How the hooks replace a method for as long as the probes are installed:
#: `replace(owner, name, value)` (the session restores it on `remove`).
Replace = Callable[[object, str, object], None]

#: `{id(variable): (layer path, weight name)}` of the model's trainable weights.
WeightOwners = Mapping[int, tuple[str, str]]

#: What `write_histograms` writes: `(tag, exponents, counts)` triples, bucket `i`
#: spanning `[exponents[i], exponents[i] + 1)`.
HistogramSeries = Iterable[tuple[str, np.ndarray, np.ndarray]]


@runtime_checkable
class ProbeHooks(Protocol):
    """What each backend module's `ProbeHooks(xla)` provides to the profiler's session."""

    @property
    def recording(self) -> bool:
        """Whether a train step of these hooks is being traced now (layer calls probe then)."""

    @property
    def tensor_count(self) -> int:
        """Number of slots seen so far (0 until the first probed step is traced)."""

    def install_step(self, model: Any, owners: WeightOwners, replace: Replace) -> None:
        """Wraps the model's train step and its optimizer so that each step records.

        Weights and weight gradients are recorded here, under
        `(path, "weights", name)` and `(path, "weight_gradients", name)`.
        """

    def rebuild_train_function(self, model: Any) -> None:
        """Rebuilds the model's train function, also between two steps of a running `fit`."""

    def probe(self, tensor: Any, forward: Slot, backward: Slot) -> Any:
        """Returns `tensor` through an identity recording it and the gradient flowing into it."""

    def record(self, slot: Slot, tensor: Any) -> None:
        """Records a forward value that needs no gradient (an internal such as attention logits)."""

    def read(self) -> dict[Slot, tuple[np.ndarray, np.ndarray]]:
        """Returns `{slot: (int64 counts, float64 floats)}` summed over steps and replicas.

        The counts and floats are those `autoprec.profiler.TensorStats.from_raw` takes.
        """

    def steps_recorded(self) -> int:
        """Returns the number of train steps run with the probes so far."""
