#!/usr/bin/env python3
"""CoVoST 2 -> manifest (speech translation: translation, and text when the TSV has it).

    python recipes/data/prepare_covost.py covost_v2.es_en.tsv --clips /data/cv-corpus/es/clips --split test \\
        --out data/covost-es-en-test.jsonl

TSV is covost_v2.<src>_<tgt>.tsv (columns path, translation, split, and sentence once joined with Common Voice, as
CoVoST's get_covost_splits.py does) or a per-split covost_v2.<src>_<tgt>.<split>.tsv; languages come from the name.
--clips is the source language's Common Voice clips/ folder. --split all keeps every row. Rows with an empty
translation are left out (counted and named): `speechstream eval --task translate` cannot score them.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.corpora import (covost_entries, path_text, recipe_parser, run_main,  # noqa: E402
                                       with_translation, write_from_args)


def main(argv: list[str] | None = None) -> int:
    command = recipe_parser(__doc__)
    command.add_argument("tsv", type=path_text, help="covost_v2.<src>_<tgt>[.<split>].tsv")
    command.add_argument("--clips", required=True, type=path_text,
                         help="the Common Voice clips/ folder of the source language")
    command.add_argument("--split", default="test", help="train, dev or test (default: test); all: every row")
    args = command.parse_args(argv)
    entries, untranslated = with_translation(covost_entries(args.tsv, args.clips,
                                                            None if args.split == "all" else args.split))
    write_from_args(entries, args, untranslated)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
