"""`ConfigValue`: the one `get_config` / `from_config` round trip of autoprec's frozen settings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from ..errors import AutoprecError

Value = TypeVar("Value", bound="ConfigValue")


class ConfigValue:
    """A frozen dataclass of settings that round-trips through a plain dict, as Keras objects do."""

    def get_config(self) -> dict[str, Any]:
        """Returns the settings as a plain dict (`from_config` builds them back)."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    @classmethod
    def from_config(cls: type[Value], config: Mapping[str, Any]) -> Value:
        """Returns the settings that `get_config()` described; unknown keys are refused."""
        fields = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(config) - set(fields))
        if unknown:
            raise AutoprecError(
                f"{cls.__name__}.from_config: unknown field(s) {unknown}; the fields are {fields}."
            )
        return cls(**config)
