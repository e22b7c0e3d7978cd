"""The recipes' run.sh scripts, driven with a stand-in ``speechstream`` command (nothing is trained)."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for .venv/bin/speechstream: ``train recipes/asr/NAME.yaml`` adds an entry named after the run to
# runs/NAME/features/<cache folder>/, the folder speechstream.train.FeatureCache names (chunk, encoder digest).
FAKE_SPEECHSTREAM = """#!/usr/bin/env bash
set -euo pipefail
echo "$*" >> calls.log
if [ "$1" = train ]; then
  name=$(basename "$2" .yaml)
  mkdir -p "runs/$name/features/chunk640-encoder0123456789ab"
  touch "runs/$name/features/chunk640-encoder0123456789ab/$name.safetensors"
fi
"""


def test_asr_run_sh_shares_the_feature_cache_between_continuations(tmp_path: Path):
    (tmp_path / "recipes" / "asr").mkdir(parents=True)
    shutil.copy(ROOT / "recipes" / "asr" / "run.sh", tmp_path / "recipes" / "asr" / "run.sh")
    fake = tmp_path / ".venv" / "bin" / "speechstream"
    fake.parent.mkdir(parents=True)
    fake.write_text(FAKE_SPEECHSTREAM)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    result = subprocess.run(["bash", str(tmp_path / "recipes" / "asr" / "run.sh"), "1", "1"], cwd="/",
                            capture_output=True, text=True, timeout=60, env=os.environ | {"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr

    calls = (tmp_path / "calls.log").read_text().splitlines()  # run from the repository root, whatever the cwd
    assert [call.split()[-1] for call in calls if call.startswith("train")][-1] == \
        "recipes/asr/smollm2-whisper-base-ctc.yaml"
    first = tmp_path / "runs" / "smollm2-whisper-base" / "features" / "chunk640-encoder0123456789ab"
    assert not first.is_symlink()
    for run in ("more", "1c", "1d", "ctc"):
        folder = tmp_path / "runs" / f"smollm2-whisper-base-{run}" / "features" / first.name
        assert folder.is_symlink() and folder.resolve() == first.resolve(), run
    # every run found the cache of those before it and added to it: one folder holds them all
    assert sorted(path.stem for path in first.iterdir()) == sorted(
        ["smollm2-whisper-base"] + [f"smollm2-whisper-base-{run}" for run in ("more", "1c", "1d", "ctc")])


@pytest.mark.parametrize("recipe,last", [("asr", 3), ("st", 5)])
@pytest.mark.parametrize("stages", [["one"], ["1", "x"], ["3", "1"], ["9"], ["0", "9"], ["-1"], ["0", "1", "2"]])
def test_run_sh_refuses_stages_it_does_not_have(tmp_path: Path, recipe: str, last: int, stages: list[str]):
    """A stage argument that is not a stage ran nothing and exited 0 (the test's error made every `if` false)."""
    (tmp_path / "recipes" / recipe).mkdir(parents=True)
    script = tmp_path / "recipes" / recipe / "run.sh"
    shutil.copy(ROOT / "recipes" / recipe / "run.sh", script)
    result = subprocess.run(["bash", str(script), *stages], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == f"usage: {script} [first_stage] [last_stage] (stages 0-{last}, first <= last)\n"


def test_st_run_sh_trains_stage_2c_from_2b_and_ships_their_mean(tmp_path: Path):
    """Stages 1-3 of the translation recipe with stand-ins for speechstream and python: the new pairs of data/st-c
    are built after data/st-main, stage 2c trains after 2b (its recipe starts from 2b's run), and stage 3 exports
    the mean of 2c's run and 2b's weights, the file the shipped model was averaged from."""
    (tmp_path / "recipes" / "st").mkdir(parents=True)
    shutil.copy(ROOT / "recipes" / "st" / "run.sh", tmp_path / "recipes" / "st" / "run.sh")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("speechstream", "python"):
        (bin_dir / name).write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> calls.log\n')
        (bin_dir / name).chmod(0o755)
    result = subprocess.run(["bash", str(tmp_path / "recipes" / "st" / "run.sh"), "1", "3"], cwd="/",
                            capture_output=True, text=True, timeout=60, env=os.environ | {"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    outs = [call.split("--out ")[1].split()[0] for call in calls if "prepare_st.py" in call]
    assert outs == ["data/st-main", "data/st-c"]
    model = "smollm2-whisper-base-es-en"
    assert [call.split()[-1] for call in calls if call.startswith("speechstream train")] == [
        f"recipes/st/{model}.yaml", f"recipes/st/{model}-b.yaml", f"recipes/st/{model}-c.yaml"]
    assert calls[-1] == (f"python recipes/asr/export.py runs/{model}-c models/{model} "
                         f"--average-with runs/{model}-b/trainable.safetensors")
    recipe_c = (ROOT / "recipes" / "st" / f"{model}-c.yaml").read_text()
    assert f"init_checkpoint: runs/{model}-b/trainable.safetensors" in recipe_c.splitlines()


# On its first call, a stand-in that rewrites the running script in place (the same file, as an editor saving it
# does), three comment lines longer: bash reading the script as it runs would then go on at the wrong byte.
EDITING_STAND_IN = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> calls.log
if [ -n "${EDIT_SCRIPT:-}" ] && [ ! -e edited ]; then
  touch edited
  { printf '# edited\\n# while\\n# running\\n'; cat "$EDIT_SCRIPT"; } > edited.tmp
  cat edited.tmp > "$EDIT_SCRIPT"
fi
"""


@pytest.mark.parametrize("recipe,stages", [("asr", ["1", "2"]), ("st", ["1", "3"])])
def test_run_sh_is_not_changed_by_editing_it_while_it_runs(tmp_path: Path, recipe: str, stages: list[str]):
    """A recipe runs for hours; an edit saved meanwhile must not make bash run other lines (it read the script as
    it went, so the stage that was running re-ran or a half line ran). The calls are those of an unedited run."""
    calls = {}
    for edit in (False, True):
        root = tmp_path / str(edit)
        (root / "recipes" / recipe).mkdir(parents=True)
        script = root / "recipes" / recipe / "run.sh"
        shutil.copy(ROOT / "recipes" / recipe / "run.sh", script)
        (root / ".venv" / "bin").mkdir(parents=True)
        for name in ("speechstream", "python"):
            (root / ".venv" / "bin" / name).write_text(EDITING_STAND_IN)
            (root / ".venv" / "bin" / name).chmod(0o755)
        env = os.environ | {"PATH": "/usr/bin:/bin"} | ({"EDIT_SCRIPT": str(script)} if edit else {})
        result = subprocess.run(["bash", str(script), *stages], cwd="/", capture_output=True, text=True, timeout=60,
                                env=env)
        assert result.returncode == 0, result.stderr
        calls[edit] = (root / "calls.log").read_text()
        assert script.read_text().startswith("# edited") == edit
    assert calls[True] == calls[False] and len(calls[False].splitlines()) > 3
