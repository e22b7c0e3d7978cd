#!/usr/bin/env python3
"""Utterances -> one long recording with its sentences, for long-form evaluation (StreamLAAL).

    python recipes/eval/long_form.py samples/manifest.jsonl --pause 0.8 --out runs/talk/talk.jsonl
    speechstream eval runs/talk/talk.jsonl --vad --out runs/talk/eval

The manifest's utterances are joined in order, with --pause seconds of silence between them, into one 16 kHz
WAV beside --out (same name, .wav); --out gets one line whose "segments" are the utterances, with their times in
the recording and their text and translation. `speechstream eval --vad` then decodes the recording as one stream,
cut at pauses as `transcribe` cuts it, and scores WER (or BLEU) on the whole and StreamLAAL per sentence. For real
talks with their own sentence times, `recipes/data/prepare_mustc.py --talks` writes such lines directly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.corpora import check_manifest_out, run_main, write_manifest  # noqa: E402
from speechstream.errors import InputError  # noqa: E402


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (through run_main)
        raise InputError(message)


def main(argv: list[str] | None = None) -> int:
    command = _Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("manifest", help="utterances to join (JSON lines)")
    command.add_argument("--out", required=True, help="long-form manifest to write (the .wav goes beside it)")
    command.add_argument("--pause", type=float, default=0.8, help="seconds of silence between utterances "
                         "(default: 0.8, enough to end a VAD segment)")
    command.add_argument("--id", default="talk", help="id of the recording (default: talk)")
    args = command.parse_args(argv)
    if not 0 <= args.pause <= 60:
        raise InputError(f"--pause must be between 0 and 60 seconds, not {args.pause}")
    out = Path(args.out)
    check_manifest_out(out)
    line = join_utterances(args.manifest, out.with_suffix(".wav"), args.pause, args.id)
    write_manifest([line], out)
    seconds = sum(s["duration"] for s in line["segments"]) + args.pause * (len(line["segments"]) - 1)
    print(f"{out}: one recording of {seconds:.1f} s, {len(line['segments'])} sentences")
    return 0


def join_utterances(manifest: str, wav: Path, pause_s: float, talk_id: str) -> dict:
    """Write the utterances of ``manifest`` as one recording at ``wav``; return its long-form manifest line."""
    import numpy as np
    import soundfile

    from speechstream.audio import SAMPLE_RATE, load_audio
    from speechstream.manifest import read_manifest

    utterances = read_manifest(manifest)
    pause = np.zeros(round(pause_s * SAMPLE_RATE), dtype=np.float32)
    pieces, segments, at = [], [], 0
    for number, utterance in enumerate(utterances):
        audio = load_audio(utterance.audio, utterance.offset or 0.0, utterance.duration)
        if number:
            pieces.append(pause)
            at += pause.size
        texts = {key: getattr(utterance, key) for key in ("text", "translation") if getattr(utterance, key) is not None}
        segments.append({"offset": round(at / SAMPLE_RATE, 6), "duration": round(audio.size / SAMPLE_RATE, 6), **texts})
        pieces.append(audio)
        at += audio.size
    wav.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(wav, np.concatenate(pieces), SAMPLE_RATE, subtype="PCM_16")
    languages = {key: getattr(utterances[0], key) for key in ("source_lang", "target_lang")}
    return {"id": talk_id, "audio": wav, **languages, "segments": segments}


if __name__ == "__main__":
    sys.exit(run_main(main))
