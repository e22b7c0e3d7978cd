"""The documentation is true to the code: what README.md, docs/*.md, the recipes' READMEs and the model cards
name exists.

Mechanical checks only, cheap (no model loads): every ``--option`` the docs name is an option of the command it is
given to (or of some command or recipe script), every repository path they name exists, the README's module table
names every module of the package, dotted ``speechstream.`` names resolve (and the short ``outputs.MAX_CUE_SECONDS``,
``StreamingSession.gap`` forms of a module's constant or a class's member), and the numbers the docs state as
defaults and limits are the constants the code uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "recipes").glob("*/README.md"),
               *(ROOT / "models").glob("*/MODEL_CARD.md"), ROOT / "samples/README.md"])
COMMANDS = ("transcribe", "verify", "eval", "compare", "train", "serve", "live", "bench", "fetch")
# options of other tools that the docs mention (pip's, for how simuleval is installed; those of torchrun and accelerate
# launch, which start a multi-process training run)
FOREIGN_OPTIONS = {"--no-deps", "--nproc_per_node", "--multi_gpu", "--num_processes", "--cpu", "--mixed_precision"}
PATH_ROOTS = ("speechstream/", "recipes/", "tests/", "models/", "docs/", "samples/")


def doc_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def flat(path: Path) -> str:
    """A doc's text on one line: wrapped sentences and quoted (``> ``) blocks joined, spaces collapsed."""
    text = re.sub(r"\n>? ?", " ", path.read_text(encoding="utf-8"))
    return re.sub(r"\s+", " ", text)


def command_options() -> dict[str, set[str]]:
    """Every subcommand's option strings (``--no-vad`` included), from the real parser."""
    from speechstream.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: {o for a in sub._actions for o in a.option_strings} for name, sub in commands.choices.items()}


def script_options() -> set[str]:
    """Options the recipe scripts and the library's command lines define (``add_argument("--x"``)."""
    found = set()
    for source in [*ROOT.glob("recipes/**/*.py"), *ROOT.glob("speechstream/**/*.py")]:
        found |= set(re.findall(r"add_argument\(\s*\"(--[a-z0-9-]+)\"", source.read_text(encoding="utf-8")))
    return found


def named_options(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", text))


def shell_blocks(text: str) -> list[str]:
    """The fenced code blocks of a doc marked ``sh``, ``bash`` or nothing, each fence paired with its own closing one
    (a pattern from one fence to the next took the prose between a ``json`` block and the next block for code)."""
    blocks, lines, language = [], None, None
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if lines is None:
                lines, language = [], line[3:].strip()
            else:
                if language in ("", "sh", "bash"):
                    blocks.append("".join(lines))
                lines = None
        elif lines is not None:
            lines.append(line)
    return blocks


def command_uses(path: Path) -> list[tuple[str, str]]:
    """(command, its arguments) for each ``speechstream CMD ...`` in code blocks and inline code of a doc: up to the
    end of the inline code or line, a shell comment or a pipe."""
    uses = []
    text = path.read_text(encoding="utf-8")
    snippets = re.findall(r"`([^`\n]+)`", text)
    snippets += [line for block in shell_blocks(text) for line in block.splitlines()]
    for snippet in snippets:
        for match in re.finditer(rf"speechstream ({'|'.join(COMMANDS)})\b([^|#`]*)", snippet):
            uses.append((match.group(1), match.group(2)))
    return uses


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_option_a_doc_names_exists(doc):
    known = set().union(*command_options().values()) | script_options() | FOREIGN_OPTIONS
    unknown = sorted(named_options(doc.read_text(encoding="utf-8")) - known)
    assert not unknown, f"{doc_id(doc)} names options no command or script has: {unknown}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_a_command_line_in_a_doc_uses_options_of_that_command(doc):
    options, uses = command_options(), command_uses(doc)
    if doc.name == "README.md" and doc.parent == ROOT:  # the check itself finds the README's command lines
        assert len({command for command, _ in uses}) >= 6, uses
    wrong = [f"speechstream {command} {option}" for command, rest in uses
             for option in sorted(named_options(rest) - options[command])]
    assert not wrong, f"{doc_id(doc)}: {wrong}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_repository_path_a_doc_names_exists(doc):
    missing = []
    for code in re.findall(r"`([^`\n]+)`", doc.read_text(encoding="utf-8")):
        for token in code.split():
            path = token.rstrip(".,;:)").split(":")[0]
            if not path.startswith(PATH_ROOTS) or re.search(r"[<{$]", path):
                continue
            if not (any(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()):
                missing.append(path)
    assert not missing, f"{doc_id(doc)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_make_target_a_doc_names_exists(doc):
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M))
    named = set(re.findall(r"\bmake ([a-z][\w-]*)", doc.read_text(encoding="utf-8")))
    assert named <= targets, f"{doc_id(doc)} names make targets the Makefile lacks: {sorted(named - targets)}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_no_doc_counts_the_tests(doc):
    """A count of tests is stale with the next test added (recipes/asr/README.md said 152 of 155; README.md, "11
    passed" of the GPU tests)."""
    counts = re.findall(r"\b\d[\d,]* (?:tests|passed|failed)\b", flat(doc))
    assert not counts, f"{doc_id(doc)} counts tests: {counts}; say what they check instead"


