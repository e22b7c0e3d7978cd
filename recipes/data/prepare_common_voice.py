#!/usr/bin/env python3
"""Common Voice -> manifest (ASR: text only).

    python recipes/data/prepare_common_voice.py /data/cv-corpus/en --tsv test.tsv --lang en --out data/cv-en-test.jsonl

ROOT is one language's Common Voice folder: the TSV (validated.tsv, test.tsv, dev.tsv, ...; columns path and
sentence) and clips/. Clips are mp3; speechstream reads them through libsndfile (1.1 or newer).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.corpora import (common_voice_entries, path_text, recipe_parser, require_names,  # noqa: E402
                                       run_main, write_from_args)


def main(argv: list[str] | None = None) -> int:
    command = recipe_parser(__doc__)
    command.add_argument("root", type=path_text, help="a Common Voice language folder (TSVs and clips/)")
    command.add_argument("--tsv", default="test.tsv", help="the TSV to read (default: test.tsv)")
    command.add_argument("--lang", default="en", help="language of the speech (default: en)")
    args = command.parse_args(argv)
    require_names("--lang", args.lang)
    require_names("--tsv", args.tsv)
    write_from_args(common_voice_entries(args.root, args.tsv, args.lang), args)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
