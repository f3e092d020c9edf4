"""`ConfigValue`: the one `get_config` / `from_config` round trip of autoprec's frozen settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from ..errors import AutoprecError

Value = TypeVar("Value", bound="ConfigValue")


class ConfigValue:
    """A frozen dataclass of settings that round-trips through a plain dict, as Keras objects do.

    Subclasses are `@dataclasses.dataclass(frozen=True)` classes; they get
    `get_config()` and `from_config(config)`, which refuses unknown keys with a message
    that lists the fields.

    Example:

    ```python
    import dataclasses
    from autoprec._core.config import ConfigValue

    @dataclasses.dataclass(frozen=True)
    class Window(ConfigValue):
        steps: int = 10

    Window.from_config(Window(steps=3).get_config())  # Window(steps=3)
    ```
    """

    def get_config(self) -> dict[str, Any]:
        """Returns the settings as a plain dict (`from_config` builds them back)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    @classmethod
    def from_config(cls: type[Value], config: Mapping[str, Any]) -> Value:
        """Returns the settings that `get_config()` described; unknown keys are refused.

        Args:
            config: a dict with some or all of the fields.

        Returns:
            The settings, the missing fields at their defaults.

        Raises:
            AutoprecError: for a key that is not a field (the message lists the fields).
        """
        fields = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(config) - set(fields))
        if unknown:
            raise AutoprecError(
                f"{cls.__name__}.from_config: unknown field(s) {unknown}; the fields are {fields}."
            )
        return cls(**config)