def readme_module_table() -> list[str]:
    """The file column of README's "How it works" table (one file or folder per backticked name)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## How it works", 1)[1].split("\n\n**", 1)[0]
    rows = [line.split("|")[2] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    return [name for cell in rows[1:] for name in re.findall(r"`([^`]+)`", cell)]


def test_the_readme_module_table_names_every_module_and_only_real_ones():
    named = readme_module_table()
    assert named, "README.md: no module table under How it works"
    assert [name for name in named if not (ROOT / name).exists()] == []
    package = ROOT / "speechstream"
    modules = [f"speechstream/{p.name}" for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")]
    packages = [f"speechstream/{p.name}/" for p in package.iterdir() if p.is_dir() and not p.name.startswith("__")]
    unnamed = sorted(set(modules + packages) - {name if "." in name else name.rstrip("/") + "/" for name in named})
    assert not unnamed, f"README.md's module table leaves out {unnamed}"


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_dotted_speechstream_name_resolves(doc):
    unresolved = []
    for name in sorted(set(re.findall(r"`(speechstream(?:\.\w+)+)(?:\([^`]*\))?`", doc.read_text(encoding="utf-8")))):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                target = importlib.import_module(".".join(parts[:cut]))
                break
            except ModuleNotFoundError:
                continue
        try:
            for attribute in parts[cut:]:
                target = getattr(target, attribute)
        except AttributeError:
            unresolved.append(name)
    assert not unresolved, f"{doc_id(doc)} names what the package does not have: {unresolved}"


def package_modules() -> dict[str, Path]:
    """Every module of the package (``speechstream.eval.run``) and its file."""
    return {".".join(path.relative_to(ROOT).with_suffix("").parts): path
            for path in sorted((ROOT / "speechstream").rglob("*.py")) if path.stem not in ("__init__", "__main__")}


def short_name_exists(name: str) -> bool | None:
    """Whether ``module.CONSTANT`` (a package module by its last name) or ``Class.member`` (a class the package
    defines: an attribute, a field or a ``self.member`` its methods set) exists; None for any other dotted name
    (a config key such as ``encoder.lookahead_frames``, a variable such as ``session.words``, a file name)."""
    head, member = name.split(".")
    modules = package_modules()
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", member):
        owners = [module for module in modules if module.rsplit(".", 1)[-1] == head]
        return any(hasattr(importlib.import_module(module), member) for module in owners) if owners else None
    owners = [module for module, path in modules.items()
              if re.search(rf"^class {head}\b", path.read_text(encoding="utf-8"), re.M)]
    if not owners:
        return None
    for module in owners:
        cls = getattr(importlib.import_module(module), head)
        annotated = any(member in getattr(base, "__annotations__", {}) for base in cls.__mro__)
        if hasattr(cls, member) or annotated or re.search(rf"self\.{member}\b", inspect.getsource(cls)):
            return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_every_constant_and_class_member_a_doc_names_exists(doc):
    names = set(re.findall(r"`([A-Za-z]\w*\.\w+)(?:\([^`]*\))?`", doc.read_text(encoding="utf-8")))
    missing = sorted(name for name in names if short_name_exists(name) is False)
    assert not missing, f"{doc_id(doc)} names what the package does not have: {missing}"


def test_the_short_name_check_finds_constants_and_members():
    assert short_name_exists("outputs.MIN_SHOW_SECONDS") and short_name_exists("StreamingSession.gap")
    assert short_name_exists("Word.aligned") and short_name_exists("DecodingConfig.vad")
    assert short_name_exists("outputs.MIN_SHOW_SECOND") is False and short_name_exists("StreamingSession.gaps") is False
    assert short_name_exists("encoder.lookahead_frames") is None and short_name_exists("config.yaml") is None


def stated_numbers() -> list[tuple[str, str]]:
    """(doc, phrase) pairs: each phrase states a default or limit, built from the constant the code uses."""
    from speechstream import ctc, live, outputs, server
    from speechstream.eval import run
    from speechstream.config import DecodingConfig
    from speechstream.server import ServerConfig
    from speechstream.vad import VADConfig
    from speechstream.bench import BenchConfig
    from speechstream.train import TrainConfig

    train_threads = next(f.default for f in dataclasses.fields(TrainConfig) if f.name == "threads")
    decoding, vad, serving = DecodingConfig(), VADConfig(), ServerConfig()
    lag = re.search(r"LAG_LIMIT_S = (\d+)", (ROOT / "speechstream/web/app.js").read_text(encoding="utf-8")).group(1)
    words = dict(enumerate(("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")))
    return [
        ("README.md", f"(`--max-repeats`, default {decoding.max_repeats})"),
        ("README.md", f"`--ctc-candidates` ({decoding.ctc_candidates})"),
        ("README.md", f"`vad_min_silence_ms` ({decoding.vad_min_silence_ms})"),
        ("README.md", f"`max_tail_tokens` ({decoding.max_tail_tokens})"),
        ("README.md", f"`context_tokens` (default {decoding.context_tokens})"),
        ("README.md", f"once {vad.min_speech_ms} ms of speech have been heard, {vad.speech_pad_ms} ms before"),
        ("README.md", f"window {vad.max_segment_s:g} s after the segment's start"),
        ("README.md", f"unconditionally at {2 * vad.max_segment_s:g} s"),
        ("README.md", f"more than {live.MAX_QUEUED_S} s behind"),
        ("README.md", f"at most {outputs.MAX_CUE_SECONDS:g} s before its end"),
        ("README.md", f"(at most {outputs.MAX_CUE_CHARS} characters and {outputs.MAX_CUE_SECONDS:g} s, a new one"),
        ("README.md", f"a cue shorter than {outputs.MIN_SHOW_SECONDS:g} s is held on screen until "
                      f"{outputs.MIN_SHOW_SECONDS:g} s"),
        ("docs/manifest.md", f"({1000 * run.SENTENCE_SLACK_S:g} ms of slack at the end)"),
        ("README.md", f"stops recording past {lag} s of lag"),
        ("README.md", f"http://127.0.0.1:{serving.port}/"),
        ("README.md", f"{words[ctc.TAIL_MARGIN]} labels more than the CTC head's own best path (`TAIL_MARGIN`)"),
        ("README.md", f"{words[ctc.SHORT_MARGIN]} or more labels short of the head's own best path (`SHORT_MARGIN`)"),
        ("docs/websocket.md", f"[--port {serving.port}]"),
        ("docs/websocket.md", f"takes at most {server.MAX_UNITS_AHEAD} chunks' worth of each stream's frames"),
        ("docs/websocket.md", f"while {server.MAX_UNITS_AHEAD} of its chunks wait"),
        ("docs/websocket.md", f"Common rates from {server.MIN_SAMPLE_RATE} to {server.MAX_SAMPLE_RATE} Hz"),
        ("docs/websocket.md", f'"message": "{server.STREAM_FAILURE_MESSAGE}"'),
        ("docs/websocket.md", f"`--idle-timeout-s` seconds (default {serving.idle_timeout_s:g};"),
        ("docs/websocket.md", f"within `--start-timeout-s` seconds, default {serving.start_timeout_s:g},"),
        ("docs/websocket.md", f"once {serving.max_unread_events} events wait for it"),
        ("docs/websocket.md", f"or one event has waited {serving.send_timeout_s:g} s"),
        ("docs/websocket.md", f'"message": "{server.UNREAD_MESSAGE}"'),
        ("README.md", f"({serving.max_unread_events} waiting, or one for {serving.send_timeout_s:g} s)"),
        ("README.md", f"`bench` always measures on {'one thread' if BenchConfig().threads == 1 else None}"),
        ("README.md", f"`train` takes the recipe's `threads` ({train_threads} by default: torch's own"),
    ]


@pytest.mark.parametrize("doc, phrase", stated_numbers())
def test_a_number_a_doc_states_is_the_code_constant(doc, phrase):
    said = phrase in flat(ROOT / doc)
    assert said, f"{doc} no longer says {phrase!r}: update the doc or the constant"


def test_the_readme_lists_the_recipe_fields_a_resumed_training_may_change():
    from speechstream.train.recipe import FREE_FIELDS

    text = flat(ROOT / "README.md")
    sentence = text[text.index("a resumed training run is held to the recipe"):].split(" may change")[0]
    named = set(re.findall(r"`(\w+)`", sentence.split("only", 1)[1]))
    assert named == set(FREE_FIELDS) - {"out_dir"}, named


def test_the_websocket_start_fields_are_the_documented_ones():
    from speechstream.server import START_FIELDS

    text = flat(ROOT / "docs/websocket.md")
    one_stream = text.split("## One stream", 1)[1].split("2. Then binary frames", 1)[0]
    assert set(START_FIELDS) <= set(re.findall(r"`(\w+)`", one_stream)) | {"type"}


def train_command_lines(path: Path) -> list[str]:
    """The arguments of each ``speechstream train RECIPE key=value ...`` of a doc's shell blocks, lines continued
    with a backslash joined, up to a shell comment or the line's end."""
    lines = [line for block in shell_blocks(path.read_text(encoding="utf-8"))
             for line in block.replace("\\\n", " ").splitlines()]
    return [match.group(1).split("#")[0].split() for line in lines
            for match in [re.search(r"speechstream train (.*)", line)] if match]


