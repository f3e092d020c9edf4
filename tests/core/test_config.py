"""`autoprec._core.models.ConfigValue`: settings round-trip through a dict; unknown keys are refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autoprec import Guard, LossScale, SearchSettings
from autoprec._core.models import ConfigValue
from autoprec.errors import AutoprecError


@dataclasses.dataclass(frozen=True)
class Window(ConfigValue):
    steps: int = 10
    name: str = "window"


def test_get_config_and_from_config_round_trip():
    window = Window(steps=3)
    assert window.get_config() == {"steps": 3, "name": "window"}
    assert Window.from_config(window.get_config()) == window
    assert Window.from_config(json.loads(json.dumps(window.get_config()))) == window


def test_missing_fields_take_their_defaults():
    assert Window.from_config({}) == Window()
    assert Window.from_config({"name": "w"}) == Window(steps=10, name="w")


def test_unknown_keys_are_refused_with_the_fields_listed():
    with pytest.raises(AutoprecError) as error:
        Window.from_config({"steps": 3, "stpes": 4, "extra": 1})
    assert str(error.value) == (
        "Window.from_config: unknown field(s) ['extra', 'stpes']; the fields are ['steps', 'name']."
    )


@pytest.mark.parametrize("settings", [Guard(), LossScale(), SearchSettings()])
def test_the_library_settings_round_trip(settings):
    assert type(settings).from_config(settings.get_config()) == settings
