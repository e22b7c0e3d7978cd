#!/usr/bin/env python3
"""Stages 0-1 of the translation recipe: Spanish speech with English translations, as JSONL manifests.

    python recipes/st/prepare_st.py --out data/st --hours 0.2 --seed 0 --workers 2

Stages (each reruns cheaply; see README.md beside this file):
  1. text      align the Bible in English (WEB) and Spanish (Reina-Valera 1909) by verse into
               OUT/text/{train,heldout}.jsonl (hash split of the Spanish text; speechstream.data.parallel_text)
  2. plan      OUT/plan.jsonl: every utterance's id, pair, Spanish voice, settings and seed, fixed before synthesis
  3. babble    24 clean clips of Spanish training sentences, the material babble noise is made from
  4. speech    synthesize (espeak-ng es / es-419) + augment every planned utterance into OUT/wav/<shard>/<id>.wav
  5. manifests OUT/train.jsonl, OUT/heldout.jsonl (held-out pairs, held-out voices), OUT/heldout_seen.jsonl
               (held-out pairs, training voices), with --dev-hours OUT/dev.jsonl (other held-out pairs, held-out
               voices: a development set apart from both), OUT/stats.json

Resumable: an utterance whose ``<id>.json`` exists, was made from the same plan item and whose wav has the recorded
size is not made again (both are written to a temporary name and renamed). Seeded: every utterance draws its voice
settings, synthesis noise and augmentation from its own seed, so a rerun with any number of workers writes the same
files.
One run at a time per OUT: a run holds OUT/.lock, and a second one into the same OUT stops at once (exit 2).
"""

from __future__ import annotations

import os

for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # one thread per worker process; set before numpy/torch load

import argparse  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from dataclasses import asdict  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout works without installing the package

from speechstream.data.corpora import RecipeArgumentParser, run_main  # noqa: E402
from speechstream.data.parallel_text import AlignConfig, Pair, build_parallel_corpus  # noqa: E402
from speechstream.data.render import (  # noqa: E402
    MAX_HOURS,
    SPLITS,
    RenderSpec,
    add_common_arguments,
    check_common_arguments,
    make_out_folder,
    planned_seconds,
    read_plan,
    render_stage,
    utterance_seed,
    write_json,
    write_jsonl,
    write_manifest,
    write_plan,
    write_stats,
)
from speechstream.data.synthesize import estimate_seconds, sample_voice  # noqa: E402
from speechstream.errors import InputError  # noqa: E402
from speechstream.locks import hold_folder  # noqa: E402

log = logging.getLogger("prepare_st")

PLAN_VERSION = 1  # bump when the plan's meaning changes: an old OUT must then be remade
SOURCE_LANG, TARGET_LANG = "es", "en"
PLAN_MAX_SECONDS = 10.5  # pairs estimated longer than this (for the drawn voice) are not planned
BABBLE_CLIPS = 24
BABBLE_RESERVE = 500  # training pairs (the last of the shuffled order) kept for babble
MANIFEST_FIELDS = ("id", "audio", "text", "translation", "words", "duration", "voice", "voice_settings", "source",
                   "aug", "source_lang", "target_lang")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = RecipeArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_arguments(parser, seed_help="seed of the pair order, voices and augmentation")
    parser.add_argument("--text-only", action="store_true", help="stop after the text and plan stages")
    parser.add_argument("--dev-hours", type=float, default=0.0,
                        help="hours of OUT/dev.jsonl: held-out pairs neither held-out manifest speaks, in "
                             "held-out voices, for choosing weights and settings (default 0: none)")
    args = parser.parse_args(argv)
    check_common_arguments(parser, args)
    if not (math.isfinite(args.dev_hours) and 0 <= args.dev_hours <= MAX_HOURS):
        parser.error(f"--dev-hours must be a number from 0 to {MAX_HOURS:g}")
    return args