@pytest.mark.parametrize("doc", DOCS, ids=doc_id)
def test_a_training_command_a_doc_shows_takes_its_overrides(doc):
    """A recipe with its overrides is checked whole (recipes/st/README.md's smoke run, ``steps=20``, was refused once
    the recipe had 600 CTC-only steps: "ctc_only_steps (600) must not exceed steps (20)", exit 2; the README's
    ``recipes/asr/<recipe>.yaml steps=500`` by the shipped recipe, of 1500 CTC-only steps)."""
    from speechstream.train import load_train_config

    refused = []
    for recipe, *rest in train_command_lines(doc):
        if "<recipe>.yaml" in recipe:  # (the README's: every recipe of that folder)
            recipes = [str(path.relative_to(ROOT)) for path in sorted((ROOT / recipe).parent.glob("*.yaml"))]
        elif re.search(r"[<{$]", recipe):  # (another placeholder)
            continue
        else:
            recipes = [recipe]
        for name in recipes:
            try:
                load_train_config(str(ROOT / name), [item for item in rest if "=" in item and not item.startswith("-")])
            except Exception as error:  # noqa: BLE001 (the doc's command line, whatever refuses it)
                refused.append(f"{name}: {error}")
    assert not refused, f"{doc_id(doc)} shows training commands that are refused: {refused}"


def test_the_training_command_check_reads_continued_lines():
    assert [["recipes/st/smollm2-whisper-base-es-en.yaml", "train_manifest=data/st-small/train.jsonl",
             "dev_manifest=data/st-small/heldout.jsonl"]] == [
        line[:3] for line in train_command_lines(ROOT / "recipes/st/README.md")]
