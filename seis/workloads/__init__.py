"""Evaluator workloads: GSM8K splits, long-context retrieval, dev and held-out speed shapes.

Prepared deterministically by `python -m seis.workloads prepare --out data/prepared` (the DVC stage
`prepare-workloads`); everything here is plain Python + pydantic, no heavy imports.
"""

from seis.workloads.answers import extract_answer, is_correct, normalize_number
from seis.workloads.common import DEFAULT_PREPARED_DIR, WorkloadDataError
from seis.workloads.gsm8k import GSM8KItem, gsm8k_messages, load_gsm8k_split, resolve_gsm8k_dir, timed_question
from seis.workloads.params import WorkloadParams, load_params
from seis.workloads.prepare import (
    FileRecord,
    Manifest,
    load_dev_workloads,
    load_heldout_shapes,
    load_manifest,
    ensure_prepared,
    prepare_all,
    verify_prepared,
)
from seis.workloads.retrieval import RetrievalItem, load_retrieval, retrieval_messages, score_retrieval
from seis.workloads.shapes import DevWorkload, HeldOutShape, HeldOutShapes

__all__ = [
    "DEFAULT_PREPARED_DIR",
    "DevWorkload",
    "FileRecord",
    "GSM8KItem",
    "HeldOutShape",
    "HeldOutShapes",
    "Manifest",
    "RetrievalItem",
    "WorkloadDataError",
    "WorkloadParams",
    "extract_answer",
    "gsm8k_messages",
    "timed_question",
    "is_correct",
    "load_dev_workloads",
    "load_gsm8k_split",
    "load_heldout_shapes",
    "load_manifest",
    "load_params",
    "load_retrieval",
    "normalize_number",
    "ensure_prepared",
    "prepare_all",
    "resolve_gsm8k_dir",
    "retrieval_messages",
    "score_retrieval",
    "verify_prepared",
]