def plan_settings(args: argparse.Namespace) -> dict:
    """What the plan depends on; a rerun with other settings must use another --out."""
    settings = {"plan_version": PLAN_VERSION, "hours": args.hours, "heldout_hours": args.heldout_hours,
                "seed": args.seed, "augment": not args.no_augment, "source_lang": SOURCE_LANG,
                "target_lang": TARGET_LANG}
    if args.dev_hours:  # (only when asked: a plan made before the dev split existed stays valid)
        settings["dev_hours"] = args.dev_hours
    return settings


# --- stage 1: text -------------------------------------------------------------------------------------------------

def load_or_build_text(out: Path) -> tuple[dict[str, list[Pair]], dict]:
    """The aligned pairs per split, built once into OUT/text/ (reruns do not depend on the installed packages)."""
    folder = out / "text"
    files = {split: folder / f"{split}.jsonl" for split in ("train", "heldout")}
    if not (all(path.exists() for path in files.values()) and (folder / "counts.json").exists()):
        log.info("aligning the English and Spanish Bibles (mod2imp; 30-50 s)")
        corpus = build_parallel_corpus(AlignConfig())
        folder.mkdir(parents=True, exist_ok=True)
        for split, path in files.items():
            write_jsonl(path, [asdict(pair) for pair in getattr(corpus, split)])
        write_json(folder / "counts.json", dict(sorted(corpus.counts.items())))
    pairs = {}
    for split, path in files.items():
        with path.open(encoding="utf-8") as handle:
            pairs[split] = [Pair(**json.loads(line)) for line in handle if line.strip()]
    return pairs, json.loads((folder / "counts.json").read_text(encoding="utf-8"))


# --- stage 2: plan -------------------------------------------------------------------------------------------------

def plan_split(split: str, pairs: list[Pair], seconds: float, heldout_voices: bool, args: argparse.Namespace,
               count: int | None = None) -> list[dict]:
    """Items of one split, taking ``pairs`` in order, until the estimated duration reaches ``seconds``
    (or ``count`` items). Pairs that run out first are an InputError naming the option that asked for too much
    (no pair is spoken twice, so the set cannot grow past the text)."""
    prefix = SPLITS[split]
    rng = random.Random(f"{args.seed}-st-voices-{split}")
    items: list[dict] = []
    total = 0.0
    for pair in pairs:
        if (total >= seconds) if count is None else (len(items) >= count):
            break
        voice = sample_voice(rng, heldout=heldout_voices, engines=("espeak",), language=SOURCE_LANG)
        estimate = estimate_seconds(pair.es, voice)
        if estimate > PLAN_MAX_SECONDS:
            continue  # too long for this voice: the pair is skipped, the next one tried with a new voice
        utterance_id = f"{prefix}-{len(items):06d}"
        items.append({"id": utterance_id, "split": split, "text": pair.es, "translation": pair.en, "source": pair.id,
                      "voice": voice.to_dict(), "seed": utterance_seed(f"{args.seed}/st/{utterance_id}"),
                      "estimate_s": round(estimate, 2)})
        total += planned_seconds(estimate, not args.no_augment)
    if count is None and total < seconds:
        option, asked = {"train": ("--hours", args.hours), "dev": ("--dev-hours", args.dev_hours)}.get(
            split, ("--heldout-hours", args.heldout_hours))
        raise InputError(f"{option} {asked:g}: the parallel text holds about {total / 3600:.2f} h of {split} pairs; "
                         "ask for less")
    return items


