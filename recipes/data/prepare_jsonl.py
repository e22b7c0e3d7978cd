#!/usr/bin/env python3
"""JSON-lines manifests -> one checked manifest with normalised audio paths.

    python recipes/data/prepare_jsonl.py other-tool.jsonl --out data/mine.jsonl
    python recipes/data/prepare_jsonl.py data/a/train.jsonl data/b/train.jsonl --prefix-ids --out data/ab.jsonl

With several inputs the lines are concatenated in order; --prefix-ids makes ids unique across them by
prefixing each with its manifest's folder name ("a-tr-000001").

Every line is checked as `speechstream eval` checks it (id and audio present, unique ids, field types, audio
files exist; --check-audio also opens them); audio paths are resolved against the input's folder and written
relative to the output's folder when the audio lies under it, else absolute. Other fields are kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.corpora import jsonl_entries, path_text, recipe_parser, run_main, write_from_args  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    command = recipe_parser(__doc__)
    command.add_argument("manifest", nargs="+", type=path_text, help="input manifests (JSON lines)")
    command.add_argument("--prefix-ids", action="store_true",
                         help="prefix every id with its manifest's folder name")
    args = command.parse_args(argv)
    write_from_args(combined(args.manifest, args.prefix_ids), args)
    return 0


def combined(manifests: list[str], prefix_ids: bool) -> Iterator[dict]:
    """The entries of every manifest in order; ids prefixed by the manifest's folder name on request (the folder as
    named, "." and ".." steps taken: a folder that is a link to one elsewhere gives its own name, not its target's)."""
    for manifest in manifests:
        prefix = Path(os.path.abspath(manifest)).parent.name + "-" if prefix_ids else ""
        for entry in jsonl_entries(manifest):
            yield entry | {"id": prefix + str(entry["id"])}


if __name__ == "__main__":
    sys.exit(run_main(main))
