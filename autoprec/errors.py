"""Exceptions raised by autoprec."""


class AutoprecError(Exception):
    """Base class of every error autoprec raises on purpose."""


class PlanError(AutoprecError, ValueError):
    """A precision plan is malformed, does not fit the model, or names an unknown layer."""


class ProfileError(AutoprecError, ValueError):
    """A profile file is malformed or a profile cannot be recorded for a model."""


class HardwareError(AutoprecError, ValueError):
    """A hardware profile is unknown or a hardware profile file is malformed."""


class BackendError(AutoprecError, RuntimeError):
    """A feature is not available on the active Keras backend."""
