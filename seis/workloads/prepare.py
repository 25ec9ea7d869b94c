"""Write every prepared workload file plus a manifest of hashes; byte-identical on every re-run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from seis.workloads.common import (
    DEFAULT_PREPARED_DIR,
    PROJECT_ROOT,
    WorkloadDataError,
    jsonl_bytes,
    sha256_bytes,
    sha256_file,
)
from seis.workloads.gsm8k import GSM8K_ENV, SOURCE_FILES, read_gsm8k_file, resolve_gsm8k_dir, split_gsm8k
from seis.workloads.params import WorkloadParams, load_params
from seis.workloads.retrieval import build_retrieval_items
from seis.workloads.shapes import DevWorkload, HeldOutShapes, build_heldout_shapes, dev_workloads

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
# What the `gsm8k-source` DVC stage records of the GSM8K source (kept in git): `prepare-workloads` depends on it, not
# on the source's path, so the source may lie anywhere ($SEIS_GSM8K_DIR) and dvc.lock is the same in every clone.
GSM8K_SOURCE_RECORD = PROJECT_ROOT / "data" / "gsm8k_source.json"


class FileRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str
    bytes: int = Field(ge=0)
    count: int = Field(ge=0)  # items (JSONL lines, shapes, workloads)


class Manifest(BaseModel):
    """What was prepared from what: the evaluator records its digest next to every verdict."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format_version: int = FORMAT_VERSION
    seed: int
    params: WorkloadParams
    sources: dict[str, FileRecord]  # "gsm8k/test.jsonl", ... (no absolute paths: same manifest anywhere)
    outputs: dict[str, FileRecord]  # file name in the prepared dir -> record
    workload_digests: dict[str, str]  # workload name -> DevWorkload/HeldOutShapes digest

    def digest(self) -> str:
        return sha256_bytes(manifest_bytes(self))


def manifest_bytes(manifest: Manifest) -> bytes:
    return (manifest.model_dump_json(indent=2) + "\n").encode("utf-8")


def _json_bytes(obj: object) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def prepare_all(
    out_dir: str | Path = DEFAULT_PREPARED_DIR,
    gsm8k_dir: str | Path | None = None,
    params: WorkloadParams | None = None,
) -> Manifest:
    """Build every workload and write it under out_dir; params default to the project's params.yaml."""
    params = params or load_params()
    src = resolve_gsm8k_dir(gsm8k_dir)
    rows = _read_sources(src)  # train.jsonl is validated and hashed, not split
    test, dev = split_gsm8k(rows["test.jsonl"], seed=params.seed, test_size=params.gsm8k.test_size,
                            dev_size=params.gsm8k.dev_size, source=str(src / "test.jsonl"))
    retrieval = build_retrieval_items(params.retrieval, params.seed)
    heldout = build_heldout_shapes(params.heldout, params.seed)
    dev_wls = dev_workloads(params.dev, [item.id for item in dev])

    files: dict[str, tuple[bytes, int]] = {
        "gsm8k_test.jsonl": (jsonl_bytes(test), len(test)),
        "gsm8k_dev.jsonl": (jsonl_bytes(dev), len(dev)),
        "retrieval.jsonl": (jsonl_bytes(retrieval), len(retrieval)),
        "heldout_shapes.json": (_json_bytes(heldout.model_dump(mode="json")), len(heldout.shapes)),
        "dev_workloads.json": (_json_bytes([w.model_dump(mode="json") for w in dev_wls]), len(dev_wls)),
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)  # a half-written directory must not look complete
    for name, (data, _) in files.items():
        (out / name).write_bytes(data)

    manifest = Manifest(
        seed=params.seed,
        params=params,
        sources=_source_records(src, rows),
        outputs={name: FileRecord(sha256=sha256_bytes(data), bytes=len(data), count=n)
                 for name, (data, n) in files.items()},
        workload_digests={**{w.name: w.digest() for w in dev_wls}, "heldout_shapes": heldout.digest()},
    )
    (out / MANIFEST).write_bytes(manifest_bytes(manifest))
    return manifest


def _read_sources(src: Path) -> dict[str, list[tuple[str, str]]]:
    return {name: read_gsm8k_file(src / name) for name in SOURCE_FILES}


def _source_records(src: Path, rows: dict[str, list[tuple[str, str]]]) -> dict[str, FileRecord]:
    """Path-free records ("gsm8k/test.jsonl", ...), so the manifest is the same wherever the source lies."""
    return {f"gsm8k/{name}": FileRecord(sha256=sha256_file(src / name), bytes=(src / name).stat().st_size,
                                        count=len(items))
            for name, items in rows.items()}


