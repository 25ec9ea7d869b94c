"""The offline agent: deterministic, no network, transformations from a library kept outside the engine."""
from .agent import OfflineAgent, exploration_order
from .library import LIBRARY_DIR, Transformation, load_library
from .merge import (MergeResult, apply_transformation, is_present, merge_file, merge_transformation,
                    present_in)

__all__ = ["LIBRARY_DIR", "MergeResult", "OfflineAgent", "Transformation", "apply_transformation",
           "exploration_order", "is_present", "load_library", "merge_file", "merge_transformation", "present_in"]
