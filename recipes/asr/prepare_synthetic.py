#!/usr/bin/env python3
"""Stage 0 of the ASR recipe: synthetic English speech with word end times, as JSONL manifests.

    python recipes/asr/prepare_synthetic.py --out data/synth --hours 1.0 --seed 0 --workers 2

Stages (each reruns cheaply; see README.md beside this file):
  1. text      clean Debian text into OUT/text/{train,heldout}.jsonl (sentence-hash split)
  2. plan      OUT/plan.jsonl: every utterance's id, text, voice, settings and seed, fixed before synthesis
  3. babble    a few clean clips of training sentences, the material babble noise is made from
  4. speech    synthesize + augment every planned utterance into OUT/wav/<shard>/<id>.wav (+ <id>.json)
  5. manifests OUT/train.jsonl, OUT/heldout.jsonl (held-out sentences, held-out voices),
               OUT/heldout_seen.jsonl (held-out sentences, training voices), OUT/stats.json

Resumable: an utterance whose ``<id>.json`` exists and whose wav has the recorded size is not made again (both
are written to a temporary name and renamed). Seeded: every utterance draws its voice settings, TTS noise and
augmentation from its own seed, so a rerun (with any number of workers) writes identical files.
One run at a time per OUT: a run holds OUT/.lock, and a second one into the same OUT stops at once (exit 2).
"""

from __future__ import annotations

import os

for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # one thread per worker process; set before numpy/torch load

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.render import (  # noqa: E402
    SPLITS,
    RenderSpec,
    add_common_arguments,
    check_common_arguments,
    make_out_folder,
    planned_seconds,
    read_json,
    read_plan,
    render_stage,
    utterance_seed,
    write_json,
    write_jsonl,
    write_manifest,
    write_plan,
    write_stats,
)
from speechstream.data.corpora import RecipeArgumentParser, run_main  # noqa: E402
from speechstream.errors import InputError  # noqa: E402
from speechstream.locks import hold_folder  # noqa: E402
from speechstream.data.synthesize import (  # noqa: E402
    ENGINES,
    HELDOUT_ENGINE_WEIGHTS,
    estimate_seconds,
    fetch_piper_voice,
    sample_voice,
)
from speechstream.data.text_corpus import SOURCES, Corpus, CorpusConfig, Sentence, build_corpus, mix  # noqa: E402

log = logging.getLogger("prepare_synthetic")

