"""End of stage 3 of the ASR recipe: write the model card from the run and the evaluation outputs.

    python recipes/asr/model_card.py --model smollm2-whisper-base --run runs/smollm2-whisper-base-1d \\
        --eval runs/eval-smollm2-whisper-base

Every figure this script writes (Training, Results) is read from files the recipe wrote (log.jsonl,
stats.json, scores.json); nothing is typed in by hand. It rewrites the title, Training and Results and keeps every
other section of an existing card (Status onwards: the stages tried, the figures measured by hand) after them, as
it was (``carried_sections``); hand edits inside Training or Results are not kept.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.corpora import RecipeArgumentParser  # noqa: E402
from speechstream.errors import InputError  # noqa: E402

ROWS = [  # (eval folder, what it measures); {w}: the joint CTC weight the run decoded with
    ("real-640ms", "this model, streaming, 640 ms chunks, wait-2, default decoding (joint CTC, weight {w})"),
    ("real-640ms-greedy", "the same, greedy decoding (`--ctc-weight 0`)"),
    ("real-offline", "this model, offline (the whole clip as one chunk), default decoding"),
    ("real-whisper-base", "Whisper base offline (transformers greedy), reference line"),
    ("heldout-640ms", "this model, streaming 640 ms, held-out synthetic voices and sentences, default decoding"),
    ("heldout-640ms-greedy", "the same held-out set, greedy decoding"),
]
DEV_PREFIX = "dev-w"  # dev-w<weight>: the joint CTC weights tried on data/dev/heldout.jsonl
# the training stages, in order
RECIPES = ["smollm2-whisper-base", "smollm2-whisper-base-more", "smollm2-whisper-base-1c",
           "smollm2-whisper-base-1d", "smollm2-whisper-base-ctc"]


GENERATED_SECTIONS = ("Training", "Results")  # the "## " sections this script writes


def carried_sections(card: str) -> list[str]:
    """The lines of every "## " section of ``card`` that this script does not write, in order (empty if none)."""
    kept, keeping = [], False
    for line in card.splitlines():
        if line.startswith("## "):
            keeping = line[3:].strip() not in GENERATED_SECTIONS
        if keeping:
            kept.append(line)
    return kept


def fmt(scores: dict, key: str, digits: int = 1) -> str:
    value = scores.get(key)
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return text.lstrip("-") if float(text) == 0 else text  # no "-0"


def dev_weight(folder: str) -> float | None:
    """The joint CTC weight of a dev evaluation folder, ``dev-w0.5`` -> 0.5; None for a folder not named so (another
    run kept beside them, ``dev-w0.5-old``)."""
    try:
        return float(folder.removeprefix(DEV_PREFIX)) if folder.startswith(DEV_PREFIX) else None
    except ValueError:
        return None


def log_rows(path: Path) -> list[dict]:
    """The rows of a run's log.jsonl; a torn one (a kill or a full disk while it was written: training drops it when
    the run resumes) is left out."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # (a blank line too)
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def main() -> None:
    parser = RecipeArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--eval", type=Path, required=True)
    parser.add_argument("--data", type=Path, nargs="+",
                        default=[Path("data/synth-main"), Path("data/synth-c"), Path("data/synth-d")],
                        help="synthetic sets the last stage trained on; the first one's held-out set is the one "
                        "evaluated")
    try:
        args = parser.parse_args()
    except InputError as error:
        print(f"model_card: error: {error}", file=sys.stderr)
        sys.exit(2)
    # the card is rewritten whole: refuse, before touching it, inputs that would leave it with holes
    problems = [f"{path}: not found" for path in (args.run / "log.jsonl", args.eval,
                                                   Path("models") / args.model / "config.yaml") if not path.exists()]
    if not problems and not any((args.eval / row).is_dir() for row, _ in ROWS):
        problems.append(f"{args.eval}: none of the evaluation folders of the results table ({ROWS[0][0]}, ...)")
    log = [] if problems else log_rows(args.run / "log.jsonl")
    if not problems and not any("loss" in row for row in log):
        problems.append(f"{args.run / 'log.jsonl'}: no training loss logged")
    if problems:
        print(f"model_card: error: {problems[0]}; the model card is left as it is", file=sys.stderr)
        sys.exit(2)
    last = [row for row in log if "loss" in row][-1]
    stats = [json.loads((d / "stats.json").read_text()) for d in args.data if (d / "stats.json").exists()]
    import yaml

    model_config = yaml.safe_load((Path("models") / args.model / "config.yaml").read_text())
    lookahead = model_config.get("encoder", {}).get("lookahead_frames", 0)
    right = f", each block also seeing the next {lookahead * 20} ms" if lookahead else ""
    hop = model_config.get("ctc_hop", 0)
    lines = [
        f"# {args.model}",
        "",
        f"English streaming ASR: Whisper base encoder (frozen, block-causal over 640 ms chunks{right}) -> projector",
        "(8 frames per token) -> SmolLM2-135M-Instruct with LoRA r=16 (attention and MLP projections), written",
        "with group position encoding and wait-k over chunks with an end-of-chunk token. Base weights:",
        "`speechstream fetch`",
        "(OpenAI Whisper, MIT; SmolLM2, Apache-2.0). This folder ships only the trained projector, CTC blank",
        "and LoRA weights" + (f" and the fine CTC head of joint decoding (a window of 8 frames every {hop} frames)"
                              if hop else "") + " (`trainable.safetensors`, float16).",
        "",
        "## Training",
        "",
        "- recipes, in order, run by `recipes/asr/run.sh`: "
        + ", then ".join(f"`recipes/asr/{name}.yaml`" for name in RECIPES),
        f"- steps of the last stage that trained the LLM side: {last['step']} "
        f"(log: last k={last.get('k')}, elapsed {last.get('elapsed_s')} s "
        "of its final run segment)",
        f"- final training losses: LM {last.get('lm', float('nan')):.3f}, token accuracy "
        f"{last.get('accuracy', float('nan')):.3f}, CTC {last.get('ctc', float('nan')):.3f}",
    ]
    for name in RECIPES:
        r = yaml.safe_load((Path("recipes/asr") / f"{name}.yaml").read_text())
        start = "from its `init_checkpoint`, " if r.get("init_checkpoint") else ""
        if r.get("ctc_head_only"):
            lines.append(f"- `{name}`: {start}the fine CTC head alone (a window every {r.get('ctc_hop')} encoder "
                         f"frames), CTC on the frozen encoder's frames, no LLM pass: {r.get('steps')} steps (batch "
                         f"{r.get('batch_size')}, learning rate {r.get('lr_projector')}), over "
                         f"`{r.get('train_manifest')}`")
            continue
        lines.append(f"- `{name}`: {start}{r.get('ctc_only_steps', 0)} CTC-only projector steps (batch "
                     f"{r.get('ctc_only_batch_size') or r.get('batch_size')}), then LM + {r.get('ctc_weight')} x CTC "
                     f"to step {r.get('steps')} (batch {r.get('batch_size')}, learning rates {r.get('lr_projector')} "
                     f"projector / {r.get('lr_lora')} LoRA), wait-k drawn from {r.get('k_choices')}, over "
                     f"`{r.get('train_manifest')}`"
                     + (f", encoder right context {r['lookahead_frames']} frames" if r.get("lookahead_frames", -1) > 0
                        else ""))
    if stats:
        hours = sum(s.get("hours", {}).get("train", 0) for s in stats)
        utts = sum(s.get("utterances", {}).get("train", 0) for s in stats)
        lines.append(f"- data of the last stage: synthetic speech, {hours:.2f} h / {utts} utterances in "
                     f"{len(stats)} sets "
                     f"(Piper, espeak-ng and flite voices, augmented); held-out: "
                     f"{stats[0].get('utterances', {}).get('heldout', 0)} utterances of sentences and voices "
                     "never trained on")
    lines += [
        "",
        "## Results",
        "",
        "Real recorded speech: the five LibriVox clips and jfk.wav in `samples/` (35.7 s). WER after the English",
        "normalizer of `speechstream/eval/quality.py`; latency in ms as SimulEval 1.1.4 computes it; RTF = compute",
        "seconds / audio seconds on this machine (2 CPU cores).",
        "",
        "| system | WER raw | WER norm. | AL | LAAL | StartOffset | EndOffset | AL_CA | RTF |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for folder, label in ROWS:
        path = args.eval / folder / "scores.json"
        if not path.exists():
            continue
        s = json.loads(path.read_text())
        config = json.loads((path.parent / "config.json").read_text()) if (path.parent / "config.json").exists() else {}
        label = label.format(w=config.get("decoding", {}).get("ctc_weight"))
        lines.append(
            f"| {label} | {fmt(s, 'WER')} | {fmt(s, 'WER_normalized')} | {fmt(s, 'AL', 0)} | {fmt(s, 'LAAL', 0)} | "
            f"{fmt(s, 'StartOffset', 0)} | {fmt(s, 'EndOffset', 0)} | {fmt(s, 'AL_CA', 0)} | {fmt(s, 'RTF', 2)} |"
        )
    dev = [path for path in args.eval.glob(f"{DEV_PREFIX}*/scores.json") if dev_weight(path.parent.name) is not None]
    dev.sort(key=lambda path: dev_weight(path.parent.name))
    if dev:
        lines += ["", "Joint CTC weight (`ctc_weight` in config.yaml), tried on `data/dev/heldout.jsonl` (held-out "
                  "synthetic voices and sentences, its own seed) at 640 ms, wait-2:", "",
                  "| weight | WER norm. | AL | RTF |", "|---|---|---|---|"]
        for path in dev:
            s = json.loads(path.read_text())
            lines.append(f"| {path.parent.name[len(DEV_PREFIX):]} | {fmt(s, 'WER_normalized')} | {fmt(s, 'AL', 0)} | "
                         f"{fmt(s, 'RTF', 2)} |")
    probe = args.eval / "real-ctc.json"
    if probe.exists():
        ctc = json.loads(probe.read_text())
        head = "the fine CTC head (the one joint decoding scores)" if hop else "the auxiliary CTC head"
        lines += ["", f"Diagnostic, not a decoding mode: greedy decoding of {head} alone on the same "
                  f"real clips (640 ms block-causal encoder{right}) gives WER {ctc['WER_normalized']:.1f} % normalized "
                  f"(`recipes/asr/ctc_probe.py`): what the speech side carries before the LLM reads it."]
    lines += ["", "Training curve of the last stage: `loss.png` (copied from its run).", ""]
    card = Path("models") / args.model / "MODEL_CARD.md"
    carried = carried_sections(card.read_text()) if card.exists() else []
    card.write_text("\n".join(lines + carried) + ("\n" if carried else ""))
    png = args.run / "loss.png"
    if png.exists():
        (Path("models") / args.model / "loss.png").write_bytes(png.read_bytes())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
