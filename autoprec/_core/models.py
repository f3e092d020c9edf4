"""Keras helpers every stage shares: strategy scope, optimizers, compile arguments, one read of a
model per state (`ModelMemo`), `ConfigValue` settings and `show_message`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import sys
import weakref
from collections.abc import Callable, Hashable, Mapping
from typing import Any, TypeVar

import keras

from ..errors import AutoprecError


def strategy_scope(model: keras.Model) -> contextlib.AbstractContextManager:
    """Returns the model's `tf.distribute` strategy scope, or a no-op context without one."""
    strategy = getattr(model, "distribute_strategy", None)
    if strategy is not None and hasattr(strategy, "scope"):
        return strategy.scope()
    return contextlib.nullcontext()


def inner_optimizer(optimizer: Any) -> Any:
    """Returns the optimizer inside a `LossScaleOptimizer`, or `optimizer` itself."""
    return getattr(optimizer, "inner_optimizer", None) or optimizer


def fresh_optimizer(optimizer: Any) -> keras.optimizers.Optimizer:
    """Returns a new optimizer of the same class and config, without state or loss scaling."""
    if optimizer is None:
        return keras.optimizers.Adam()
    inner = inner_optimizer(optimizer)
    return type(inner).from_config(inner.get_config())


def compile_arguments(model: keras.Model, what: str) -> dict[str, Any]:
    """Returns the model's compile arguments with a fresh optimizer, to compile a copy alike."""
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise AutoprecError(
            f"{what}: model {model.name!r} is not compiled. Compile it with the optimizer, "
            "loss and metrics you train with; copies are trained the same way."
        )
    config = model.get_compile_config() or {}
    original = getattr(model, "_compile_config", None)
    original = getattr(original, "config", {}) or {}
    arguments: dict[str, Any] = {
        key: config[key]
        for key in ("loss", "loss_weights", "metrics", "weighted_metrics", "jit_compile")
        if key in config
    }
    try:
        optimizer = keras.optimizers.deserialize(config["optimizer"])
    except Exception:  # noqa: BLE001 - a custom optimizer without a registered config
        optimizer = fresh_optimizer(model.optimizer)
    arguments["optimizer"] = inner_optimizer(optimizer)
    for key in ("loss", "metrics", "weighted_metrics"):
        if key in original and not _is_plain(arguments.get(key)):
            arguments[key] = original[key]
    return arguments


def _is_plain(value: Any) -> bool:
    return all(isinstance(item, (str, dict, type(None))) for item in keras.tree.flatten(value))


def recompile(model: keras.Model, arguments: Mapping[str, Any]) -> None:
    """Compiles `model` with `compile_arguments` output and a fresh copy of its optimizer."""
    remaining = dict(arguments)
    optimizer = remaining.pop("optimizer")
    remaining = {key: value for key, value in remaining.items() if value is not None}
    for key in ("loss", "metrics", "weighted_metrics"):
        if key in remaining:
            remaining[key] = _deserialize_tree(remaining[key], key)
    model.compile(optimizer=fresh_optimizer(optimizer), **remaining)


def _deserialize_tree(value: Any, key: str) -> Any:
    if isinstance(value, dict) and "class_name" in value:
        module = keras.losses if key == "loss" else keras.metrics
        return module.deserialize(value)
    if isinstance(value, list):
        return [_deserialize_tree(item, key) for item in value]
    if isinstance(value, dict):
        return {name: _deserialize_tree(item, key) for name, item in value.items()}
    return value


def swap_attribute(owner: object, name: str, value: object) -> Callable[[], None]:
    """Sets `owner.name = value` on the instance (or class) itself; returns what undoes it."""
    is_class = isinstance(owner, type)
    had_own = name in vars(owner)
    previous = vars(owner).get(name)
    (setattr if is_class else object.__setattr__)(owner, name, value)

    def undo() -> None:
        if had_own:
            (setattr if is_class else object.__setattr__)(owner, name, previous)
        elif name in vars(owner):
            (delattr if is_class else object.__delattr__)(owner, name)

    return undo


def rebuild_train_function(model: keras.Model) -> None:
    """Rebuilds `model`'s train function from inside `fit`, so new policies take effect."""
    sync_fit_state(model)
    model.make_train_function(force=True)


