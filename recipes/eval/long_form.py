#!/usr/bin/env python3
"""Utterances -> one long recording with its sentences, for long-form evaluation (StreamLAAL).

    python recipes/eval/long_form.py samples/manifest.jsonl --pause 0.8 --out runs/talk/talk.jsonl
    speechstream eval runs/talk/talk.jsonl --vad --out runs/talk/eval

The manifest's utterances are joined in order, with --pause seconds of silence between them, into one 16 kHz WAV
beside --out (same name, .wav); --out gets one line whose "segments" are the utterances, with their times in the
recording and their text and translation (a line that is itself long-form brings its own sentences). `speechstream
eval --vad` then decodes the recording as one stream, cut at pauses as `transcribe` cuts it, and scores WER (or
BLEU) on the whole and StreamLAAL per sentence. For real talks with their own sentence times,
`recipes/data/prepare_mustc.py --talks` writes such lines directly. A file already at the .wav is replaced only when
it is the recording --out names (a rerun); the recording is written to a temporary name and renamed once whole, so
a run stopped while writing it leaves none (a rerun makes it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.corpora import RecipeArgumentParser, check_manifest_out, run_main, write_manifest  # noqa: E402
from speechstream.errors import InputError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    command = RecipeArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    command.add_argument("manifest", help="utterances to join (JSON lines)")
    command.add_argument("--out", required=True, help="long-form manifest to write (the .wav goes beside it)")
    command.add_argument("--pause", type=float, default=0.8, help="seconds of silence between utterances "
                         "(default: 0.8, enough to end a VAD segment)")
    command.add_argument("--id", default="talk", help="id of the recording (default: talk)")
    args = command.parse_args(argv)
    if not 0 <= args.pause <= 60:
        raise InputError(f"--pause must be between 0 and 60 seconds, not {args.pause}")
    if not args.id.strip():
        raise InputError("--id must be a non-empty name")
    out = Path(args.out)
    check_manifest_out(out)
    if out.suffix.lower() == ".wav":  # the recording would be written there, then refused as not a manifest
        raise InputError(f"--out {out} names the manifest to write (talk.jsonl, say); the recording goes beside it, "
                         "with its name and .wav")
    check_recording_out(out.with_suffix(".wav"), out)
    line, seconds = join_utterances(args.manifest, out.with_suffix(".wav"), args.pause, args.id)
    write_manifest([line], out)
    print(f"{out}: one recording of {seconds:.1f} s, {len(line['segments'])} sentences")
    return 0


def check_recording_out(wav: Path, out: Path) -> None:
    """The recording may be written at ``wav``: nothing is there, or the recording of the manifest ``out`` holds
    (a rerun). Any other file there (a clip of the manifest being joined, say) is refused, before any work."""
    from speechstream.manifest import read_manifest

    if not wav.exists():
        return
    if wav.is_dir():
        raise InputError(f"{wav} is a folder; the recording goes beside --out, with its name and .wav")
    try:
        ours = out.is_file() and any(utterance.audio.resolve() == wav.resolve() for utterance in read_manifest(out))
    except InputError:
        ours = False
    if not ours:
        raise InputError(f"{wav} exists and is not the recording of {out}; refusing to overwrite it "
                         "(the recording goes beside --out, with its name and .wav: choose another --out)")


def join_utterances(manifest: str, wav: Path, pause_s: float, talk_id: str) -> tuple[dict, float]:
    """Write the utterances of ``manifest`` as one recording at ``wav``; return its long-form manifest line and its
    length (s). An utterance that is itself long-form brings its own sentences, moved to its place in the recording;
    any other is one sentence. The line declares the languages the utterances declare (``declared_languages``)."""
    import numpy as np
    import soundfile

    from speechstream.audio import SAMPLE_RATE, load_audio
    from speechstream.manifest import declared_languages, read_manifest

    utterances = read_manifest(manifest)
    # the languages any line declares (not only the first line's); two different ones are refused, before any work:
    # the recording is one stream of one language pair (both read, as a translate run reads them)
    source_lang, target_lang = declared_languages(utterances, manifest, task="translate")
    if any(utterance.audio.resolve() == wav.resolve() for utterance in utterances):
        raise InputError(f"{wav} is audio of {manifest} itself; refusing to overwrite it (choose another --out)")
    pause = np.zeros(round(pause_s * SAMPLE_RATE), dtype=np.float32)
    pieces, segments, at = [], [], 0
    for number, utterance in enumerate(utterances):
        audio = load_audio(utterance.audio, utterance.offset or 0.0, utterance.duration)
        check_sentences(utterance, audio.size / SAMPLE_RATE, manifest)  # (before the recording is written)
        if number:
            pieces.append(pause)
            at += pause.size
        start = at / SAMPLE_RATE
        for sentence in utterance.segments or (None,):
            texts = {key: getattr(sentence or utterance, key) for key in ("text", "translation")
                     if getattr(sentence or utterance, key) is not None}
            offset, duration = (0.0, audio.size / SAMPLE_RATE) if sentence is None else (sentence.offset,
                                                                                          sentence.duration)
            segments.append({"offset": round(start + offset, 6), "duration": round(duration, 6), **texts})
        pieces.append(audio)
        at += audio.size
    temporary = wav.with_name(f".{wav.name}.tmp")  # renamed once whole: a run stopped midway leaves no half wav
    try:
        wav.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as stream:  # (opened here: libsndfile's own error names no reason)
            soundfile.write(stream, np.concatenate(pieces), SAMPLE_RATE, subtype="PCM_16", format="WAV")
        os.replace(temporary, wav)
    except (OSError, soundfile.LibsndfileError) as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise InputError(f"{wav}: cannot write the recording ({getattr(error, 'strerror', None) or error})") from None
    return ({"id": talk_id, "audio": wav, "source_lang": source_lang, "target_lang": target_lang,
             "segments": segments}, at / SAMPLE_RATE)


def check_sentences(utterance, seconds: float, manifest: str) -> None:
    """InputError naming the line when a sentence of a long-form ``utterance`` does not lie inside its ``seconds`` of
    audio (with eval's slack for rounded times): joined, it would run into the pause or past the recording's end,
    and the recording's manifest would be refused after the recording was written."""
    from speechstream.eval.run import SENTENCE_SLACK_S

    for number, sentence in enumerate(utterance.segments or ()):
        end = sentence.offset + sentence.duration
        if sentence.offset >= seconds or end > seconds + SENTENCE_SLACK_S:
            raise InputError(f'{manifest}: "{utterance.id}": sentence {number} of its "segments" '
                             f"({sentence.offset:.3f} s to {end:.3f} s) is not inside its audio ({seconds:.3f} s)")


if __name__ == "__main__":
    sys.exit(run_main(main))