def load_or_make_plan(out: Path, pairs: dict[str, list[Pair]], args: argparse.Namespace) -> list[dict]:
    """OUT/plan.jsonl (made once; a rerun with other settings is refused)."""
    settings = plan_settings(args)
    planned = read_plan(out, settings)
    if planned is not None:
        return planned
    train = list(pairs["train"])
    random.Random(f"{args.seed}-st-order-train").shuffle(train)
    heldout = list(pairs["heldout"])
    random.Random(f"{args.seed}-st-order-heldout").shuffle(heldout)
    reserve = min(BABBLE_RESERVE, len(train) // 2)  # babble speaks pairs from the far end, never trained on
    items = plan_split("babble", train[len(train) - reserve:], 0, False, args, count=BABBLE_CLIPS)
    items += plan_split("train", train[: len(train) - reserve], args.hours * 3600, False, args)
    half = len(heldout) // 2  # the two held-out manifests never share a pair
    items += plan_split("heldout", heldout[:half], args.heldout_hours * 3600, True, args)
    items += plan_split("heldout_seen", heldout[half:], args.heldout_hours * 3600, False, args)
    if args.dev_hours:  # from the far end of the order, past every pair the two held-out manifests speak
        spoken = {item["source"] for item in items}
        rest = [pair for pair in reversed(heldout) if pair.id not in spoken]
        items += plan_split("dev", rest, args.dev_hours * 3600, True, args)
    write_plan(out, items, settings)
    return items


# --- stages 3 and 4: synthesis (speechstream.data.render, in worker processes) ------------------------------------

RENDER_SPEC = RenderSpec(extra_fields=("translation",),
                         languages={"source_lang": SOURCE_LANG, "target_lang": TARGET_LANG})


def run_stage(name: str, items: list[dict], out: Path, babble_ids: list[str],
              args: argparse.Namespace) -> tuple[dict[str, dict], dict]:
    """Render ``items`` over ``args.workers`` processes; (id -> record, timing summary)."""
    records, timing = render_stage(name, items, out, babble_ids, not args.no_augment, RENDER_SPEC, args.workers, log)
    wall, produced_s, synthesis_s = timing.wall_s, timing.new_audio_s, timing.synthesis_s
    return records, {"wall_s": round(wall, 1), "new_audio_s": round(produced_s, 1), "workers": args.workers,
                     "real_time_factor": round(produced_s / wall, 2) if wall > 0 and produced_s else None,
                     "espeak_x_real_time_per_process": round(produced_s / synthesis_s, 1) if synthesis_s else None}


# --- stage 5: manifests --------------------------------------------------------------------------------------------

def write_manifests(out: Path, plan: list[dict], records: dict[str, dict], text_counts: dict, timings: dict,
                    args: argparse.Namespace) -> dict:
    """Write the three manifests in plan order and stats.json; returns the statistics."""
    stats: dict = {"settings": plan_settings(args), "hours": {}, "utterances": {}, "rejected": {}, "voices": {},
                   "accents": {}, "augmentation": {}, "words_es": {}, "words_en": {}, "text_pairs": text_counts}
    for split in ("train", "heldout", "heldout_seen") + (("dev",) if args.dev_hours else ()):
        made = write_manifest(out, split, plan, records, MANIFEST_FIELDS, stats)
        accents = Counter(record["voice"].split(":")[1].split("+")[0] for record in made)
        stats["voices"][split] = len({record["voice"] for record in made})
        stats["accents"][split] = dict(sorted(accents.items()))
        stats["words_es"][split] = sum(len(record["text"].split()) for record in made)
        stats["words_en"][split] = sum(len(record["translation"].split()) for record in made)
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
    started = time.perf_counter()
    pairs, text_counts = load_or_build_text(out)
    log.info("pairs: %d train, %d held out (%.1f s)", len(pairs["train"]), len(pairs["heldout"]),
             time.perf_counter() - started)
    plan = load_or_make_plan(out, pairs, args)
    log.info("plan: %s", dict(Counter(item["split"] for item in plan)))
    if args.text_only:
        return 0
    if args.limit is not None:
        plan = [item for item in plan if item["split"] == "babble" or int(item["id"][3:]) < args.limit]
    babble = [item for item in plan if item["split"] == "babble"]
    babble_ids = [item["id"] for item in babble]
    records, babble_timing = run_stage("babble", babble, out, [], args)
    speech_records, speech_timing = run_stage("speech", [item for item in plan if item["split"] != "babble"], out,
                                              babble_ids, args)
    records |= speech_records
    stats = write_manifests(out, plan, records, text_counts, {"babble": babble_timing, "speech": speech_timing}, args)
    log.info("hours %s, utterances %s, rejected %s", stats["hours"], stats["utterances"], stats["rejected"])
    log.info("speech stage: %s; total %.1f s", stats["synthesis"].get("speech"), time.perf_counter() - started)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
