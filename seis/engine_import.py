"""Import an engine package from a directory (only ever inside a process that exists to host that engine)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

ENGINE_TEMPLATE = Path(__file__).resolve().parent.parent / "engine_template"
CONTRACT_FILE = "CONTRACT.md"


def check_engine_dir(engine_dir: str | Path) -> Path:
    path = Path(engine_dir).resolve()
    if not path.is_dir():
        raise ValueError(f"engine dir {path} {'is not a directory' if path.exists() else 'does not exist'}")
    if not (path / "engine" / "__init__.py").is_file():
        raise ValueError(f"engine dir {path} has no package 'engine' (engine/__init__.py); see {CONTRACT_FILE}")
    return path


def import_engine(engine_dir: str | Path) -> ModuleType:
    """Import `engine` from engine_dir. A process may host only one engine directory."""
    path = check_engine_dir(engine_dir)
    loaded = sys.modules.get("engine")
    if loaded is not None:
        if Path(loaded.__file__).resolve().parent.parent != path:
            raise RuntimeError(f"this process already hosts the engine from {loaded.__file__}")
        return loaded
    sys.path.insert(0, str(path))
    module = importlib.import_module("engine")
    if Path(module.__file__).resolve().parent.parent != path:
        raise RuntimeError(f"'engine' resolved to {module.__file__}, not inside {path}")
    return module