def gsm8k_source_bytes(gsm8k_dir: str | Path | None = None) -> bytes:
    """The GSM8K source's record as the `gsm8k-source` stage writes it: the manifest's `sources`, as JSON."""
    src = resolve_gsm8k_dir(gsm8k_dir)
    records = _source_records(src, _read_sources(src))
    return _indented_json_bytes({name: record.model_dump(mode="json") for name, record in records.items()})


def record_gsm8k_source(out: str | Path = GSM8K_SOURCE_RECORD) -> int:
    """The `gsm8k-source` DVC stage (always run: DVC cannot see a source outside the repository); an exit status.

    A clone without the source keeps the committed record when $SEIS_GSM8K_DIR is unset, so that after `dvc pull`
    `dvc repro` finds data/prepared up to date instead of failing; a wrong $SEIS_GSM8K_DIR still fails."""
    out = Path(out)
    try:
        data = gsm8k_source_bytes()
    except WorkloadDataError as exc:
        if os.environ.get(GSM8K_ENV) or not out.is_file():
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"note: keeping the recorded GSM8K source {out}: {exc}", file=sys.stderr)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(data)
    return 0


def _indented_json_bytes(obj: object) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


def load_manifest(prepared_dir: str | Path | None = None) -> Manifest:
    path = Path(prepared_dir or DEFAULT_PREPARED_DIR) / MANIFEST
    if not path.is_file():
        raise WorkloadDataError(f"manifest not found: {path}; run `python -m seis.workloads prepare`")
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except ValueError as exc:
        raise WorkloadDataError(f"{path}: invalid manifest: {exc}") from exc


def verify_prepared(prepared_dir: str | Path | None = None) -> Manifest:
    """The manifest, after checking every output's sha256; raises naming the first file that differs."""
    root = Path(prepared_dir or DEFAULT_PREPARED_DIR)
    manifest = load_manifest(root)
    for name, record in manifest.outputs.items():
        path = root / name
        if not path.is_file():
            raise WorkloadDataError(f"prepared file missing: {path}")
        if sha256_file(path) != record.sha256:
            raise WorkloadDataError(f"prepared file changed since the manifest was written: {path}")
    return manifest


def load_heldout_shapes(prepared_dir: str | Path | None = None) -> HeldOutShapes:
    path = Path(prepared_dir or DEFAULT_PREPARED_DIR) / "heldout_shapes.json"
    if not path.is_file():
        raise WorkloadDataError(f"prepared file not found: {path}; run `python -m seis.workloads prepare`")
    try:
        return HeldOutShapes.model_validate_json(path.read_bytes())
    except ValueError as exc:
        raise WorkloadDataError(f"{path}: invalid held-out shapes: {exc}") from exc


def load_dev_workloads(prepared_dir: str | Path | None = None) -> list[DevWorkload]:
    path = Path(prepared_dir or DEFAULT_PREPARED_DIR) / "dev_workloads.json"
    if not path.is_file():
        raise WorkloadDataError(f"prepared file not found: {path}; run `python -m seis.workloads prepare`")
    try:
        return TypeAdapter(list[DevWorkload]).validate_json(path.read_bytes())
    except ValueError as exc:
        raise WorkloadDataError(f"{path}: invalid dev workloads: {exc}") from exc


def ensure_prepared(prepared_dir: str | Path | None = None) -> Path:
    """The default workloads are prepared on first use and again when params.yaml changed (deterministic, from the
    GSM8K source), as `dvc repro prepare-workloads` would; an explicitly named directory must already exist."""
    root = Path(prepared_dir or DEFAULT_PREPARED_DIR)
    if prepared_dir is None and _needs_preparing(root):
        import filelock
        root.parent.mkdir(parents=True, exist_ok=True)
        # Two processes of one checkout (parallel test workers, two runs) must not write the same files at once.
        with filelock.FileLock(root.parent / f".{root.name}.lock"):
            if _needs_preparing(root):
                prepare_all(root)
    return root


def _needs_preparing(root: Path) -> bool:
    return not (root / MANIFEST).is_file() or _stale(root)


def _stale(root: Path) -> bool:
    """The default directory was prepared under other parameters than params.yaml's (it is re-made, as `dvc repro`
    would)."""
    try:
        return load_manifest(root).params != load_params()
    except WorkloadDataError:
        return True
