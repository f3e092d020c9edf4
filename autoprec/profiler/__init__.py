"""Per-layer value ranges of a model in training: probes, `profile()`, `ProfileCallback`, `Profile`.

The profiler records, for every layer (by its stable autoprec path, see
`autoprec.layers`), over a few real training steps:

* **activations**: each floating-point output of the layer (tuples and dicts
  of outputs are probed tensor by tensor; integer outputs are skipped);
* **activation gradients**: the gradient of the loss with respect to each
  of those outputs;
* **weight gradients**: the gradient of each trainable weight, exactly as the
  train step passes it to the optimizer (divided by the loss scale when the
  optimizer scales the loss);
* **weights**: the values of each trainable weight, read every step before
  the update;
* **internals**: intermediates computed inside a layer that never appear as a
  layer output. Covered: the attention logits of `MultiHeadAttention` (and
  subclasses) as they are computed in the compute dtype of the query/key
  projections. On the fused path Keras 3 takes by default (no dropout, no
  returned scores) TensorFlow and JAX compute `einsum(query, key)` *before*
  scaling by `1/sqrt(key_dim)`, so the unscaled product is what must fit;
  with attention dropout or returned scores Keras scales the query first and
  the scaled scores are recorded. The logits are recomputed in float32 beside
  the layer's own computation (one extra einsum, forward only), the same on
  every backend (JAX's fused kernel accumulates that product in float32
  itself, so there the recorded logits are a bound it does not have to meet).

Every tensor is summarised by a `TensorStats`: element count, zeros,
non-finite values, largest and smallest non-zero magnitude, mean magnitude,
RMS and an exponent histogram (see `autoprec.numerics`). Statistics are
summed over the recorded steps (and replicas).

The probes run inside the compiled train step of `model.fit` (the model's
own `tf.function` or jitted JAX step): each probed layer's `call` is
replaced, on the instance, by a wrapper that passes its outputs through a
recording identity (forward values and the gradient flowing back), and the
backend's step hooks (`autoprec._backends.probe_hooks`) wrap the train step
and the optimizer for weights and weight gradients. On TensorFlow the
statistics accumulate in variables inside the graph; on JAX, whose train step
is pure, each step returns its statistics with its logs (no host callback, so
a `keras.distribution` over several devices profiles the whole batch) and the
host adds them up. Both give the same `Profile`, histograms and JSON for the
same model, weights and batches. Removing the probes restores the original
methods and rebuilds the train function, so nothing of the profiler remains
in the compiled step.

The package has one module per job: the statistics model in `layout` (the
names of what a profile holds, the read-only shapes of its values),
`tensor_stats` (`TensorStats`), `float8_ranges` (`Float8TensorRange`,
`Float8Ranges`) and `stats` (`LayerProfile`, `Profile`); `merge` (merging
statistics), `profile_json` (the profile's JSON), `probes` (which layers are
probed; `ProbeSession` installs, reads and removes the probes), `runner`
(`profile()`, `ProfileCallback`) and `views` (summary table, heat map,
TensorBoard histograms).

Layers that are not probed: pass-through layers (`autoprec.layers.is_pass_through`:
their values are a copy or selection of their input and they take their
producer's dtype) unless `include_pass_through=True`, and nested
Sequential/Functional models (their outputs are their last layers' outputs).

Example:

```python
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
prof = autoprec.profile(model, (x_train, y_train), steps=20)
print(prof.summary())
prof.layers["dense"].float16_safe
prof.save("profile.json")
```
"""

from .float8_ranges import Float8Ranges, Float8TensorRange
from .probes import ProbeSession
from .runner import ProfileCallback, ProfileData, profile
from .stats import LayerProfile, Profile
from .tensor_stats import TensorStats

__all__ = [
    "Float8Ranges",
    "Float8TensorRange",
    "LayerProfile",
    "ProbeSession",
    "Profile",
    "ProfileCallback",
    "ProfileData",
    "TensorStats",
    "profile",
]
