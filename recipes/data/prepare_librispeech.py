#!/usr/bin/env python3
"""LibriSpeech -> manifest.

    python recipes/data/prepare_librispeech.py /data/LibriSpeech --subset test-clean --out data/test-clean.jsonl

ROOT is the LibriSpeech folder (--subset picks subset folders; none: every transcript under ROOT) or one subset
folder. Transcripts are written in lower case (--keep-case: upper case, as published).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.corpora import (librispeech_entries, path_text, recipe_parser, require_names,  # noqa: E402
                                       run_main, write_from_args)


def main(argv: list[str] | None = None) -> int:
    command = recipe_parser(__doc__)
    command.add_argument("root", type=path_text, help="LibriSpeech folder or one subset folder")
    command.add_argument("--subset", action="append", default=[], help="subset folder under ROOT (repeatable)")
    command.add_argument("--keep-case", action="store_true", help="keep the upper-case transcripts")
    args = command.parse_args(argv)
    require_names("--subset", *args.subset)
    write_from_args(librispeech_entries(args.root, args.subset, lowercase=not args.keep_case), args)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
