"""A non-editable install (``pip install .``, a wheel) carries the shipped models, real clips and live page and
finds them, brings every module the package imports, and builds without setuptools warnings.

The wheel is built offline from a copy of the project (the checkout's own ``build/`` is left alone) and installed
with ``--target`` into a temporary folder, imported from there in a subprocess run outside the repository.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PIP_ENV = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "HF_HUB_OFFLINE": "1"}


def pip(*args: str, cwd: Path) -> str:
    """Run pip offline; its output (stdout and stderr)."""
    result = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, env=PIP_ENV, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def shipped_files() -> set[str]:
    """What a wheel must hold of ``models/`` and ``samples/``: each model's config.yaml, the checkpoint it names and its
    model card; the clips, their manifest and their licences."""
    wanted = {f"speechstream/samples/{p.name}" for p in ROOT.glob("samples/*") if p.suffix in (".wav", ".jsonl", ".md")}
    for config in sorted(ROOT.glob("models/*/config.yaml")):
        name = config.parent.name
        wanted.add(f"speechstream/models/{name}/config.yaml")
        checkpoint = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("checkpoint")
        if checkpoint:
            wanted.add(f"speechstream/models/{name}/{checkpoint}")
        if (config.parent / "MODEL_CARD.md").is_file():
            wanted.add(f"speechstream/models/{name}/MODEL_CARD.md")
    return wanted


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> tuple[Path, str]:
    """The wheel built from a copy of the project, and the build's verbose log."""
    pytest.importorskip("setuptools")  # the build backend, used without build isolation (offline)
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("speechstream", "models", "samples"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    log = pip("wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out), ".", cwd=source)
    (built,) = out.glob("speechstream-*.whl")
    return built, log


@pytest.fixture(scope="module")
def wheel(build) -> Path:
    return build[0]


def test_the_build_has_no_setuptools_warnings(build):
    """A deprecated setting (the ``license`` table, which setuptools says builds stop supporting by 2027-02-18) or
    a package missing from ``packages`` is a warning today and a broken ``pip install .`` later."""
    log = build[1]
    assert "Building wheel for speechstream" in log  # the log is the verbose one
    assert "SetuptoolsDeprecationWarning" not in log and "_Warning" not in log, log


def test_the_wheel_holds_every_module_the_shipped_models_and_the_live_page(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {str(p.relative_to(ROOT)) for p in ROOT.glob("speechstream/**/*.py")}
    web = {str(p.relative_to(ROOT)) for p in (ROOT / "speechstream/web").iterdir() if p.suffix in (".html", ".js")}
    wanted = modules | web | shipped_files()
    assert {"speechstream/cli.py", "speechstream/weights/fetch.py", "speechstream/web/index.html",
            "speechstream/models/smollm2-whisper-base/trainable.safetensors",
            "speechstream/models/smollm2-whisper-base-es-en/config.yaml",
            "speechstream/models/tiny-random/config.yaml", "speechstream/samples/jfk.wav",
            "speechstream/samples/README.md"} <= wanted
    assert sorted(wanted - names) == []


def test_an_installed_wheel_finds_its_shipped_models_clips_and_page(wheel, tmp_path):
    site = tmp_path / "site"
    pip("install", "--no-deps", "--target", str(site), str(wheel), cwd=tmp_path)
    probe = (
        "import json; from speechstream import bench, model, server\n"
        "print(json.dumps({'file': model.__file__, 'models': str(model.MODELS_DIR), 'defaults': model.DEFAULT_MODELS,"
        " 'asr': str(model.model_config_path(model.ASR_MODEL)), 'page': str(server.WEB_DIR / 'index.html'),"
        " 'samples': str(bench.SAMPLES_DIR), 'clips': len(bench.load_clips())}))"
    )
    env = {**PIP_ENV, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    installed = site.resolve() / "speechstream"
    assert found["file"] == str(installed / "model.py")  # the installed copy, not the checkout
    assert found["models"] == str(installed / "models")
    assert found["defaults"] == {"asr": "smollm2-whisper-base", "translate": "smollm2-whisper-base-es-en"}
    assert found["asr"] == str(installed / "models/smollm2-whisper-base/config.yaml")
    assert Path(found["page"]).is_file()
    assert found["samples"] == str(installed / "samples")
    assert found["clips"] == len(list(ROOT.glob("samples/*.wav")))  # what `speechstream bench` streams


def test_a_checkout_finds_the_models_and_clips_at_the_repository_root():
    from speechstream import shipped_dir
    from speechstream.bench import SAMPLES_DIR
    from speechstream.model import MODELS_DIR

    assert MODELS_DIR == ROOT / "models" and SAMPLES_DIR == ROOT / "samples"
    assert shipped_dir(ROOT / "speechstream", "models") == ROOT / "models"


def test_the_installed_copy_wins_over_a_folder_beside_the_package(tmp_path):
    from speechstream import shipped_dir

    package = tmp_path / "speechstream"
    (package / "models").mkdir(parents=True)
    (tmp_path / "models").mkdir()  # e.g. another distribution's top-level models/ in site-packages
    assert shipped_dir(package, "models") == package / "models"


def test_make_clean_removes_the_build_folder_a_wheel_would_reuse(tmp_path):
    """setuptools builds a wheel over ``build/lib`` as it finds it: a module deleted since the last build stays."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "build/lib/speechstream").mkdir(parents=True)
    (tmp_path / "build/lib/speechstream/deleted.py").write_text("x = 1\n", encoding="utf-8")
    (tmp_path / "speechstream.egg-info").mkdir()
    result = subprocess.run(["make", "-C", str(tmp_path), "clean"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "build").exists() and not (tmp_path / "speechstream.egg-info").exists()


# Modules imported for the package by a dependency's own code, which its metadata does not require: silero-vad's
# load_silero_vad(onnx=True) (speechstream/vad.py: the VAD, on by default) imports onnxruntime.
INDIRECT_IMPORTS = {"onnxruntime"}


def imported_modules(paths) -> set[str]:
    """Top-level names of every module the files import (at their top or inside functions), stdlib left out."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names - set(sys.stdlib_module_names) - {"speechstream"}


def provided_modules(requirements: list[str]) -> set[str]:
    """Top-level modules of the installed distributions the requirements pull in, transitively (markers evaluated
    here, extras followed)."""
    from importlib import metadata

    from packaging.requirements import Requirement

    by_distribution: dict[str, set[str]] = {}
    for module, distributions in metadata.packages_distributions().items():
        for distribution in distributions:
            by_distribution.setdefault(canonical(distribution), set()).add(module)
    seen, todo, modules = set(), [(Requirement(r), "") for r in requirements], set()
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        name = canonical(requirement.name)
        for wanted in ["", *requirement.extras]:
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            try:
                requires = metadata.requires(requirement.name) or []
            except metadata.PackageNotFoundError:  # not installed here: it provides nothing to import
                continue
            modules |= by_distribution.get(name, set())
            todo += [(Requirement(r), wanted) for r in requires]
    return modules


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_pip_install_brings_every_module_the_package_imports():
    """``pip install .`` installs the ``dependencies`` only (``.[synth]`` the synthesis extra too): each module the
    package imports must come with them, or a command fails in a clean environment that ``make`` never set up."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    synthesis = {ROOT / "speechstream/data/synthesize.py"}
    runtime = set(ROOT.glob("speechstream/**/*.py")) - synthesis
    provided = provided_modules(project["dependencies"])
    assert sorted((imported_modules(runtime) | INDIRECT_IMPORTS) - provided) == []
    extra = provided_modules([*project["dependencies"], *project["optional-dependencies"]["synth"]])
    assert sorted(imported_modules(synthesis) - extra) == []
