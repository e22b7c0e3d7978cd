#!/usr/bin/env python3
"""A JSON-lines manifest -> a checked manifest with normalised audio paths.

    python recipes/data/prepare_jsonl.py other-tool.jsonl --out data/mine.jsonl

Every line is checked as `speechstream eval` checks it (id and audio present, unique ids, field types, audio
files exist; --check-audio also opens them); audio paths are resolved against the input's folder and written
relative to the output's folder when the audio lies under it, else absolute. Other fields are kept.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.corpora import jsonl_entries, recipe_parser, run_main, write_from_args  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    command = recipe_parser(__doc__)
    command.add_argument("manifest", help="input manifest (JSON lines)")
    args = command.parse_args(argv)
    write_from_args(jsonl_entries(args.manifest), args)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
