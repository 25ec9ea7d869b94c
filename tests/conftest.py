"""Shared fixtures: prepared models and the vanilla engine package (E0)."""
from __future__ import annotations

import pytest
import torch

from seis.engine_import import ENGINE_TEMPLATE, import_engine

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def E():
    """The E0 engine package (`engine`), imported from engine_template/."""
    return import_engine(ENGINE_TEMPLATE)
