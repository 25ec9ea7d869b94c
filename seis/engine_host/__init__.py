"""Run an engine directory in a child process and talk to it over JSON lines (the engine contract, remotely)."""
from .client import EngineError, EngineExited, EngineProcess, EngineTimeout

__all__ = ["EngineError", "EngineExited", "EngineProcess", "EngineTimeout"]
