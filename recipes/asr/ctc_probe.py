"""Stage 3 helper of the ASR recipe: greedy decoding of the model's auxiliary CTC head.

    python recipes/asr/ctc_probe.py --model smollm2-whisper-base --manifest samples/manifest.jsonl \\
        --recipe recipes/asr/smollm2-whisper-base.yaml --out runs/eval-smollm2-whisper-base/real-ctc.json

The CTC head (the fine one of ``ctc_hop`` where the model has it, else the one on the speech tokens; ``--head
tokens``: the one on the speech tokens) scores its vectors against the LLM's token embeddings (over the training texts'
tokens when the recipe says ``ctc_vocab: train``). It is not a decoding mode of the toolkit; its WER shows how
much of the words the speech tokens carry, apart from what the LLM makes of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.audio import load_audio  # noqa: E402
from speechstream.cli import check_writable  # noqa: E402
from speechstream.data.corpora import RecipeArgumentParser  # noqa: E402
from speechstream.errors import InputError  # noqa: E402
from speechstream.eval.quality import normalize_english, wer  # noqa: E402
from speechstream.manifest import Utterance, read_manifest  # noqa: E402
from speechstream.model import load_model  # noqa: E402
from speechstream.train import ctc_class_ids, greedy_ctc_text, load_train_config, read_examples  # noqa: E402


def greedy_ctc(model, audio, chunk_ms: int, classes: torch.Tensor | None, head: str = "scored") -> str:
    """Greedy CTC text of a head: "scored", the one joint decoding scores (the fine CTC head where the model has
    one, else the speech tokens'); "tokens", the head on the speech tokens (trained with the LLM side)."""
    encoded = model.encode([audio], chunk_ms)
    if model.ctc_head is not None and head == "scored":
        frames = encoded.frames[0, : encoded.frame_ends[0][-1]]
        return greedy_ctc_text(model, model.ctc_head(frames), classes, fine=True).strip()
    source = model.source_from_frames(encoded)
    return greedy_ctc_text(model, source.speech[0, : int(source.speech_lengths[0])], classes).strip()


def transcripts(utterances: list[Utterance], manifest: str) -> list[str]:
    """Each utterance's reference transcript (``text``), checked before any decoding: a line without one was scored
    against an empty reference (every word of its hypothesis an insertion), and a manifest whose transcripts all
    normalise to nothing has no WER (it stopped with a traceback once every clip was decoded)."""
    lacking = [utterance.id for utterance in utterances if utterance.text is None]
    if lacking:
        shown = ", ".join(lacking[:3]) + (f" and {len(lacking) - 3} more" if len(lacking) > 3 else "")
        raise InputError(f'{manifest}: {len(lacking)} of {len(utterances)} utterances lack "text" ({shown}); the '
                         "probe's WER needs a transcript on every line")
    texts = [utterance.text for utterance in utterances]
    if not any(normalize_english(text).split() for text in texts):
        raise InputError(f"{manifest}: every transcript (text) is empty once normalised: the WER is undefined")
    return texts


def check_out(out: Path) -> None:
    """``--out`` names a file that can be written, its folder made, before any decoding (InputError if not): a path
    the system refuses (a folder no file can be created in, a name longer than it takes) stopped the probe with a
    traceback once every clip was decoded, the WER lost."""
    try:
        if out.is_dir() or any(p.exists() and not p.is_dir() for p in out.parents):
            raise InputError(f"--out {out}: must name a file in a folder (checked before any decoding)")
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"{out}: cannot write the output ({error.strerror or error})") from None
    check_writable(str(out))


def main() -> None:
    parser = RecipeArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--recipe", required=True, help="the training recipe (its ctc_vocab and train_manifest), "
                        "for checkpoints that do not carry their ctc_classes")
    parser.add_argument("--chunk-ms", type=int, default=640)
    parser.add_argument("--head", choices=("scored", "tokens"), default="scored",
                        help="scored: the CTC head joint decoding scores (the fine one where the model has it); "
                        "tokens: the head on the speech tokens, trained with the projector")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    check_out(args.out)
    utterances = read_manifest(args.manifest)
    references = transcripts(utterances, args.manifest)
    torch.set_num_threads(2)
    model = load_model(args.model)
    classes = model.ctc_classes  # the checkpoint's CTC classes; older checkpoints: derived from the recipe
    if classes is None:
        recipe = load_train_config(args.recipe, [])
        classes = ctc_class_ids(model, read_examples(recipe.train_manifest, recipe.max_audio_s), recipe)
    hypotheses = []
    with torch.no_grad():
        for utterance in utterances:
            audio = load_audio(utterance.audio, utterance.offset or 0.0, utterance.duration)
            hypotheses.append(greedy_ctc(model, audio, args.chunk_ms, classes, args.head))
    result = {"WER_normalized": wer(hypotheses, references, normalize=True), "WER": wer(hypotheses, references),
              "utterances": len(hypotheses), "hypotheses": hypotheses}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"CTC head, greedy: WER {result['WER_normalized']:.1f} % normalized over {len(hypotheses)} utterances")


if __name__ == "__main__":
    try:
        main()
    except InputError as error:
        print(f"ctc_probe: error: {error}", file=sys.stderr)
        sys.exit(2)
