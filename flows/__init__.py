"""Prefect flows of SEIS."""
from .runtime import apply as _apply_prefect_defaults

_apply_prefect_defaults()
