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
               (held-out pairs, training voices), OUT/stats.json

Resumable: an utterance whose ``<id>.json`` exists, was made from the same plan item and whose wav has the recorded
size is not made again (both are written to a temporary name and renamed). Seeded: every utterance draws its voice
settings, synthesis noise and augmentation from its own seed, so a rerun with any number of workers writes the same
files.
"""

from __future__ import annotations

import os

for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")  # one thread per worker process; set before numpy/torch load

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from concurrent.futures import ProcessPoolExecutor, as_completed  # noqa: E402
from dataclasses import asdict  # noqa: E402
from multiprocessing import get_context  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from speechstream.data.augment import AugmentConfig, augment  # noqa: E402
from speechstream.data.parallel_text import AlignConfig, Pair, build_parallel_corpus  # noqa: E402
from speechstream.data.synthesize import (  # noqa: E402
    Voice,
    WordTime,
    estimate_seconds,
    sample_voice,
    synthesize,
    write_wav,
)

log = logging.getLogger("prepare_st")

PLAN_VERSION = 1  # bump when the plan's meaning changes: an old OUT must then be remade
SOURCE_LANG, TARGET_LANG = "es", "en"
SPLITS = {"train": "tr", "heldout": "ho", "heldout_seen": "hs", "babble": "bb"}  # split -> id prefix
MIN_SECONDS, MAX_SECONDS = 1.0, 12.0  # clips outside are dropped (recorded as rejected)
PLAN_MAX_SECONDS = 10.5  # pairs estimated longer than this (for the drawn voice) are not planned
BABBLE_CLIPS = 24
BABBLE_RESERVE = 500  # training pairs (the last of the shuffled order) kept for babble
SHARD_SIZE = 1000
MANIFEST_FIELDS = ("id", "audio", "text", "translation", "words", "duration", "voice", "voice_settings", "source",
                   "aug", "source_lang", "target_lang")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="output folder (created; reused when rerun)")
    parser.add_argument("--hours", type=float, required=True, help="hours of training speech to plan")
    parser.add_argument("--seed", type=int, default=0, help="seed of the pair order, voices and augmentation")
    parser.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1),
                        help="synthesis processes (each uses one CPU thread)")
    parser.add_argument("--heldout-hours", type=float, default=None,
                        help="hours of each held-out manifest (default: 3%% of --hours, at least 0.05, at most 0.5)")
    parser.add_argument("--no-augment", action="store_true", help="write clean clips only")
    parser.add_argument("--limit", type=int, default=None,
                        help="synthesize only the first N planned utterances of each split (for trials)")
    parser.add_argument("--text-only", action="store_true", help="stop after the text and plan stages")
    args = parser.parse_args(argv)
    if args.hours <= 0 or args.workers < 1:
        parser.error("--hours must be positive and --workers at least 1")
    if args.heldout_hours is None:
        args.heldout_hours = min(0.5, max(0.05, 0.03 * args.hours))
    return args


def plan_settings(args: argparse.Namespace) -> dict:
    """What the plan depends on; a rerun with other settings must use another --out."""
    return {"plan_version": PLAN_VERSION, "hours": args.hours, "heldout_hours": args.heldout_hours,
            "seed": args.seed, "augment": not args.no_augment, "source_lang": SOURCE_LANG, "target_lang": TARGET_LANG}


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

def utterance_seed(seed: int, utterance_id: str) -> int:
    """A 63-bit seed for one utterance, independent of every other."""
    return int.from_bytes(hashlib.sha256(f"{seed}/st/{utterance_id}".encode()).digest()[:8], "big") >> 1


def plan_split(split: str, pairs: list[Pair], seconds: float, heldout_voices: bool, args: argparse.Namespace,
               count: int | None = None) -> list[dict]:
    """Items of one split, taking ``pairs`` in order, until the estimated duration reaches ``seconds``
    (or ``count`` items, or the pairs run out)."""
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
                      "voice": voice.to_dict(), "seed": utterance_seed(args.seed, utterance_id),
                      "estimate_s": round(estimate, 2)})
        total += estimate + 0.35  # mean padding added by augmentation
    return items


def load_or_make_plan(out: Path, pairs: dict[str, list[Pair]], args: argparse.Namespace) -> list[dict]:
    """OUT/plan.jsonl (made once; a rerun with other settings is refused)."""
    settings = plan_settings(args)
    plan_path, settings_path = out / "plan.jsonl", out / "plan-settings.json"
    if plan_path.exists() and settings_path.exists():
        recorded = json.loads(settings_path.read_text(encoding="utf-8"))
        if recorded != settings:
            raise SystemExit(f"{out} was planned with {recorded}, not {settings}: use another --out")
        with plan_path.open(encoding="utf-8") as handle:
            return [json.loads(line) for line in handle]
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
    write_jsonl(plan_path, items)
    write_json(settings_path, settings)
    return items


# --- stages 3 and 4: synthesis (worker processes) --------------------------------------------------------------------

_BABBLE: list[np.ndarray] | None = None


def init_worker() -> None:
    import torch  # noqa: PLC0415

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass


def wav_path(out: Path, item: dict) -> Path:
    prefix = SPLITS[item["split"]]
    folder = "babble" if item["split"] == "babble" else f"wav/{prefix}{int(item['id'][3:]) // SHARD_SIZE:03d}"
    return out / folder / f"{item['id']}.wav"


def item_key(item: dict, do_augment: bool) -> str:
    """A digest of everything that determines an utterance (text, translation, voice, seed, augmentation on/off)."""
    recipe = json.dumps([item["text"], item["translation"], item["voice"], item["seed"], do_augment], sort_keys=True)
    return hashlib.sha256(recipe.encode()).hexdigest()[:16]


def finished_record(out: Path, item: dict, do_augment: bool) -> dict | None:
    try:
        record = json.loads(wav_path(out, item).with_suffix(".json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if record.get("key") != item_key(item, do_augment):
        return None
    if "rejected" in record:
        return record
    wav = wav_path(out, item)
    return record if wav.exists() and wav.stat().st_size == record.get("bytes") else None


def load_babble(out: Path, babble_ids: list[str]) -> list[np.ndarray]:
    global _BABBLE  # noqa: PLW0603
    if _BABBLE is None:
        import soundfile  # noqa: PLC0415

        _BABBLE = [soundfile.read(str(out / "babble" / f"{utterance_id}.wav"), dtype="float32")[0]
                   for utterance_id in babble_ids if (out / "babble" / f"{utterance_id}.wav").exists()]
    return _BABBLE


def render(item: dict, out: Path, babble_ids: list[str], do_augment: bool) -> dict:
    """Make one utterance (or return its finished record)."""
    record = finished_record(out, item, do_augment)
    if record is not None:
        return record | {"_skipped": True}
    started = time.perf_counter()
    voice = Voice.from_dict(item["voice"])
    utterance = synthesize(item["text"], voice, seed=item["seed"] % 2**31)
    synthesis_s = time.perf_counter() - started
    samples, ends = utterance.samples, [word.end for word in utterance.words]
    description: dict = {}
    if do_augment and item["split"] != "babble":
        rng = np.random.default_rng(item["seed"])
        samples, ends, description = augment(samples, ends, AugmentConfig(max_seconds=MAX_SECONDS), rng,
                                             load_babble(out, babble_ids))
    duration = len(samples) / 16000
    path = wav_path(out, item)
    record = {key: item[key] for key in ("id", "split", "text", "translation", "source")}
    record["key"] = item_key(item, do_augment)
    if not MIN_SECONDS <= duration <= MAX_SECONDS and item["split"] != "babble":
        record["rejected"] = f"duration {duration:.2f} s outside [{MIN_SECONDS}, {MAX_SECONDS}]"
    else:
        size = write_wav(path, samples)
        words = [WordTime(word.w, round(min(end, duration), 4)) for word, end in zip(utterance.words, ends)]
        record |= {"audio": path.relative_to(out).as_posix(), "duration": round(duration, 4),
                   "words": [asdict(word) for word in words], "voice": voice.id, "voice_settings": item["voice"],
                   "aug": description, "source_lang": SOURCE_LANG, "target_lang": TARGET_LANG, "bytes": size}
    write_json(path.with_suffix(".json"), record)
    return record | {"_synthesis_s": synthesis_s}


def run_stage(name: str, items: list[dict], out: Path, babble_ids: list[str],
              args: argparse.Namespace) -> tuple[dict[str, dict], dict]:
    """Render ``items`` over ``args.workers`` processes; (id -> record, timing summary)."""
    records: dict[str, dict] = {}
    started = time.perf_counter()
    produced_s = synthesis_s = 0.0
    do_augment = not args.no_augment

    def collect(record: dict) -> None:
        nonlocal produced_s, synthesis_s
        if not record.pop("_skipped", False) and "_synthesis_s" in record:
            synthesis_s += record.pop("_synthesis_s")
            produced_s += record.get("duration", 0.0)
        records[record["id"]] = record
        if len(records) % 100 == 0 or len(records) == len(items):
            wall = time.perf_counter() - started
            log.info("%s: %d/%d done, %.3f h new audio, %.1fx real time", name, len(records), len(items),
                     produced_s / 3600, produced_s / wall if wall > 0 else 0.0)

    if args.workers == 1:
        init_worker()
        for item in items:
            collect(render(item, out, babble_ids, do_augment))
    else:
        with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn"), initializer=init_worker) as pool:
            for future in as_completed([pool.submit(render, item, out, babble_ids, do_augment) for item in items]):
                collect(future.result())
    wall = time.perf_counter() - started
    return records, {"wall_s": round(wall, 1), "new_audio_s": round(produced_s, 1), "workers": args.workers,
                     "real_time_factor": round(produced_s / wall, 2) if wall > 0 and produced_s else None,
                     "espeak_x_real_time_per_process": round(produced_s / synthesis_s, 1) if synthesis_s else None}


# --- stage 5: manifests --------------------------------------------------------------------------------------------

def write_manifests(out: Path, plan: list[dict], records: dict[str, dict], text_counts: dict, timings: dict,
                    args: argparse.Namespace) -> dict:
    stats: dict = {"settings": plan_settings(args), "hours": {}, "utterances": {}, "rejected": {}, "voices": {},
                   "accents": {}, "augmentation": {}, "words_es": {}, "words_en": {}, "text_pairs": text_counts}
    for split in ("train", "heldout", "heldout_seen"):
        lines, voices, accents, augmentation, rejected = [], Counter(), Counter(), Counter(), 0
        for item in plan:
            if item["split"] != split or item["id"] not in records:
                continue
            record = records[item["id"]]
            if "rejected" in record:
                rejected += 1
                continue
            lines.append({key: record[key] for key in MANIFEST_FIELDS})
            voices[record["voice"]] += 1
            accents[record["voice"].split(":")[1].split("+")[0]] += 1
            for step, value in record["aug"].items():
                if step == "noise":
                    augmentation[f"noise_{value['kind']}"] += 1
                elif step in ("speed", "reverb"):
                    augmentation[step] += 1
        write_jsonl(out / f"{split}.jsonl", lines)
        stats["hours"][split] = round(sum(line["duration"] for line in lines) / 3600, 4)
        stats["utterances"][split] = len(lines)
        stats["rejected"][split] = rejected
        stats["voices"][split] = len(voices)
        stats["accents"][split] = dict(sorted(accents.items()))
        stats["augmentation"][split] = dict(sorted(augmentation.items()))
        stats["words_es"][split] = sum(len(line["text"].split()) for line in lines)
        stats["words_en"][split] = sum(len(line["translation"].split()) for line in lines)
    previous = read_json(out / "stats.json") or {}
    fresh = {name: timing for name, timing in timings.items() if timing.get("new_audio_s")}
    stats["synthesis"] = previous.get("synthesis", {}) | fresh  # keep the speed of the run that made the audio
    write_json(out / "stats.json", stats)
    return stats


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    os.replace(temporary, path)


def write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(temporary, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
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
    sys.exit(main())
