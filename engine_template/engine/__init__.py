"""A small paged-KV inference engine (Qwen3 / Llama). See ../CONTRACT.md for what callers may rely on."""
from .engine import Engine, EngineOptions
from .request import Generation, Score
from .sampling import SamplingParams

__all__ = ["Engine", "EngineOptions", "Generation", "SamplingParams", "Score"]
