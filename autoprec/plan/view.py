"""`PlanView`: the read-only shape of a plan that the plan's operations take."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ..layers import LayerInfo
from .rules import PlanRule


@runtime_checkable
class PlanView(Protocol):
    """What the modules of `autoprec.plan` read from a plan; `PrecisionPlan` is one."""

    @property
    def layers(self) -> Mapping[str, str]: ...

    @property
    def followers(self) -> Mapping[str, str]: ...

    @property
    def rules(self) -> tuple[PlanRule, ...]: ...

    @property
    def default(self) -> str: ...

    @property
    def layer_info(self) -> Mapping[str, LayerInfo]: ...

    @property
    def fingerprint(self) -> str | None: ...

    @property
    def model_name(self) -> str | None: ...

    @property
    def metadata(self) -> Mapping[str, Any]: ...

    @property
    def events(self) -> tuple[Mapping[str, Any], ...]: ...

    @property
    def created(self) -> str: ...

    @property
    def autoprec_version(self) -> str: ...
