"""`python -m seis.workloads prepare --out data/prepared [--gsm8k-dir DIR] [--params params.yaml]`
and `python -m seis.workloads verify [--dir data/prepared]`. Argparse keeps this free of heavy imports."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seis.workloads.common import DEFAULT_PREPARED_DIR, WorkloadDataError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seis.workloads", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="build every workload file and manifest.json")
    prep.add_argument("--out", type=Path, default=DEFAULT_PREPARED_DIR, help="output directory")
    prep.add_argument("--gsm8k-dir", type=Path, default=None,
                      help="dir with test.jsonl/train.jsonl (default: $SEIS_GSM8K_DIR or ../shared/data/gsm8k)")
    prep.add_argument("--params", type=Path, default=None, help="params.yaml (default: the project's)")
    ver = sub.add_parser("verify", help="check prepared files against manifest.json")
    ver.add_argument("--dir", type=Path, default=DEFAULT_PREPARED_DIR, help="prepared directory")
    args = parser.parse_args(argv)

    from seis.writable import unwritable
    if args.command == "prepare" and (problem := unwritable(args.out, "--out")) is not None:
        print(f"error: {problem}", file=sys.stderr)   # found now, not as a traceback after the work
        return 2

    from seis.workloads.params import load_params
    from seis.workloads.prepare import prepare_all, verify_prepared

    try:
        if args.command == "prepare":
            manifest = prepare_all(args.out, gsm8k_dir=args.gsm8k_dir, params=load_params(args.params))
            where = args.out
        else:
            manifest = verify_prepared(args.dir)
            where = args.dir
    except WorkloadDataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{name}={rec.count}" for name, rec in manifest.outputs.items())
    print(f"{args.command} ok: {where} ({counts}); manifest sha256 {manifest.digest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
