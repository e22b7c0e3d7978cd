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


@pytest.mark.parametrize("gpu", [True, False])
def test_st_run_sh_trains_stage_2c_from_2b_then_2d_on_a_gpu_and_ships_a_mean(tmp_path: Path, gpu: bool):
    """Stages 1-3 of the translation recipe with stand-ins for speechstream and python: the new pairs of data/st-c
    and data/st-gpu are built after data/st-main, stage 2c trains after 2b (its recipe starts from 2b's run), the
    mean of 2b and 2c is exported and kept as stage 2d's start, and 2d trains in bfloat16 only where torch sees a
    CUDA device. Stage 3 then ships 0.9 of 2d's run and 0.1 of its start; without a GPU, the mean of 2c and 2b."""
    (tmp_path / "recipes" / "st").mkdir(parents=True)
    shutil.copy(ROOT / "recipes" / "st" / "run.sh", tmp_path / "recipes" / "st" / "run.sh")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "speechstream").write_text(
        '#!/usr/bin/env bash\necho "speechstream $* (${ACCELERATE_MIXED_PRECISION:-no})" >> calls.log\n'
        'if [ "$1" = train ]; then mkdir -p "runs/$(basename "$2" .yaml)"; '
        'touch "runs/$(basename "$2" .yaml)/trainable.safetensors"; fi\n')
    # the CUDA probe is the one `python -c`: it answers as the machine would
    (bin_dir / "python").write_text('#!/usr/bin/env bash\necho "python $*" >> calls.log\n'
                                    f'if [ "$1" = -c ]; then exit {0 if gpu else 1}; fi\n')
    for name in ("speechstream", "python"):
        (bin_dir / name).chmod(0o755)
    model = "smollm2-whisper-base-es-en"
    (tmp_path / "models" / model).mkdir(parents=True)  # what the stand-in's export of 2b and 2c would have written
    (tmp_path / "models" / model / "trainable.safetensors").write_text("mean of 2b and 2c")
    result = subprocess.run(["bash", str(tmp_path / "recipes" / "st" / "run.sh"), "1", "3"], cwd="/",
                            capture_output=True, text=True, timeout=60, env=os.environ | {"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert ("stage 2d needs a CUDA GPU" in result.stderr) is not gpu
    calls = (tmp_path / "calls.log").read_text().splitlines()
    outs = [call.split("--out ")[1].split()[0] for call in calls if "prepare_st.py" in call]
    assert outs == ["data/st-main", "data/st-c", "data/st-gpu", "data/st-dev", "data/st-wide"]
    trained = [call.split(" train ")[1] for call in calls if call.startswith("speechstream train")]
    assert trained == [f"recipes/st/{model}.yaml (no)", f"recipes/st/{model}-b.yaml (no)",
                       f"recipes/st/{model}-c.yaml (no)"] + ([f"recipes/st/{model}-gpu.yaml (bf16)"] if gpu else [])
    exports = [call for call in calls if "export.py" in call]
    mean_bc = (f"python recipes/asr/export.py runs/{model}-c models/{model} "
               f"--average-with runs/{model}-b/trainable.safetensors")
    mean_d = (f"python recipes/asr/export.py runs/{model}-gpu models/{model} "
              f"--average-with runs/{model}-bc/trainable.safetensors --run-weight 0.9")
    assert exports == [mean_bc, mean_d if gpu else mean_bc]
    assert (tmp_path / "runs" / f"{model}-bc" / "trainable.safetensors").read_text() == "mean of 2b and 2c"
    recipe_c = (ROOT / "recipes" / "st" / f"{model}-c.yaml").read_text()
    assert f"init_checkpoint: runs/{model}-b/trainable.safetensors" in recipe_c.splitlines()
    recipe_d = (ROOT / "recipes" / "st" / f"{model}-gpu.yaml").read_text()
    assert f"init_checkpoint: runs/{model}-bc/trainable.safetensors" in recipe_d.splitlines()


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
        if recipe == "st":  # what the stand-in's export of stages 2b and 2c would have written (stage 2d's start)
            (root / "models" / "smollm2-whisper-base-es-en").mkdir(parents=True)
            (root / "models" / "smollm2-whisper-base-es-en" / "trainable.safetensors").write_text("mean")
        env = os.environ | {"PATH": "/usr/bin:/bin"} | ({"EDIT_SCRIPT": str(script)} if edit else {})
        result = subprocess.run(["bash", str(script), *stages], cwd="/", capture_output=True, text=True, timeout=60,
                                env=env)
        assert result.returncode == 0, result.stderr
        calls[edit] = (root / "calls.log").read_text()
        assert script.read_text().startswith("# edited") == edit
    assert calls[True] == calls[False] and len(calls[False].splitlines()) > 3
