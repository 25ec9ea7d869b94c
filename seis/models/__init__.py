"""Model directories for SEIS engines: named models materialized as HF-format directories in a cache.

    from seis.models import resolve_model
    model_dir = resolve_model("tiny-qwen3")      # prepared under $SEIS_CACHE/models on first use
    model_dir = resolve_model("/path/to/hf/dir")  # validated, returned as-is

Heavy libraries (torch, transformers) are imported only when a model is actually built.
"""
from .cache import cache_dir
from .errors import ModelError
from .model_config import ModelConfig, read_model_config
from .registry import ModelEntry
from .resolve import ModelStatus, list_models, prepare_model, resolve_model

__all__ = ["ModelConfig", "ModelEntry", "ModelError", "ModelStatus", "cache_dir", "list_models", "prepare_model", "read_model_config", "resolve_model"]