def sync_fit_state(model: keras.Model) -> None:
    """Writes the variables JAX's `fit` holds in its own state back to the model, mid-`fit`."""
    sync = getattr(model, "jax_state_sync", None)
    if callable(sync):
        sync()


Value = TypeVar("Value")

#: Keys kept per model and memo: a model read at a few batch signatures keeps each.
KEYS_PER_MODEL = 8


class ModelMemo:
    """Keeps one computed value per live model and key, and counts reads and reuses."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reads = 0
        self.hits = 0
        self._entries: weakref.WeakKeyDictionary[Any, dict[Hashable, Any]] = (
            weakref.WeakKeyDictionary()
        )

    def get(self, model: Any, key: Hashable, read: Callable[[], Value]) -> Value:
        """Returns the value kept for `model` and `key`, reading it with `read()` the first time."""
        try:
            kept = self._entries.setdefault(model, {})
        except TypeError:  # not weakly referenceable: read every time
            self.reads += 1
            return read()
        if key in kept:
            self.hits += 1
            return kept[key]
        value = read()
        self.reads += 1
        if len(kept) >= KEYS_PER_MODEL:
            kept.pop(next(iter(kept)))
        kept[key] = value
        return value

    def __len__(self) -> int:
        """Returns how many live models have values kept."""
        return len(self._entries)

    def __repr__(self) -> str:
        return f"ModelMemo({self.name!r}, reads={self.reads}, hits={self.hits})"


def structure_key(model: keras.layers.Layer) -> tuple:
    """Returns a key that changes when a model is built, rebuilt or gains or loses variables."""
    return (
        bool(getattr(model, "built", False)),
        tuple((id(variable), tuple(variable.shape)) for variable in model.weights),
    )


Settings = TypeVar("Settings", bound="ConfigValue")


class ConfigValue:
    """A frozen dataclass of settings that round-trips through a plain dict, as Keras objects do."""

    def get_config(self) -> dict[str, Any]:
        """Returns the settings as a plain dict (`from_config` builds them back)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    @classmethod
    def from_config(cls: type[Settings], config: Mapping[str, Any]) -> Settings:
        """Returns the settings that `get_config()` described; unknown keys are refused."""
        fields = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(config) - set(fields))
        if unknown:
            raise AutoprecError(
                f"{cls.__name__}.from_config: unknown field(s) {unknown}; the fields are {fields}."
            )
        return cls(**config)


logger = logging.getLogger("autoprec")

#: The (layer, what is lost) pairs already warned about in this process.
_WARNED_MODEL_CODE: set[tuple[str, str]] = set()
#: Lines Keras wraps an error in, which say where it happened but not what.
_WRAPPER_LINE = re.compile(
    r"^(Exception encountered when calling|Arguments received by|•|Could not automatically infer"
    r"|Error encountered:?$)"
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def error_lines(error: BaseException) -> list[str]:
    """Returns the non-empty lines of `error`'s message, without terminal colours."""
    return [line.strip() for line in _ANSI.sub("", str(error)).splitlines() if line.strip()]


def error_line(error: BaseException) -> str:
    """Returns `"ErrorType: line"` with the first line of a (Keras-wrapped) error that says what."""
    lines = error_lines(error)
    told = [line for line in lines if not _WRAPPER_LINE.match(line)] or lines
    return f"{type(error).__name__}: {told[0] if told else ''}"[:300]


def call_model_code(call: Callable[[], Value], *, layer: str, lost: str, fallback: Value) -> Value:
    """Runs model code for autoprec's own use: its exception becomes one warning saying what is
    `lost` (once per layer and loss); autoprec's own errors still raise."""
    try:
        return call()
    except AutoprecError:
        raise
    except Exception as error:  # noqa: BLE001 - model code may raise anything
        key = (layer, lost)
        if key not in _WARNED_MODEL_CODE:
            _WARNED_MODEL_CODE.add(key)
            logger.warning(
                "autoprec: %s raised %s; %s. Training goes on.", layer, error_line(error), lost
            )
        return fallback


def show_message(message: str, verbose: int = 1, level: int = logging.INFO) -> None:
    """Shows one line of progress or a warning, where Keras shows its own."""
    interactive = keras.config.is_interactive_logging_enabled()
    if verbose and interactive:
        sys.stdout.write(message + "\n")
        sys.stdout.flush()
    if level >= logging.WARNING or (verbose and not interactive):
        logger.log(level, message)
