#!/usr/bin/env python3
"""MuST-C -> manifest of segments (offset/duration inside each talk's wav; text and translation), or of talks.

    python recipes/data/prepare_mustc.py /data/MUST-C --lang de --split tst-COMMON --out data/mustc-en-de-tst.jsonl
    python recipes/data/prepare_mustc.py /data/MUST-C --lang de --talks --out data/mustc-en-de-tst-talks.jsonl

ROOT holds en-<lang>/ (or is it): en-<lang>/data/<split>/txt/<split>.yaml, <split>.en, <split>.<lang> and wav/.
`speechstream eval` reads only each segment's time range of its talk. With --talks each line is a whole talk
with its sentences as "segments" (long form: `speechstream eval --vad` decodes the talk as one stream and adds
StreamLAAL, each sentence's LAAL after the hypothesis is resegmented into the sentences). Segments with an empty
translation are left out of a segment manifest (counted and named: `speechstream eval --task translate` cannot score
them); a talk keeps them.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.corpora import (mustc_entries, path_text, recipe_parser, require_names, run_main,  # noqa: E402
                                       talk_entries, with_translation, write_from_args)


def main(argv: list[str] | None = None) -> int:
    command = recipe_parser(__doc__)
    command.add_argument("root", type=path_text, help="the MuST-C folder (holding en-<lang>/) or en-<lang>/ itself")
    command.add_argument("--lang", required=True, help="target language, e.g. de")
    command.add_argument("--split", default="tst-COMMON", help="train, dev, tst-COMMON, tst-HE (default: tst-COMMON)")
    command.add_argument("--talks", action="store_true",
                         help="one line per talk, its sentences as segments (long-form evaluation)")
    args = command.parse_args(argv)
    require_names("--lang", args.lang)
    require_names("--split", args.split)
    entries = mustc_entries(args.root, args.lang, args.split)
    if args.talks:  # a talk keeps its untranslated sentences: eval scores the talk's joined translation
        write_from_args(talk_entries(entries), args)
    else:
        kept, untranslated = with_translation(entries)
        write_from_args(kept, args, untranslated)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
