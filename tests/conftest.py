"""Shared fixtures: prepared models and the vanilla engine package (E0)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from seis.engine_import import ENGINE_TEMPLATE, import_engine

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def E():
    """The E0 engine package (`engine`), imported from engine_template/."""
    return import_engine(ENGINE_TEMPLATE)


@pytest.fixture(scope="session")
def prepared_dir() -> Path:
    """The prepared workloads (data/prepared), made from the GSM8K source on first use."""
    from seis.workloads import WorkloadDataError, ensure_prepared
    try:
        return ensure_prepared()
    except WorkloadDataError as e:  # no GSM8K source on this machine (../shared/data/gsm8k or $SEIS_GSM8K_DIR)
        pytest.skip(f"no prepared workloads and no GSM8K source: {e}")