PLAN_VERSION = 1  # bump when the plan's meaning changes: an old OUT must then be remade
PLAN_MAX_SECONDS = 10.5  # sentences estimated longer than this (for the drawn voice) are not planned
BABBLE_CLIPS = 24  # clean clips that babble noise is mixed from


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = RecipeArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, seed_help="seed of the sentence order, voices and augmentation")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help="comma-separated speech engines to use (piper, espeak, flite)")
    args = parser.parse_args(argv)
    args.engines = tuple(name.strip() for name in args.engines.split(",") if name.strip())
    unknown = set(args.engines) - set(ENGINES)
    if unknown or not args.engines:
        parser.error(f"--engines: unknown {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    if not {name for name, _ in HELDOUT_ENGINE_WEIGHTS} & set(args.engines):
        parser.error(f"--engines {','.join(args.engines)}: the held-out voices are espeak and flite voices; "
                     "give at least one of them")
    check_common_arguments(parser, args)
    return args


def plan_settings(args: argparse.Namespace) -> dict:
    """What the plan depends on; a rerun with other settings must use another --out."""
    return {"plan_version": PLAN_VERSION, "hours": args.hours, "heldout_hours": args.heldout_hours,
            "seed": args.seed, "engines": list(args.engines), "augment": not args.no_augment}


# --- stage 1: text -------------------------------------------------------------------------------------------------

def text_seed(out: Path) -> int | None:
    """The --seed OUT/text/ was shuffled with: its settings.json, else (a folder made before that file) the seed
    of OUT's plan, which was made from that text; None when neither says."""
    for settings in (out / "text" / "settings.json", out / "plan-settings.json"):
        recorded = read_json(settings)
        if isinstance(recorded, dict) and isinstance(recorded.get("seed"), int):
            return recorded["seed"]
    return None


def load_or_build_text(out: Path, seed: int) -> Corpus:
    """The cleaned corpus, built once and kept in OUT/text/ (so a rerun does not depend on the machine's
    packages having stayed the same). Its order and number sentences depend on ``seed``: text built with
    another seed is refused (a plan made from it would differ from a fresh run's)."""
    folder = out / "text"
    files = {split: folder / f"{split}.jsonl" for split in ("train", "heldout")}
    if all(path.exists() for path in files.values()) and (folder / "counts.json").exists():
        built = text_seed(out)
        if built is not None and built != seed:
            raise InputError(f"{folder} was built with --seed {built}, not {seed}: use another --out (or delete "
                             f"{folder} and {out / 'plan.jsonl'} to rebuild them)")
        corpus = Corpus()
        for split, path in files.items():
            pools: dict[str, list[Sentence]] = defaultdict(list)
            with path.open(encoding="utf-8") as handle:
                for line in handle:
                    record = json.loads(line)
                    pools[record["source"]].append(Sentence(record["text"], record["source"]))
            setattr(corpus, split, dict(pools))
        counts = json.loads((folder / "counts.json").read_text(encoding="utf-8"))
        corpus.rejected = {source: value["rejected"] for source, value in counts.items()}
        corpus.duplicates = {source: value["duplicates"] for source, value in counts.items()}
        corpus.overlaps = {source: value.get("overlaps", 0) for source, value in counts.items()}
        return corpus
    log.info("building the text corpus from Debian packages (about a minute)")
    corpus = build_corpus(CorpusConfig(), seed=seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, path in files.items():
        pools = getattr(corpus, split)
        write_jsonl(path, [{"text": sentence.text, "source": sentence.source}
                           for source in SOURCES for sentence in pools.get(source, [])])
    write_json(folder / "settings.json", {"seed": seed})
    write_json(folder / "counts.json", corpus.counts())  # last: the folder is complete once it exists
    return corpus


# --- stage 2: plan -------------------------------------------------------------------------------------------------

def plan_split(split: str, stream, seconds: float, heldout_voices: bool, args: argparse.Namespace,
               count: int | None = None) -> list[dict]:
    """Items of one split until the estimated duration reaches ``seconds`` (or ``count`` items)."""
    prefix = SPLITS[split]
    rng = random.Random(f"{args.seed}-voices-{split}")
    items: list[dict] = []
    total = 0.0
    while (total < seconds) if count is None else (len(items) < count):
        voice = sample_voice(rng, heldout=heldout_voices, engines=args.engines)
        sentence = next(stream)
        estimate = estimate_seconds(sentence.text, voice)
        if estimate > PLAN_MAX_SECONDS:
            continue  # too long for this voice: the sentence is skipped, the next one tried with a new voice
        utterance_id = f"{prefix}-{len(items):06d}"
        items.append({"id": utterance_id, "split": split, "text": sentence.text, "source": sentence.source,
                      "voice": voice.to_dict(), "seed": utterance_seed(f"{args.seed}/{utterance_id}"),
                      "estimate_s": round(estimate, 2)})
        total += planned_seconds(estimate, not args.no_augment)
    return items


def load_or_make_plan(out: Path, corpus: Corpus, args: argparse.Namespace) -> list[dict]:
    """OUT/plan.jsonl (made once; a rerun with other settings is refused)."""
    settings = plan_settings(args)
    planned = read_plan(out, settings, hint=" (or delete its plan.jsonl to replan: utterances made from another "
                                            "plan are then remade)")
    if planned is not None:
        return planned
    weights = CorpusConfig().weights
    train_stream = mix(corpus.train, weights, args.seed)
    heldout_stream = mix(corpus.heldout, weights, args.seed)
    items = plan_split("babble", train_stream, 0, False, args, count=BABBLE_CLIPS)
    items += plan_split("train", train_stream, args.hours * 3600, False, args)
    items += plan_split("heldout", heldout_stream, args.heldout_hours * 3600, True, args)
    items += plan_split("heldout_seen", heldout_stream, args.heldout_hours * 3600, False, args)
    write_plan(out, items, settings)
    return items


# --- stages 3 and 4: synthesis (speechstream.data.render, in worker processes) ------------------------------------

RENDER_SPEC = RenderSpec(languages={"source_lang": "en"})


def run_stage(name: str, items: list[dict], out: Path, babble_ids: list[str],
              args: argparse.Namespace) -> tuple[dict[str, dict], dict]:
    """Render ``items`` over ``args.workers`` processes; (id -> record, timing summary)."""
    records, timing = render_stage(name, items, out, babble_ids, not args.no_augment, RENDER_SPEC, args.workers, log)
    wall, produced_s = timing.wall_s, timing.new_audio_s
    summary = {
        "wall_s": round(wall, 1),
        "new_audio_s": round(produced_s, 1),
        "real_time_factor": round(produced_s / wall, 2) if wall > 0 and produced_s else None,
        "workers": args.workers,
        "per_engine_x_real_time_per_process": {
            engine_name: round(audio / synth, 1) for engine_name, (audio, synth) in sorted(timing.per_engine.items())
            if synth > 0
        },
    }
    return records, summary


# --- stage 5: manifests and statistics -------------------------------------------------------------------------------

MANIFEST_FIELDS = ("id", "audio", "text", "words", "duration", "voice", "voice_settings", "source", "aug",
                   "source_lang")


def write_manifests(out: Path, plan: list[dict], records: dict[str, dict], corpus: Corpus,
                    timings: dict, args: argparse.Namespace) -> dict:
    """Write the three manifests in plan order and stats.json; returns the statistics."""
    stats: dict = {"settings": plan_settings(args), "hours": {}, "utterances": {}, "rejected": {}, "voices": {},
                   "engines_hours": {}, "sources": {}, "augmentation": {}, "text_corpus": corpus.counts()}
    for split in ("train", "heldout", "heldout_seen"):
        made = write_manifest(out, split, plan, records, MANIFEST_FIELDS, stats)
        engines: Counter = Counter()
        for record in made:
            engines[record["voice"].split(":")[0]] += record["duration"]
        stats["voices"][split] = dict(sorted(Counter(record["voice"] for record in made).items()))
        stats["engines_hours"][split] = {name: round(seconds / 3600, 4) for name, seconds in sorted(engines.items())}
        stats["sources"][split] = dict(sorted(Counter(record["source"] for record in made).items()))
    write_stats(out, stats, timings)
    return stats


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    args = parse_args(argv)
    make_out_folder(args.out)
    with hold_folder(args.out):  # a second run into the same --out stops here (exit 2)
        return make(args)


def make(args: argparse.Namespace) -> int:
    """Every stage, into ``args.out`` (held by this run)."""
    out: Path = args.out
    corpus = load_or_build_text(out, args.seed)
    empty = [source for source in SOURCES if not corpus.train.get(source)]
    if empty:
        log.warning("no sentences from %s: install the Debian packages of the Makefile's SYSTEM_PACKAGES "
                    "(wordnet-base, fortunes-min, fortunes, dict-gcide) for varied text", ", ".join(empty))
    plan = load_or_make_plan(out, corpus, args)
    log.info("plan: %s", dict(Counter(item["split"] for item in plan)))
    if args.limit is not None:  # a trial: the first N utterances of each split
        plan = [item for item in plan if item["split"] == "babble" or int(item["id"][3:]) < args.limit]
    if "piper" in args.engines:
        fetch_piper_voice()  # download once here, not in every worker
    babble_ids = [item["id"] for item in plan if item["split"] == "babble"]
    babble = [item for item in plan if item["split"] == "babble"]
    records, babble_timing = run_stage("babble", babble, out, [], args)
    speech = [item for item in plan if item["split"] != "babble"]
    speech_records, speech_timing = run_stage("speech", speech, out, babble_ids, args)
    records |= speech_records
    stats = write_manifests(out, plan, records, corpus, {"babble": babble_timing, "speech": speech_timing}, args)
    log.info("hours %s, utterances %s, rejected %s", stats["hours"], stats["utterances"], stats["rejected"])
    log.info("speech stage: %s", stats["synthesis"].get("speech"))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
