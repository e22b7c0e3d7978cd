"""Training: deterministic batches, resumable runs, the loss falls, two-process DDP."""

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from speechstream.train import load_train_config, train
from speechstream.train.examples import batch_indices
from speechstream.train.loop import learning_rate_factor

ROOT = Path(__file__).resolve().parents[2]

TINY_LORA = {
    "name": "tiny-lora",
    "tokenizer": "bytes",
    "encoder": {"d_model": 64, "layers": 2, "heads": 4, "ffn_dim": 128, "left_frames": 100},
    "projector": {"stack": 4},
    "llm": {"architecture": "llama", "hidden_size": 64, "layers": 2, "heads": 4, "kv_heads": 2,
            "intermediate_size": 128, "lora_rank": 4},
}


def write_recipe(folder: Path, **overrides) -> Path:
    (folder / "model.yaml").write_text(yaml.safe_dump(TINY_LORA))
    recipe = {
        "model": str(folder / "model.yaml"),
        "train_manifest": str(ROOT / "samples" / "manifest.jsonl"),
        "out_dir": str(folder / "run"),
        "steps": 6,
        "batch_size": 2,
        "log_every": 1,
        "save_every": 3,
        "lr_projector": 3e-3,
        "lr_lora": 3e-3,
        "warmup_steps": 1,
    }
    recipe.update(overrides)
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def speechstream_lines(err: str) -> list[str]:
    """The lines of a command's stderr that speechstream wrote (not the progress bars)."""
    return [line for line in err.replace("\r", "\n").splitlines() if line.startswith("speechstream:")]


def test_batches_are_a_pure_function_of_seed_and_step():
    assert batch_indices(10, 3, 5, seed=1) == batch_indices(10, 3, 5, seed=1)
    epoch = [i for step in range(3) for i in batch_indices(10, 3, step, seed=1)]
    assert len(set(epoch)) == 9  # no repeats inside an epoch
    assert batch_indices(10, 3, 3, seed=1) != batch_indices(10, 3, 0, seed=1)


def test_learning_rate_schedule():
    assert learning_rate_factor(0, 10, 100) == pytest.approx(0.1)
    assert learning_rate_factor(9, 10, 100) == pytest.approx(1.0)
    assert learning_rate_factor(100, 10, 100) == pytest.approx(0.1)


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    """Weights and log rows: a run stopped at step 3 (between two log rows of log_every=4) and resumed logs what
    an uninterrupted run does (the stopped run's window of steps travels in its checkpoint)."""
    (tmp_path / "a").mkdir()
    straight = write_recipe(tmp_path / "a", log_every=4)
    train(load_train_config(str(straight), []), progress=False)
    resumed_dir = tmp_path / "b"
    resumed_dir.mkdir()
    resumed = write_recipe(resumed_dir, log_every=4)
    train(load_train_config(str(resumed), []), progress=False, stop_after=3)
    assert json.loads((resumed_dir / "run" / "progress.json").read_text())["step"] == 3
    with (resumed_dir / "run" / "log.jsonl").open("a") as log:  # a row logged after the checkpoint, then a crash
        log.write(json.dumps({"step": 4, "loss": 1.0}) + "\n")
    train(load_train_config(str(resumed), []), progress=False)
    steps = [[json.loads(line)["step"] for line in (folder / "run" / "log.jsonl").read_text().splitlines()]
             for folder in (tmp_path / "a", resumed_dir)]
    assert steps[0] == steps[1] == [4, 6]
    rows = [[json.loads(line) for line in (folder / "run" / "log.jsonl").read_text().splitlines()]
            for folder in (tmp_path / "a", resumed_dir)]
    for row_a, row_b in zip(*rows):
        assert row_a.keys() == row_b.keys()
        assert all(row_a[key] == pytest.approx(row_b[key], abs=1e-5) for key in row_a if key != "elapsed_s")
    a = load_file(str(tmp_path / "a" / "run" / "trainable.safetensors"))
    b = load_file(str(resumed_dir / "run" / "trainable.safetensors"))
    assert a.keys() == b.keys() and any("lora_" in key for key in a)
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-6), key
    assert (tmp_path / "a" / "run" / "loss.png").stat().st_size > 1000


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_signal_mid_step_saves_that_step_and_the_rerun_ends_as_an_uninterrupted_run(tmp_path, monkeypatch, capsys,
                                                                                      signal_name):
    """Ctrl-C or SIGTERM between two checkpoints (save_every=100): the step in progress finishes and is saved (it
    was lost with every step since the last checkpoint), the command exits 130, and rerunning it resumes from there
    to the weights of a run never interrupted. The command says so in one line."""
    import signal

    import speechstream.train.loop as train_loop
    from speechstream.cli import main

    (tmp_path / "a").mkdir()
    train(load_train_config(str(write_recipe(tmp_path / "a", save_every=100)), []), progress=False)
    (tmp_path / "b").mkdir()
    recipe = write_recipe(tmp_path / "b", save_every=100)
    factor = train_loop.phase_learning_rate_factor

    def signalled(step, config):  # the signal arrives during step 3 (0-based 2), before its forward
        if step == 2:
            os.kill(os.getpid(), getattr(signal, signal_name))
        return factor(step, config)

    def unhandled(signum, frame):  # (what the signal did before: the run ended, losing the steps since a save)
        raise SystemExit(f"{signal_name} ended the run")

    monkeypatch.setattr(train_loop, "phase_learning_rate_factor", signalled)
    previous = signal.signal(signal.SIGTERM, unhandled)  # (SIGTERM's default would end pytest itself)
    try:
        assert main(["train", str(recipe)]) == 130
        assert signal.getsignal(signal.SIGTERM) is unhandled  # (put back)
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = speechstream_lines(capsys.readouterr().err)  # one line (it was a note, then "error: interrupted")
    assert len(err) == 1 and err[0].startswith(f"speechstream: error: {signal_name} after step 3 of 6: "), err
    assert err[0].endswith("the same command resumes")
    assert json.loads((tmp_path / "b" / "run" / "progress.json").read_text())["step"] == 3
    monkeypatch.setattr(train_loop, "phase_learning_rate_factor", factor)
    assert main(["train", str(recipe)]) == 0
    a = load_file(str(tmp_path / "a" / "run" / "trainable.safetensors"))
    b = load_file(str(tmp_path / "b" / "run" / "trainable.safetensors"))
    assert a.keys() == b.keys()
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-6), key
    logs = [(folder / "run" / "log.jsonl").read_text().splitlines() for folder in (tmp_path / "a", tmp_path / "b")]
    assert [json.loads(line)["step"] for line in logs[1]] == [json.loads(line)["step"] for line in logs[0]]


@pytest.mark.parametrize("steps, eval_every", [(3, 0), (4, 2)])
def test_ctrl_c_during_a_dev_evaluation_stops_it_at_once_and_keeps_the_step(tmp_path, monkeypatch, capsys, steps,
                                                                           eval_every):
    """The first Ctrl-C during a dev evaluation (the final one, or one between checkpoints) waited for all of it
    (and for one more step after one between checkpoints; after the final one the run then ended as if never
    interrupted). Now the evaluation stops at the next utterance, its row is left out of the log, the step is saved
    and the command exits 130."""
    import signal

    import speechstream.train.dev as train_dev
    from speechstream.cli import main

    recipe = write_recipe(tmp_path, steps=steps, save_every=100, eval_every=eval_every,
                          dev_manifest=str(ROOT / "samples" / "manifest.jsonl"))
    scored, greedy = [], train_dev.greedy_ctc_text

    def signalled(*args, **kwargs):  # Ctrl-C while the first dev utterance is scored
        scored.append(1)
        if len(scored) == 1:
            os.kill(os.getpid(), signal.SIGINT)
        return greedy(*args, **kwargs)

    monkeypatch.setattr(train_dev, "greedy_ctc_text", signalled)
    assert main(["train", str(recipe)]) == 130
    done = eval_every or steps
    err = speechstream_lines(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith(f"speechstream: error: SIGINT during the dev evaluation after step "
                                               f"{done} of {steps}: its dev evaluation is left out"), err
    assert "the same command resumes" in err[0] and len(scored) == 1  # (all 6 dev utterances were scored)
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["step"] == done
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == list(range(1, done + 1)) and "dev_ctc_wer" not in rows[-1]
    monkeypatch.undo()
    assert main(["train", str(recipe)]) == 0  # scores the step's dev set first, then trains on
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows if "dev_ctc_wer" in row] == sorted({done, steps})


def test_a_second_run_into_the_same_out_dir_stops_at_once(tmp_path, capsys):
    """While a run writes its out_dir (its main process holds out_dir/.lock; here the test does), the same command
    stops at once with one line, exit 2, and writes nothing (a second run resumed from the same checkpoint and both
    wrote it; a launcher killed with -9 leaves its processes training on, unseen)."""
    from speechstream.cli import main
    from speechstream.locks import hold_folder

    recipe = write_recipe(tmp_path, steps=2)
    (tmp_path / "run").mkdir()
    with hold_folder(tmp_path / "run"):
        assert main(["train", str(recipe)]) == 2
    assert speechstream_lines(capsys.readouterr().err) == [
        f"speechstream: error: {tmp_path / 'run'} is being written by another run (pid {os.getpid()}): wait for it to "
        "finish, or use another out_dir"]
    assert [path.name for path in (tmp_path / "run").iterdir()] == [".lock"]
    assert main(["train", str(recipe)]) == 0  # (free again)
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["step"] == 2


def test_a_run_on_a_file_system_without_locks_goes_on_with_a_note(tmp_path, capsys, monkeypatch):
    """flock on a file system that takes no locks (Lustre mounted without flock: ENOSYS) made every training run
    end at once ("error: OSError: [Errno 38] Function not implemented", exit 1): it trains, unlocked, with a note."""
    import errno

    from speechstream import locks
    from speechstream.cli import main

    def no_locks(handle, operation):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(locks.fcntl, "flock", no_locks)
    assert main(["train", str(write_recipe(tmp_path, steps=2))]) == 0
    assert speechstream_lines(capsys.readouterr().err) == [
        f"speechstream: note: {tmp_path / 'run'} is on a file system without locks (Function not implemented): "
        "nothing stops a second run writing it at the same time"]
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["step"] == 2


def test_recipe_paths_beside_the_recipe_are_found_from_any_folder(tmp_path, monkeypatch):
    """A recipe naming its model config, manifest and init_checkpoint by paths relative to its own folder loads
    from another current folder (the model was 'unknown model', while the manifests were found)."""
    write_recipe(tmp_path)
    (tmp_path / "m.jsonl").write_text((ROOT / "samples" / "manifest.jsonl").read_text())
    (tmp_path / "init.safetensors").write_bytes(b"")
    recipe = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    recipe.update(model="model.yaml", train_manifest="m.jsonl", init_checkpoint="init.safetensors")
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_train_config(str(tmp_path / "recipe.yaml"), [])
    assert (config.model, config.train_manifest, config.init_checkpoint) == (
        str(tmp_path / "model.yaml"), str(tmp_path / "m.jsonl"), str(tmp_path / "init.safetensors"))
    assert load_train_config(str(tmp_path / "recipe.yaml"), ["model=tiny-random"]).model == "tiny-random"


def test_recipe_paths_under_the_home_folder_are_read_there(tmp_path, monkeypatch):
    """A recipe file is not read by a shell: its "~/..." paths are the home folder's, as a manifest's audio is (the
    model and manifest were not found, and out_dir "~/runs/asr" trained into a folder named "~" in the current one);
    an override ``out_dir=~/...`` from a shell that leaves it as written (sh) is the same."""
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    (home / "data").mkdir(parents=True)
    elsewhere.mkdir()
    write_recipe(home)
    (home / "data" / "m.jsonl").write_text((ROOT / "samples" / "manifest.jsonl").read_text())
    recipe = yaml.safe_load((home / "recipe.yaml").read_text())
    recipe.update(model="~/model.yaml", train_manifest="~/data/m.jsonl", out_dir="~/runs/asr")
    (elsewhere / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(elsewhere)
    config = load_train_config("recipe.yaml", [])
    assert (config.model, config.train_manifest, config.out_dir) == (
        str(home / "model.yaml"), str(home / "data" / "m.jsonl"), str(home / "runs" / "asr"))
    assert load_train_config("recipe.yaml", ["out_dir=~/runs/other"]).out_dir == str(home / "runs" / "other")
    assert load_train_config("recipe.yaml", ["out_dir=~nosuchuser/run"]).out_dir == "~nosuchuser/run"


def test_loss_falls_when_overfitting_one_batch(tmp_path):
    recipe = write_recipe(tmp_path, steps=30, batch_size=2, k_choices="2", lr_projector=1e-2, lr_lora=1e-2)
    manifest = tmp_path / "two.jsonl"
    lines = (ROOT / "samples" / "manifest.jsonl").read_text().splitlines()[:2]
    rows = [json.loads(line) for line in lines]
    for row in rows:
        row["audio"] = str(ROOT / "samples" / row["audio"])
    manifest.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    train(load_train_config(str(recipe), [f"train_manifest={manifest}"]), progress=False)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    # a random tiny LLM moves slowly through rank-4 adapters; the CTC path learns fast
    assert log[-1]["ctc"] < 0.7 * log[0]["ctc"]
    assert log[-1]["lm"] < log[0]["lm"] - 0.2 and log[-1]["accuracy"] > log[0]["accuracy"]


def run_two_processes(recipe: Path, port: int, program: list[str] | None = None,
                      check: bool = True) -> subprocess.CompletedProcess:
    """``speechstream train RECIPE`` as two processes under torchrun (``program``: a script in its place)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port),
               *(program or ["-m", "speechstream"]), "train", str(recipe)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 or not check, done.stderr[-2000:]
    return done


# speechstream's command line with a SIGTERM sent to rank 1 alone while its step 3 runs (as a cluster's scheduler or
# an out-of-memory killer may signal one process)
SIGTERM_TO_RANK_1 = """
import os, signal, sys
import speechstream.train.loop as train_loop
from speechstream.cli import main
factor = train_loop.phase_learning_rate_factor
def signalled(step, config):
    if step == 2 and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGTERM)
    return factor(step, config)
train_loop.phase_learning_rate_factor = signalled
sys.exit(main(sys.argv[1:]))
"""


# speechstream's command line, rank 1 killed (SIGKILL: no handler runs) once it has written its part of the second
# checkpoint (step 4 with save_every=2), before rank 0 completes it
KILL_RANK_1_WHILE_SAVING = """
import os, signal, sys
from accelerate import Accelerator
from speechstream.cli import main
save_state, saves = Accelerator.save_state, []
def killed(self, *args, **kwargs):
    out = save_state(self, *args, **kwargs)
    saves.append(1)
    if len(saves) == 2 and os.environ["RANK"] == "1":
        os.kill(os.getpid(), signal.SIGKILL)
    return out
Accelerator.save_state = killed
sys.exit(main(sys.argv[1:]))
"""


def assert_ends_as_one_process(tmp_path, overrides):
    """The run in tmp_path/ddp has the weights (to 1e-4, as test_two_process_ddp_on_cpu_equals_one_process) and
    the logged steps of the same recipe trained uninterrupted as one process in tmp_path/one."""
    (tmp_path / "one").mkdir()
    train(load_train_config(str(write_recipe(tmp_path / "one", **overrides)), []), progress=False)
    ddp, one = (load_file(str(tmp_path / name / "run" / "trainable.safetensors")) for name in ("ddp", "one"))
    for key in one:
        assert torch.allclose(ddp[key], one[key], atol=1e-4), (key, float((ddp[key] - one[key]).abs().max()))
    steps = [[json.loads(line)["step"] for line in (tmp_path / name / "run" / "log.jsonl").read_text().splitlines()]
             for name in ("ddp", "one")]
    assert steps[0] == steps[1] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_a_process_killed_while_saving_ends_the_run_and_the_rerun_resumes_from_the_last_whole_checkpoint(tmp_path):
    """kill -9 of one of two processes while a checkpoint is written: the other does not wait for it forever (its
    collective fails and the launcher ends the run), the torn checkpoint is never loaded, and the same command
    resumes from the one before to the weights of an uninterrupted run."""
    overrides = dict(steps=6, batch_size=2, save_every=2, k_choices="2")
    (tmp_path / "ddp").mkdir()
    recipe = write_recipe(tmp_path / "ddp", **overrides)
    script = tmp_path / "killed.py"
    script.write_text(KILL_RANK_1_WHILE_SAVING)
    started = time.monotonic()
    done = run_two_processes(recipe, 29536, [str(script)], check=False)
    assert done.returncode != 0 and time.monotonic() - started < 120, done.stderr[-3000:]
    run = tmp_path / "ddp" / "run"
    assert json.loads((run / "state" / "step.json").read_text())["step"] == 2 and (run / "state.tmp").is_dir()
    done = run_two_processes(recipe, 29537)
    assert not (run / "state.tmp").exists()
    assert_ends_as_one_process(tmp_path, overrides)


# speechstream's command line, each process noting the ids it encodes in encoded-<rank>.txt beside this script
NOTING_ENCODER = """
import os, sys
from pathlib import Path
import speechstream.train.feature_cache as feature_cache
from speechstream.cli import main
store = feature_cache.FeatureCache._encode_and_store
def noted(self, examples, audios):
    with open(Path(__file__).with_name(f"encoded-{os.environ['RANK']}.txt"), "a") as out:
        out.writelines(example.id + "\\n" for example in examples)
    return store(self, examples, audios)
feature_cache.FeatureCache._encode_and_store = noted
sys.exit(main(sys.argv[1:]))
"""


def test_two_processes_share_the_feature_cache_filling(tmp_path):
    """Each process encodes its share of the encoder passes over the utterances not cached yet (2 utterances a pass:
    the main process takes the first and third, the other the second), each utterance once (the main process
    encoded them all while the others waited at a barrier, which gives up after the process group's timeout, 30
    minutes: a corpus that took longer to encode ended the run there). A pass holds what it holds in one process,
    so the frames do not depend on how many processes run."""
    from speechstream.train import FeatureCache, read_examples, training_model

    script = tmp_path / "noting.py"
    script.write_text(NOTING_ENCODER)
    recipe = write_recipe(tmp_path, steps=1, batch_size=2, save_every=1, cache_batch_size=2)
    run_two_processes(recipe, 29535, [str(script)])
    encoded = [(tmp_path / f"encoded-{rank}.txt").read_text().split() if (tmp_path / f"encoded-{rank}.txt").exists()
               else [] for rank in (0, 1)]
    config = load_train_config(str(recipe), [])
    torch.manual_seed(config.seed)  # (the run's model: its encoder names the cache's folder)
    model = training_model(config, "cpu")
    examples = read_examples(config.train_manifest)
    single = FeatureCache(tmp_path / "single", model, config.chunk_ms)
    passes = [[example.id for example in single.missing(examples)][i : i + 2] for i in (0, 2, 4)]
    assert encoded == [passes[0] + passes[2], passes[1]]
    shared = FeatureCache(tmp_path / "run" / "features", model, config.chunk_ms)
    assert not shared.missing(examples) and single.fill(examples, 2) == 6
    for example in examples:  # (the same passes as one process's)
        assert torch.equal(shared.frames(example)[0], single.frames(example)[0]), example.id


# speechstream's command line, rank 0 sending SIGTERM to rank 1 (its sibling under the launcher) while it scores its
# first dev utterance; it notes each utterance it scores in scored.txt beside this script
SIGTERM_TO_RANK_1_DURING_THE_EVALUATION = """
import os, signal, sys, time
from pathlib import Path
import speechstream.train.dev as train_dev
from speechstream.cli import main
greedy, scored = train_dev.greedy_ctc_text, Path(__file__).with_name("scored.txt")
def signalled(*args, **kwargs):
    if not scored.exists():
        for stat in Path("/proc").glob("[0-9]*/stat"):
            fields = stat.read_text().rsplit(")", 1)[-1].split()
            if int(fields[1]) == os.getppid() and int(stat.parent.name) != os.getpid():
                os.kill(int(stat.parent.name), signal.SIGTERM)
        time.sleep(1)
    with scored.open("a") as out:
        out.write("1\\n")
    return greedy(*args, **kwargs)
if os.environ["RANK"] == "0":
    train_dev.greedy_ctc_text = signalled
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_signal_to_another_process_during_the_dev_evaluation_stops_it_at_the_next_utterance(tmp_path):
    """SIGTERM to rank 1 while rank 0 scores the dev set: the evaluation stops within an utterance or two and the
    step is saved, as after a signal to rank 0 (rank 1 sat in a collective until the evaluation's end: all 6
    utterances were scored, one more step ran, and the run stopped after step 3)."""
    recipe = write_recipe(tmp_path, steps=6, batch_size=2, save_every=100, eval_every=2, k_choices="2",
                          dev_manifest=str(ROOT / "samples" / "manifest.jsonl"))
    script = tmp_path / "signalled.py"
    script.write_text(SIGTERM_TO_RANK_1_DURING_THE_EVALUATION)
    done = run_two_processes(recipe, 29538, [str(script)], check=False)
    assert speechstream_lines(done.stderr) == [
        "speechstream: error: SIGTERM during the dev evaluation after step 2 of 6: its dev evaluation is left out; "
        f"its checkpoint is saved in {tmp_path / 'run'}; the same command resumes"], done.stderr[-3000:]
    assert len((tmp_path / "scored.txt").read_text().split()) <= 2
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["step"] == 2


def test_agreed_signal_names_the_signal_any_rank_got():
    from speechstream.train.processes import agreed_signal

    def over_ranks(*codes):  # the largest of a value over ranks whose other values are codes
        return lambda tensor: torch.tensor([max(int(tensor), *codes)])

    assert agreed_signal(None, over_ranks(0)) is None
    assert agreed_signal(None, over_ranks(2)) == "SIGTERM"  # (the rank that got none said "None after step 3")
    assert agreed_signal(None, over_ranks(1, 0)) == "SIGINT"
    assert agreed_signal("SIGINT", over_ranks(2)) == "SIGINT"  # a rank's own signal is its own


@pytest.mark.slow
def test_a_signal_to_one_of_two_processes_stops_both_in_one_line_and_the_rerun_ends_as_one_process(tmp_path):
    """SIGTERM to rank 1 alone during step 3: both processes stop after it, saved; the command's own output is one
    line, from rank 0, naming the signal (rank 0 said "None after step 3", and every rank added "error:
    interrupted"); the same command resumes to the weights of an uninterrupted run, and says where they are once."""
    overrides = dict(steps=6, batch_size=2, save_every=100, k_choices="2")
    (tmp_path / "ddp").mkdir()
    recipe = write_recipe(tmp_path / "ddp", **overrides)
    script = tmp_path / "signalled.py"
    script.write_text(SIGTERM_TO_RANK_1)
    done = run_two_processes(recipe, 29533, [str(script)], check=False)
    assert done.returncode != 0  # (torchrun reports the processes' exit 130 as a failure, exit 1)
    assert speechstream_lines(done.stderr) == [
        f"speechstream: error: SIGTERM after step 3 of 6: its checkpoint is saved in {tmp_path / 'ddp' / 'run'}; "
        "the same command resumes"], done.stderr[-3000:]
    assert json.loads((tmp_path / "ddp" / "run" / "progress.json").read_text())["step"] == 3
    done = run_two_processes(recipe, 29534)
    assert done.stdout == f"trainable weights: {tmp_path / 'ddp' / 'run' / 'trainable.safetensors'}\n"
    assert not speechstream_lines(done.stderr), done.stderr[-3000:]
    assert_ends_as_one_process(tmp_path, overrides)


def test_two_process_ddp_on_cpu_equals_one_process(tmp_path):
    """The same recipe runs as two gloo processes through accelerate; both ranks finish, one checkpoint lands, and
    the weights and logged figures are those of one process taking the whole global batch (a batch of 3 split 2 + 1:
    the LM loss is a mean over the global batch's tokens, the CTC loss over its utterances, on either phase)."""
    overrides = dict(steps=3, batch_size=3, save_every=3, ctc_only_steps=1, k_choices="2")
    (tmp_path / "ddp").mkdir()
    run_two_processes(write_recipe(tmp_path / "ddp", **overrides), 29531)
    assert json.loads((tmp_path / "ddp" / "run" / "progress.json").read_text())["step"] == 3
    (tmp_path / "one").mkdir()
    train(load_train_config(str(write_recipe(tmp_path / "one", **overrides)), []), progress=False)
    ddp, one = (load_file(str(tmp_path / name / "run" / "trainable.safetensors")) for name in ("ddp", "one"))
    assert "lora_" in " ".join(ddp) and ddp.keys() == one.keys()
    for key in one:  # (Adam turns float noise in a near-zero gradient of a zero-started adapter into ~4e-5)
        assert torch.allclose(ddp[key], one[key], atol=1e-4), (key, float((ddp[key] - one[key]).abs().max()))
    logs = [[json.loads(line) for line in (tmp_path / name / "run" / "log.jsonl").read_text().splitlines()]
            for name in ("ddp", "one")]
    for row_ddp, row_one in zip(*logs, strict=True):
        assert all(row_ddp[key] == pytest.approx(row_one[key], rel=1e-4) for key in row_one if key != "elapsed_s")


def test_two_process_ddp_without_ctc_loss(tmp_path):
    """ctc_weight 0 leaves the CTC blank without a gradient: DDP is told so (it failed at the second step)."""
    run_two_processes(write_recipe(tmp_path, steps=2, batch_size=2, save_every=2, ctc_weight=0.0), 29532)
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["step"] == 2


@pytest.mark.parametrize("case", ["manifest", "checkpoint"])
def test_an_input_error_every_process_raises_is_said_once(tmp_path, case):
    """A bad input every process finds (a manifest line naming a missing clip, read before the processes connect; a
    checkpoint without a step, read after) is one line from the main process, not one from each; no process waits
    for the other, and the main one exits 2 (the launcher then ends the other and exits 1)."""
    recipe = write_recipe(tmp_path, steps=2, batch_size=2)
    if case == "manifest":
        manifest = tmp_path / "missing.jsonl"
        manifest.write_text(json.dumps({"id": "gone", "audio": "gone.wav", "text": "a"}) + "\n")
        recipe.write_text(yaml.safe_dump(yaml.safe_load(recipe.read_text()) | {"train_manifest": str(manifest)}))
        said = f"speechstream: error: {manifest}:1: gone.wav: no such audio file"
    else:
        (tmp_path / "run" / "state").mkdir(parents=True)
        (tmp_path / "run" / "state" / "step.json").write_text("{}")
        said = (f"speechstream: error: {tmp_path / 'run' / 'state'}: cannot resume from this checkpoint (ValueError: "
                f"no step number in {tmp_path / 'run' / 'state' / 'step.json'}); give another out_dir or delete this "
                "one to start over")
    done = run_two_processes(recipe, 29539 if case == "manifest" else 29540, check=False)
    assert speechstream_lines(done.stderr) == [said], done.stderr[-3000:]
    assert done.returncode == 1 and done.stderr.count("Traceback") == 1  # (the launcher's own, of ChildFailedError)
    assert "exitcode  : 2 (pid" in done.stderr, done.stderr[-3000:]  # (the launcher's report of the main process)


def test_a_log_row_ends_the_ctc_only_phase(tmp_path):
    train(load_train_config(str(write_recipe(tmp_path, steps=3, ctc_only_steps=1, log_every=3)), []), progress=False)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [(row["step"], "lm" in row) for row in log] == [(1, False), (3, True)]


def test_init_checkpoint_starts_from_given_weights(tmp_path):
    (tmp_path / "a").mkdir()
    first = write_recipe(tmp_path / "a", steps=2)
    train(load_train_config(str(first), []), progress=False)
    trained = tmp_path / "a" / "run" / "trainable.safetensors"
    (tmp_path / "b").mkdir()
    second = write_recipe(tmp_path / "b", steps=1, lr_projector=0.0, lr_lora=0.0, ctc_only_steps=0)
    train(load_train_config(str(second), [f"init_checkpoint={trained}"]), progress=False)
    start, after = load_file(str(trained)), load_file(str(tmp_path / "b" / "run" / "trainable.safetensors"))
    for key in start:
        assert torch.equal(start[key], after[key]), key


def test_init_checkpoint_with_a_fine_ctc_head_starts_a_model_without_one(tmp_path, capsys):
    """recipes/st stage 2 starts the translation model (no ctc_hop) from the English model's weights, which carry a
    fine CTC head since it got one: the run stopped at once, 'checkpoint does not fit the model (unknown
    ['ctc_head.blank', ...])'. The head is left out (a note says so); everything else is loaded."""
    from speechstream.train.model_setup import starting_model

    (tmp_path / "a").mkdir()
    train(load_train_config(str(write_recipe(tmp_path / "a", steps=1, warmup_steps=0, ctc_head_only=True,
                                             ctc_hop=2)), []), progress=False)
    english = tmp_path / "a" / "run" / "trainable.safetensors"
    assert any(name.startswith("ctc_head.") for name in load_file(str(english)))
    (tmp_path / "b").mkdir()
    config = load_train_config(str(write_recipe(tmp_path / "b", init_checkpoint=str(english))), [])
    capsys.readouterr()
    model = starting_model(config, "cpu")
    assert model.ctc_head is None
    own = model.state_dict()
    for name, tensor in load_file(str(english)).items():
        if not name.startswith("ctc_head.") and name in own:
            assert torch.equal(own[name], tensor.to(own[name].dtype)), name
    assert "its fine CTC head (ctc_head.*) is left out" in capsys.readouterr().err


def test_ctc_over_the_training_vocabulary(tmp_path):
    """ctc_vocab=train scores only the training texts' token ids: with every id in the subset the loss is the
    full-vocabulary loss; ids are mapped to class positions; the CTC-only phase takes its own batch size."""
    from speechstream.model import load_model
    from speechstream.train import StreamingLoss, ctc_class_ids, read_examples

    recipe = write_recipe(tmp_path, ctc_vocab="train", ctc_only_steps=2, ctc_only_batch_size=3, steps=3)
    config = load_train_config(str(recipe), [])
    torch.manual_seed(0)
    model = load_model(config.model)
    examples = read_examples(config.train_manifest)
    classes = ctc_class_ids(model, examples, config)
    expected = sorted({t for e in examples for t in model._ids("".join(" " + w for w in e.text.split()))})
    assert classes.tolist() == expected and len(expected) < model.decoder.llm.get_input_embeddings().weight.shape[0]
    assert ctc_class_ids(model, examples, load_train_config(str(recipe), ["ctc_vocab=full"])) is None
    model.ctc_classes = torch.tensor([1, 2, 3])  # as loaded from an init_checkpoint
    assert ctc_class_ids(model, examples, config).tolist() == expected  # "train": the training texts' alone
    continued = ctc_class_ids(model, examples, load_train_config(str(recipe), ["ctc_vocab=train+init"]))
    assert continued.tolist() == sorted(set(expected) | {1, 2, 3})  # a continuation keeps what it scored
    model.ctc_classes = None
    speech = torch.randn(2, 7, 64)
    full = model.ctc_logits(speech)
    every = torch.arange(full.shape[-1] - 1)
    assert torch.equal(model.ctc_logits(speech, every), full)
    assert torch.equal(model.ctc_logits(speech, classes)[..., :-1], full[..., classes])
    source = type("Source", (), {"speech": speech, "speech_lengths": torch.tensor([7, 5])})()
    texts = [expected[:3], expected[2:4]]
    assert torch.allclose(StreamingLoss(model, 1.0, every).ctc_loss(source, texts),
                          StreamingLoss(model, 1.0).ctc_loss(source, texts))
    from speechstream.train import greedy_ctc_text

    best = model.ctc_logits(speech[0], classes).argmax(-1).tolist()
    path = [t for i, t in enumerate(best) if t != len(classes) and (i == 0 or t != best[i - 1])]
    assert greedy_ctc_text(model, speech[0], classes) == model.tokenizer.decode(classes[path].tolist(),
                                                                               skip_special_tokens=True)
    with pytest.raises(ValueError, match="outside ctc_classes"):
        StreamingLoss(model, 1.0, classes[1:]).ctc_loss(source, [[expected[0]]])
    train(config, progress=False)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [("lm" in row) for row in log if "loss" in row] == [False, False, True]


def test_fresh_ignores_the_model_configs_checkpoint(tmp_path):
    (tmp_path / "a").mkdir()
    train(load_train_config(str(write_recipe(tmp_path / "a", steps=2)), []), progress=False)
    trained = tmp_path / "a" / "run" / "trainable.safetensors"
    outputs = {}
    for name, fresh in (("with", False), ("fresh", True), ("plain", False)):
        folder = tmp_path / name
        folder.mkdir()
        recipe = write_recipe(folder, steps=1, lr_projector=0.0, lr_lora=0.0, fresh=fresh)
        if name != "plain":  # the model config names the trained checkpoint
            model = yaml.safe_load((folder / "model.yaml").read_text()) | {"checkpoint": str(trained)}
            (folder / "model.yaml").write_text(yaml.safe_dump(model))
        train(load_train_config(str(recipe), []), progress=False)
        outputs[name] = load_file(str(folder / "run" / "trainable.safetensors"))
    start = load_file(str(trained))
    assert all(torch.equal(start[key], outputs["with"][key]) for key in start)
    assert all(torch.equal(outputs["plain"][key], outputs["fresh"][key]) for key in start)
    assert not torch.equal(start["ctc_blank"], outputs["fresh"]["ctc_blank"])


def test_spec_augment_masks_spans_and_channels_reproducibly():
    import numpy as np

    from speechstream.train.objective import spec_augment_mask

    def spec_augment(frames, *args):
        return frames * spec_augment_mask(frames.shape, *args)

    frames = torch.ones(2, 100, 20)
    out = spec_augment(frames, [100, 40], np.random.default_rng(3), 0.2, 5, 0.1)
    again = spec_augment(frames, [100, 40], np.random.default_rng(3), 0.2, 5, 0.1)
    assert torch.equal(out, again) and torch.equal(frames, torch.ones(2, 100, 20))  # seeded; input untouched
    for b, length in enumerate([100, 40]):
        zero_channels = (out[b] == 0).all(dim=0)
        assert int(zero_channels.sum()) == 2
        zero_frames = (out[b][:, ~zero_channels] == 0).all(dim=1)
        assert 0 < int(zero_frames[:length].sum()) <= 5 * round(0.2 * length / 5)
        assert not zero_frames[length:].any()  # padding frames are left alone
    assert torch.equal(spec_augment(frames, [100, 40], np.random.default_rng(3), 0.0, 5, 0.0), frames)


def test_each_phase_has_its_own_schedule():
    from speechstream.train import TrainConfig
    from speechstream.train.loop import phase_learning_rate_factor

    config = TrainConfig(model="m", train_manifest="t", steps=300, ctc_only_steps=100, warmup_steps=10)
    assert phase_learning_rate_factor(9, config) == pytest.approx(1.0)
    assert phase_learning_rate_factor(99, config) == pytest.approx(learning_rate_factor(99, 10, 100))
    assert phase_learning_rate_factor(100, config) == pytest.approx(0.1)  # the joint phase warms up again
    assert phase_learning_rate_factor(109, config) == pytest.approx(1.0)
    assert phase_learning_rate_factor(299, config) == pytest.approx(learning_rate_factor(199, 10, 200))


def test_batched_feature_fill_equals_one_utterance_at_a_time(tmp_path):
    from speechstream.config import ModelConfig, from_dict
    from speechstream.model import build_model
    from speechstream.train import FeatureCache, read_examples

    torch.manual_seed(0)
    model = build_model(from_dict(ModelConfig, TINY_LORA), for_training=True)
    examples = read_examples(str(ROOT / "samples" / "manifest.jsonl"))[:4]
    single = FeatureCache(tmp_path / "single", model, 640)
    batched = FeatureCache(tmp_path / "batched", model, 640)
    assert batched.fill(examples, batch_size=3) == len(examples)
    assert batched.fill(examples, batch_size=3) == 0  # everything cached: nothing encoded again
    for example in examples:
        frames_a, ends_a, samples_a = single.frames(example)
        frames_b, ends_b, samples_b = batched.frames(example)
        assert ends_a == ends_b and samples_a == samples_b
        assert torch.allclose(frames_a, frames_b, atol=2e-3, rtol=2e-3), example.id


def test_recipe_lora_targets_add_mlp_adapters_to_an_attention_only_checkpoint(tmp_path):
    (tmp_path / "a").mkdir()
    train(load_train_config(str(write_recipe(tmp_path / "a", steps=2)), []), progress=False)
    attention = load_file(str(tmp_path / "a" / "run" / "trainable.safetensors"))
    assert not any("gate_proj" in key for key in attention)
    (tmp_path / "b").mkdir()
    recipe = write_recipe(tmp_path / "b", steps=1, lr_projector=0.0, lr_lora=0.0, lora_targets="all",
                          init_checkpoint=str(tmp_path / "a" / "run" / "trainable.safetensors"))
    train(load_train_config(str(recipe), []), progress=False)
    grown = load_file(str(tmp_path / "b" / "run" / "trainable.safetensors"))
    assert all(torch.equal(attention[key], grown[key]) for key in attention)
    mlp = [key for key in grown if "gate_proj" in key or "up_proj" in key or "down_proj" in key]
    assert mlp and all(not grown[key].any() for key in mlp if "lora_B" in key)  # new adapters start at zero
    (tmp_path / "c").mkdir()
    model = TINY_LORA | {"llm": TINY_LORA["llm"] | {"lora_targets": "all"}}
    recipe = write_recipe(tmp_path / "c", steps=1, lora_targets="attention")
    (tmp_path / "c" / "model.yaml").write_text(yaml.safe_dump(model))
    train(load_train_config(str(recipe), []), progress=False)
    assert not any("gate_proj" in key for key in load_file(str(tmp_path / "c" / "run" / "trainable.safetensors")))


RECIPES = sorted((ROOT / "recipes").glob("*/*.yaml"))


def checkpoints_copied_by_run_scripts() -> set[str]:
    """Checkpoints a recipe folder's run.sh writes itself (``cp SRC DEST`` of a ``trainable.safetensors``, as
    stage 2 of recipes/st/run.sh keeps the mean of two runs as the next run's start), with the script's plain
    ``NAME=value`` variables expanded."""
    written = set()
    for script in (ROOT / "recipes").glob("*/run.sh"):
        variables: dict[str, str] = {}
        for line in script.read_text().splitlines():
            assigned = re.fullmatch(r"([A-Z_]+)=([^\s$]*(?:\$[A-Z_]+[^\s$]*)*)", line.strip())
            if assigned:
                value = re.sub(r"\$([A-Z_]+)", lambda m: variables.get(m[1], m[0]), assigned[2])
                variables[assigned[1]] = value
            copied = re.search(r"\bcp \S+ \"?([^\"\s]*trainable\.safetensors)\"?\s*$", line)
            if copied:
                written.add(re.sub(r"\$([A-Z_]+)", lambda m: variables.get(m[1], m[0]), copied[1]))
    return written


def test_run_scripts_name_the_checkpoints_they_copy():
    assert "runs/smollm2-whisper-base-es-en-bc/trainable.safetensors" in checkpoints_copied_by_run_scripts()


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_shipped_recipes_load_and_chain(path):
    """Every recipe under recipes/ parses (no unknown keys), names a model folder that ships, writes its own
    output folder, and starts from the model's base weights, another recipe's output, a checkpoint its run.sh
    writes or a shipped checkpoint."""
    recipes = {p: load_train_config(str(p), []) for p in RECIPES}
    config = recipes[path]
    assert (ROOT / "models" / config.model / "config.yaml").is_file()
    assert config.lora_targets in ("", "attention", "all")
    outputs = [Path(other.out_dir) for other in recipes.values()]
    assert outputs.count(Path(config.out_dir)) == 1, f"{config.out_dir} is written by two recipes"
    if config.init_checkpoint:
        shipped = (ROOT / config.init_checkpoint).is_file() and config.init_checkpoint.startswith("models/")
        written = Path(config.init_checkpoint).parent in outputs \
            or config.init_checkpoint in checkpoints_copied_by_run_scripts()
        assert shipped or written, f"{config.init_checkpoint}: nothing writes it"


def test_recipe_lookahead_gives_the_encoder_right_context_its_own_cache_and_later_words(tmp_path):
    from speechstream.targets import TimedWord
    from speechstream.train import Example, training_model
    from speechstream.train.examples import example_pieces

    recipe = load_train_config(str(write_recipe(tmp_path, steps=1, lookahead_frames=16)), [])
    assert training_model(recipe, "cpu").config.encoder.lookahead_frames == 16
    train(recipe, progress=False)
    names = [p.name for p in (tmp_path / "run" / "features").iterdir()]
    assert len(names) == 1 and names[0].startswith("chunk640-lookahead16-encoder"), names
    # a word ending at 0.5 s is heard in the first 640 ms chunk; with 320 ms of right context its frames come
    # with the second chunk, so the target places it there
    example = Example("x", tmp_path / "x.wav", "hello there", (TimedWord("hello", 0.5), TimedWord("there", 1.0)))
    assert example_pieces(example, 0.64, 3, recipe)[0] == [" hello", " there", ""]
    assert example_pieces(example, 0.64, 3, recipe, lookahead_s=0.32)[0] == ["", " hello", " there"]


def special_manifest(folder: Path, kind: str) -> str:
    """The path of an empty manifest, of the sample clips with blank transcripts, or of no file at all."""
    path = folder / {"EMPTY": "empty.jsonl", "NO-TEXT": "no-text.jsonl", "MISSING": "nowhere.jsonl"}[kind]
    rows = [json.loads(line) for line in (ROOT / "samples" / "manifest.jsonl").read_text().splitlines()]
    if kind == "EMPTY":
        path.write_text("\n")
    elif kind == "NO-TEXT":
        path.write_text("".join(json.dumps(row | {"text": " ", "audio": str(ROOT / "samples" / row["audio"])}) + "\n"
                                for row in rows))
    return str(path)


def test_a_single_k_is_a_whole_number_in_a_recipe_and_its_overrides(tmp_path, capsys):
    """``k_choices: 2`` in a recipe and the override ``k_choices=2`` name one k (YAML reads them as numbers: both
    were refused as "the wrong type"); recorded as the text "2", as the quoted form is; 0 is still refused."""
    from speechstream.cli import main

    path = write_recipe(tmp_path)
    path.write_text(path.read_text() + "k_choices: 2\n")
    assert load_train_config(str(path), []).k_choices == "2"
    assert load_train_config(str(path), ["k_choices=3"]).k_choices == "3"
    assert load_train_config(str(path), ["k_choices=1,3"]).k_choices == "1,3"
    assert main(["train", str(path), "k_choices=0"]) == 2
    err = capsys.readouterr().err
    assert "override 'k_choices=0': k_choices must be from 1 to" in err and len(err.strip().splitlines()) == 1, err


def test_exponent_floats_are_numbers_in_a_recipe_and_its_overrides(tmp_path):
    """YAML 1.1 (PyYAML) reads 1e-4 without a dot as a string: "config key lr_lora has the wrong type: '1e-4'"."""
    path = write_recipe(tmp_path)
    text = "".join(line for line in path.read_text().splitlines(keepends=True) if not line.startswith("lr_lora:"))
    path.write_text(text + "lr_lora: 1e-4\nweight_decay: 2E-2\n")
    config = load_train_config(str(path), ["lr_projector=3e-3", "word_margin_s=1.5e-1"])
    assert (config.lr_lora, config.weight_decay, config.lr_projector, config.word_margin_s) == (1e-4, 2e-2, 3e-3, 0.15)


def test_a_key_given_twice_in_a_recipe_is_refused(tmp_path):
    """PyYAML kept the last of two ``steps:`` (or two ``lr_lora:``) silently: a run trained with a value its author
    may not have meant; now one line naming the file and the key, as of a model config."""
    path = write_recipe(tmp_path)
    from speechstream.errors import InputError

    path.write_text(path.read_text() + "steps: 60\n")
    with pytest.raises(InputError, match=r"recipe.yaml: cannot read training config .*found duplicate key 'steps'"):
        load_train_config(str(path), [])


@pytest.mark.parametrize("overrides, match", [
    ({"steps": 0}, "steps must be at least 1"),
    ({"batch_size": 0}, "batch_size must be at least 1"),
    ({"log_every": 0}, "log_every must be at least 1"),
    ({"save_every": 0}, "save_every must be at least 1"),
    ({"threads": -1}, "threads must not be negative"),
    ({"threads": 10**20}, "threads must be at most 1024"),  # (torch's overflow was exit 1)
    ({"threads": 100000}, "threads must be at most 1024"),  # (a MemoryError traceback: no memory for the threads)
    ({"k_choices": "a"}, "k_choices must be whole numbers"),
    ({"k_choices": "1,,2"}, "k_choices must be whole numbers"),
    ({"k_choices": "0"}, "k_choices must be from 1 to 2147483647 each"),
    ({"k_choices": "1,9223372036854775807"}, "k_choices must be from 1 to 2147483647 each"),  # (exit 1: IndexError)
    ({"chunk_ms": 0}, "chunk_ms must be between"),
    ({"mask_time": 2}, "mask_time must be at least 0 and below 1"),
    ({"ctc_weight": -1}, "ctc_weight must not be negative"),
    ({"lr_projector": -1}, "lr_projector must not be negative"),
    ({"lora_targets": "bogus"}, "lora_targets must be"),
    ({"train_manifest": None}, "missing config key train_manifest"),
    ({"ctc_only_steps": 7}, "ctc_only_steps (7) must not exceed steps (6)"),
    ({"warmup_steps": 7}, "warmup_steps (7) must not exceed the joint phase"),
    ({"ctc_only_steps": 2, "warmup_steps": 3}, "warmup_steps (3) must not exceed the CTC-only phase"),
    ({"ctc_only_steps": 3, "warmup_steps": 4}, "warmup_steps (4) must not exceed the"),
    ({"lr_projector": float("nan")}, "lr_projector must be a finite number, not nan"),
    ({"lr_lora": float("inf")}, "lr_lora must be a finite number, not inf"),
    ({"ctc_weight": float("inf")}, "ctc_weight must be a finite number"),
    ({"weight_decay": float("nan")}, "weight_decay must be a finite number"),
    ({"word_margin_s": float("inf")}, "word_margin_s must be a finite number"),
    ({"seed": -1}, "seed must be a whole number from 0"),
    ({"seed": 2**64}, "seed must be a whole number from 0"),
    ({"max_audio_s": 2.0}, "no utterances (all 6 are longer than max_audio_s=2.0)"),
    ({"train_manifest": "EMPTY"}, "empty.jsonl: no utterances"),
    ({"train_manifest": "NO-TEXT"}, "every transcript (text) is empty: nothing to learn"),
    ({"dev_manifest": "NO-TEXT"}, "of the dev utterances is empty once normalised"),
    ({"dev_manifest": "MISSING"}, "cannot read manifest"),
])
def test_bad_recipe_values_are_one_line_errors_before_any_work(capsys, tmp_path, overrides, match):
    from speechstream.cli import main

    recipe = yaml.safe_load(write_recipe(tmp_path).read_text())
    overrides = {key: special_manifest(tmp_path, value) if value in ("EMPTY", "NO-TEXT", "MISSING") else value
                 for key, value in overrides.items()}
    recipe.update(overrides)
    recipe = {key: value for key, value in recipe.items() if value is not None}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["train", str(tmp_path / "recipe.yaml")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and match in err and err.startswith("speechstream: error:"), err
    assert not (tmp_path / "run").exists()  # nothing was built or written


@pytest.mark.parametrize("field, relative", [("out_dir", False), ("model", False), ("model", True),
                                             ("train_manifest", True), ("init_checkpoint", True)])
def test_a_recipe_path_the_system_cannot_look_up_is_one_line(capsys, tmp_path, monkeypatch, field, relative):
    """A recipe path the system cannot look up (a name longer than the file system takes here; a folder on the way
    that may not be searched) is one line naming it, exit 2, before out_dir is made: out_dir's and the model's
    lookups, and a relative path's (tried beside the recipe), raised the OSError (exit 1, "File name too long")."""
    from speechstream.cli import main

    recipe = write_recipe(tmp_path, steps=1)
    monkeypatch.chdir(tmp_path)
    name = "x" * 300 + "/thing"
    value = name if relative else str(tmp_path / name)
    assert main(["train", str(recipe), f"{field}={value}"]) == 2
    err = capsys.readouterr().err
    said = f"{value!r}: cannot look it up" if field == "model" and not relative else f"{value}: cannot look it up"
    assert len(err.strip().splitlines()) == 1 and f"{said} (File name too long)" in err, err
    if field != "model" or relative:  # (a model is looked up once out_dir is held, as a missing one is)
        assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field", ["out_dir", "model", "train_manifest", "dev_manifest", "init_checkpoint"])
def test_an_empty_recipe_path_is_refused_not_taken_as_left_out(capsys, tmp_path, monkeypatch, field):
    """A recipe's (or an override's) empty file or folder name is refused, as the command line's are: out_dir ''
    trained into the current folder, dev_manifest '' and init_checkpoint '' were taken as none."""
    from speechstream.cli import main

    recipe = write_recipe(tmp_path, steps=1)
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert main(["train", str(recipe), f"{field}=''"]) == 2
    assert speechstream_lines(capsys.readouterr().err)[-1].endswith(f"{field} must not be empty" + (
        "; leave it out for none" if field in ("dev_manifest", "init_checkpoint") else ""))
    assert list((tmp_path / "here").iterdir()) == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize("kind, match", [
    ("list", "must be a mapping"),
    ("broken", "cannot read training config"),
    ("override", "not a YAML value"),
    ("duplicate", "duplicate id"),
    ("row-list", "bad manifest line"),
    ("no-audio", "no such audio file"),
    ("long-name", "cannot look the file up (File name too long)"),  # (an OSError, exit 1, before)
    ("out-file", "is not a folder"),
    ("out-under-file", "cannot create the folder"),
    ("number-keys", "unknown config keys 1, 2.5"),
])
def test_bad_recipe_files_are_one_line_errors(capsys, tmp_path, kind, match):
    from speechstream.cli import main

    path = write_recipe(tmp_path)
    argv = ["train", str(path)]
    if kind == "list":
        path.write_text("- model\n- train_manifest\n")
    elif kind == "broken":
        path.write_text("model: [a,\n  b: c\n")
    elif kind == "override":
        argv.append("steps=[")
    elif kind == "number-keys":
        path.write_text(path.read_text() + "1: 2\n2.5: x\n")
    elif kind in ("duplicate", "row-list", "no-audio", "long-name"):
        manifest = tmp_path / "m.jsonl"
        line = (ROOT / "samples" / "manifest.jsonl").read_text().splitlines()[0]
        row = json.loads(line)
        row["audio"] = str(ROOT / "samples" / row["audio"])
        second = {"duplicate": json.dumps(row), "row-list": "[1, 2]",
                  "no-audio": json.dumps({**row, "id": "other", "audio": "nowhere.wav"}),
                  "long-name": json.dumps({**row, "id": "other", "audio": "x" * 5000 + ".wav"})}[kind]
        manifest.write_text(json.dumps(row) + "\n" + second + "\n")
        argv.append(f"train_manifest={manifest}")
    elif kind == "out-under-file":  # (an out_dir that cannot be created: a file on its path)
        (tmp_path / "file").write_text("a file")
        argv.append(f"out_dir={tmp_path / 'file' / 'run'}")
    else:
        (tmp_path / "run").write_text("a file")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and match in err, err


@pytest.mark.parametrize("override, match", [
    ("stpes=5", "override 'stpes=5': no recipe field 'stpes' (did you mean steps?)"),
    ("=1", "override '=1': no recipe field ''"),
    ("steps=abc", "override 'steps=abc': config key steps has the wrong type: 'abc'"),
])
def test_an_override_of_no_recipe_field_names_the_override_not_the_recipe(capsys, tmp_path, override, match):
    """A misspelt key=value on the command line was reported as the recipe file's unknown key, a value of the
    wrong type as the recipe file's."""
    from speechstream.cli import main

    assert main(["train", str(write_recipe(tmp_path)), override]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and match in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("in_file, overrides, blamed", [
    ({}, ["steps=0"], "override 'steps=0': steps must be at least 1, not 0"),
    ({}, ["mask_time=1.5"], "override 'mask_time=1.5': mask_time must be at least 0 and below 1"),
    ({}, ["chunk_ms=7"], "override 'chunk_ms=7': chunk_ms must be between"),
    ({}, ["steps=9", "steps=0"], "override 'steps=0': steps must be at least 1"),  # the last one counts
    ({"ctc_only_steps": 4}, ["steps=3"], "override 'steps=3': ctc_only_steps (4) must not exceed steps (3)"),
    ({}, ["steps=3", "ctc_only_steps=4", "seed=1"], "overrides 'steps=3', 'ctc_only_steps=4': ctc_only_steps (4)"),
    ({"steps": 0}, ["seed=1"], "recipe.yaml: steps must be at least 1, not 0"),  # the file's own value
    ({"warmup_steps": -1}, ["steps=0"], "override 'steps=0': steps must be at least 1"),
    ({}, ["out_dir=FILE"], "override 'out_dir=FILE': out_dir FILE exists and is not a folder"),
])
def test_an_out_of_range_override_is_named_not_the_recipe_file(capsys, tmp_path, in_file, overrides, blamed):
    """A value out of range (or out of step with another) that an override set was reported as the recipe
    file's."""
    from speechstream.cli import main

    (tmp_path / "file").write_text("a file")
    overrides = [item.replace("FILE", str(tmp_path / "file")) for item in overrides]
    blamed = blamed.replace("FILE", str(tmp_path / "file"))
    assert main(["train", str(write_recipe(tmp_path, **in_file)), *overrides]) == 2
    err = capsys.readouterr().err
    where = "" if blamed.startswith("override") else f"{tmp_path}/"
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"speechstream: error: {where}{blamed}"), err
    assert not (tmp_path / "run").exists()


def test_a_feature_cache_linked_to_a_deleted_run_is_a_one_line_error(capsys, tmp_path):
    """recipes/asr/run.sh links a continuation's feature cache to the run it continues; with that run deleted the
    link dangles, and training stopped with a FileExistsError (exit 1). Now: the link, where it pointed, what to do."""
    from speechstream.cli import main

    (tmp_path / "first").mkdir()
    assert main(["train", str(write_recipe(tmp_path / "first", steps=1, warmup_steps=0))]) == 0
    [cache] = (tmp_path / "first" / "run" / "features").iterdir()
    recipe = write_recipe(tmp_path, steps=1, warmup_steps=0)
    (tmp_path / "run" / "features").mkdir(parents=True)
    (tmp_path / "run" / "features" / cache.name).symlink_to(tmp_path / "deleted" / cache.name)
    capsys.readouterr()
    assert main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "which is gone: delete the link" in err, err
    assert str(tmp_path / "deleted" / cache.name) in err, err


def test_a_torn_log_row_is_dropped_when_the_run_resumes(tmp_path):
    """A kill or a full disk while a log row was written leaves a torn last line; the resumed run stopped with a
    JSONDecodeError (exit 1). Now the torn row goes with the other rows after the checkpoint."""
    (tmp_path / "a").mkdir()
    train(load_train_config(str(write_recipe(tmp_path / "a")), []), progress=False)
    recipe = load_train_config(str(write_recipe(tmp_path)), [])
    train(recipe, progress=False, stop_after=3)
    with (tmp_path / "run" / "log.jsonl").open("a") as log:
        log.write('{"lm": 5.4, "accur')
    train(recipe, progress=False)
    logs = [(folder / "run" / "log.jsonl").read_text().splitlines() for folder in (tmp_path / "a", tmp_path)]
    assert [json.loads(line)["step"] for line in logs[1]] == [json.loads(line)["step"] for line in logs[0]]


def test_a_translate_recipe_on_a_manifest_without_translations_says_what_is_missing(capsys, tmp_path):
    """task=translate on a transcript-only manifest read 'bad manifest line (KeyError: 'translation')'."""
    from speechstream.cli import main

    assert main(["train", str(write_recipe(tmp_path)), "task=translate"]) == 2
    err = capsys.readouterr().err
    assert "manifest.jsonl:1: bad manifest line (ValueError: task translate needs a translation" in err, err


@pytest.mark.parametrize("damage", ["safetensors", "optimizer", "step"])
def test_a_damaged_checkpoint_folder_is_a_one_line_error_not_a_crash(capsys, tmp_path, damage):
    from speechstream.cli import main

    path = write_recipe(tmp_path, steps=3, save_every=1)
    assert main(["train", str(path), "--stop-after", "2"]) == 0
    state = tmp_path / "run" / "state"
    if damage == "safetensors":
        torn = next(state.glob("*.safetensors"))
    elif damage == "optimizer":
        torn = state / "optimizer.bin"
    else:
        torn = state / "step.json"
    torn.write_bytes(torn.read_bytes()[:10])
    capsys.readouterr()
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot resume from this checkpoint" in err and str(state) in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_save_cut_short_resumes_from_the_previous_checkpoint(tmp_path):
    """kill -9 between the two renames of a checkpoint save (state moved to state.old, state.tmp torn) and a
    progress.json behind the state: the rerun resumes from the state's own step and ends with the weights of an
    uninterrupted run."""
    (tmp_path / "a").mkdir()
    train(load_train_config(str(write_recipe(tmp_path / "a")), []), progress=False)
    (tmp_path / "b").mkdir()
    recipe = load_train_config(str(write_recipe(tmp_path / "b")), [])
    train(recipe, progress=False, stop_after=3)
    run = tmp_path / "b" / "run"
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    log[1]["marker"] = True  # steps up to the checkpoint are not run again
    (run / "log.jsonl").write_text("".join(json.dumps(row) + "\n" for row in log))
    (run / "state").rename(run / "state.old")
    (run / "state.tmp").mkdir()
    (run / "state.tmp" / "model.safetensors").write_bytes(b"torn")
    (run / "progress.json").write_text(json.dumps({"step": 0}))  # killed before progress.json was written
    train(recipe, progress=False)
    assert not (run / "state.old").exists() and not (run / "state.tmp").exists()
    assert json.loads((run / "state" / "step.json").read_text())["step"] == 6
    assert json.loads((run / "progress.json").read_text())["step"] == 6
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert rows[1].get("marker") and [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6]
    a = load_file(str(tmp_path / "a" / "run" / "trainable.safetensors"))
    b = load_file(str(run / "trainable.safetensors"))
    for key in a:
        assert torch.allclose(a[key], b[key], atol=1e-6), key


def test_a_resumed_run_refuses_a_changed_recipe(capsys, tmp_path):
    """out_dir/recipe.json holds what the run started with: a rerun with another learning rate, seed, step count,
    manifest content or model config is refused on one line before any work; log, save and thread settings may
    change; a finished run says there is nothing to do."""
    from speechstream.cli import main

    path = write_recipe(tmp_path, steps=4, save_every=2)
    assert main(["train", str(path), "--stop-after", "2"]) == 0
    saved = json.loads((tmp_path / "run" / "recipe.json").read_text())
    assert saved["lr_lora"] == 3e-3 and len(saved["train_manifest_sha256"]) == 64
    manifest = tmp_path / "m.jsonl"
    manifest.write_text((ROOT / "samples" / "manifest.jsonl").read_text())
    moved = (ROOT / "samples" / "manifest.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in moved]
    for row in rows:
        row["audio"] = str(ROOT / "samples" / row["audio"])
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))  # same clips, other bytes
    model = yaml.safe_load((tmp_path / "model.yaml").read_text())
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(model | {"llm": model["llm"] | {"lora_rank": 8}}))
    for overrides, match in ((["lr_lora=0.01"], "made with lr_lora=0.003, not 0.01"),
                             (["seed=1"], "made with seed=0, not 1"),
                             (["steps=8"], "steps=8 would change its learning-rate schedule"),
                             ([f"train_manifest={manifest}"], "another train manifest"),
                             ([f"model={tmp_path / 'other.yaml'}"], "another model config")):
        capsys.readouterr()
        assert main(["train", str(path), *overrides]) == 2, overrides
        err = capsys.readouterr().err
        assert match in err and len(err.strip().splitlines()) == 1, err
    assert json.loads((tmp_path / "run" / "state" / "step.json").read_text())["step"] == 2
    assert main(["train", str(path), "threads=1", "log_every=2", "precache=false"]) == 0
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["step"] == 4
    capsys.readouterr()
    assert main(["train", str(path)]) == 0
    assert "already trained to step 4 of 4; nothing to do" in capsys.readouterr().err


def test_a_run_recorded_before_a_recipe_field_existed_resumes_as_its_default(capsys, tmp_path):
    """A recipe.json an earlier version wrote lacks the fields added since (encoder_tuned_layers and lr_encoder came
    after recipe.json): the run trained as their defaults do, so the rerun resumes it (it was refused as "made with
    encoder_tuned_layers=None, not -1"); a value other than the default is still refused, naming the default."""
    from speechstream.cli import main

    path = write_recipe(tmp_path, steps=4, save_every=2)
    assert main(["train", str(path), "--stop-after", "2"]) == 0
    record_path = tmp_path / "run" / "recipe.json"
    earlier = json.loads(record_path.read_text())
    for key in ("encoder_tuned_layers", "lr_encoder"):
        del earlier[key]
    record_path.write_text(json.dumps(earlier))
    capsys.readouterr()
    assert main(["train", str(path)]) == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["step"] == 4
    capsys.readouterr()
    assert main(["train", str(path), "encoder_tuned_layers=1"]) == 2
    err = capsys.readouterr().err
    assert "made with encoder_tuned_layers=-1, not 1" in err and len(err.strip().splitlines()) == 1, err


def test_a_resumed_run_keeps_the_mixed_precision_it_started_with(tmp_path, capsys):
    """The mixed precision accelerate was given (ACCELERATE_MIXED_PRECISION, which ``accelerate launch
    --mixed_precision`` sets) is recorded in recipe.json; a resume with another is refused on one line, exit 2,
    before any step (it resumed a bf16 run in float32, unsaid), and the same precision resumes it."""
    from speechstream.cli import main

    recipe = write_recipe(tmp_path, steps=4, save_every=2)

    def run_bf16(*args: str) -> subprocess.CompletedProcess:  # (a process of its own: accelerate's state is one per
        # process, and this one's is float32)
        env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT),
                   ACCELERATE_MIXED_PRECISION="bf16")
        return subprocess.run([sys.executable, "-m", "speechstream", "train", str(recipe), *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    assert run_bf16("--stop-after", "2").returncode == 0
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["mixed_precision"] == "bf16"
    assert main(["train", str(recipe)]) == 2
    assert speechstream_lines(capsys.readouterr().err) == [
        f"speechstream: error: {tmp_path / 'run'} holds a run trained with mixed_precision='bf16', not 'no': launch "
        "the same command with --mixed_precision bf16 (accelerate launch) or with ACCELERATE_MIXED_PRECISION=bf16 "
        f"to resume it, or give another out_dir (init_checkpoint= starts from this run's trainable.safetensors) or "
        f"delete {tmp_path / 'run'} to start over"]
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["step"] == 2
    done = run_bf16()
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["step"] == 4


def test_a_mixed_precision_accelerate_does_not_know_is_refused(tmp_path):
    """accelerate takes ACCELERATE_MIXED_PRECISION as it is: 'bfloat16' trained in float32, unsaid (and would have
    been recorded as the run's precision)."""
    done = train_with_precision(tmp_path, "bfloat16")
    assert done.returncode == 2 and done.stderr.splitlines() == [
        "speechstream: error: mixed precision 'bfloat16' (ACCELERATE_MIXED_PRECISION) is none of no, fp8, fp16, bf16"]
    assert not (tmp_path / "run" / "recipe.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="accelerate runs fp16 autocast on a GPU")
def test_fp16_on_a_cpu_is_recorded_as_the_float32_it_trains_in(tmp_path):
    """accelerate runs no fp16 autocast on a CPU: the run says so and records 'no' (it recorded 'fp16', so a resume
    on a GPU with fp16 would have passed the check and changed the precision)."""
    done = train_with_precision(tmp_path, "fp16", "--stop-after", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert speechstream_lines(done.stderr) == [
        "speechstream: note: accelerate runs no fp16 mixed precision on cpu: the steps compute in float32 (recorded "
        "as mixed_precision='no')"]
    assert json.loads((tmp_path / "run" / "recipe.json").read_text())["mixed_precision"] == "no"


def train_with_precision(tmp_path: Path, precision: str, *args: str) -> subprocess.CompletedProcess:
    """``speechstream train`` of a tiny recipe in a process of its own with ACCELERATE_MIXED_PRECISION=precision
    (accelerate's state is one per process, and the tests' is float32)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT),
               ACCELERATE_MIXED_PRECISION=precision)
    return subprocess.run([sys.executable, "-m", "speechstream", "train", str(write_recipe(tmp_path)), *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_feature_cache_follows_the_audio_and_the_encoder_and_keeps_ids_inside(tmp_path):
    """An entry is encoded again when its audio file changes under the same id; another encoder (weights or
    config) gets a folder of its own; an id with '/' or '..' stays inside the cache folder."""
    import shutil

    from speechstream.config import ModelConfig, from_dict
    from speechstream.model import build_model
    from speechstream.train import Example, FeatureCache, read_examples

    torch.manual_seed(0)
    model = build_model(from_dict(ModelConfig, TINY_LORA), for_training=True)
    first, second = read_examples(str(ROOT / "samples" / "manifest.jsonl"))[:2]
    audio = tmp_path / "clip.wav"
    shutil.copy(first.audio, audio)
    example = Example("clip", audio, first.text, ())
    cache = FeatureCache(tmp_path / "features", model, 640)
    before = cache.frames(example)
    assert cache.fill([example], 4) == 0  # cached
    shutil.copy(second.audio, audio)  # other audio under the same id
    assert cache.fill([example], 4) == 1
    after, expected = cache.frames(example), FeatureCache(tmp_path / "fresh", model, 640).frames(second)
    assert after[1] == expected[1] and after[1] != before[1] and torch.equal(after[0], expected[0])
    other = build_model(from_dict(ModelConfig, TINY_LORA | {"seed": 1}), for_training=True)  # another encoder
    assert FeatureCache(tmp_path / "features", other, 640).folder != cache.folder
    assert FeatureCache(tmp_path / "features", model, 640).folder == cache.folder
    for odd in ("../../escape", "a/b", "..", "x" * 300):
        path = cache.path(Example(odd, audio, "", ()))
        assert path.parent == cache.folder and len(path.name) < 255, odd
        frames, ends, _ = cache.frames(Example(odd, audio, "", ()))
        assert ends == expected[1] and path.is_file()
    assert [p for p in (tmp_path / "features").rglob("*") if p.is_file() and p.parent != cache.folder] == []


def test_an_id_with_a_lone_surrogate_has_a_feature_cache_entry(tmp_path):
    """A manifest's id may hold a \\udcff escape (the byte of a name that is not UTF-8, as manifest.json_text writes
    it): its cache file name was a UnicodeEncodeError, and the run ended with exit 1 before its first step."""
    from speechstream.config import ModelConfig, from_dict
    from speechstream.model import build_model
    from speechstream.train import Example, FeatureCache, read_examples

    torch.manual_seed(0)
    model = build_model(from_dict(ModelConfig, TINY_LORA), for_training=True)
    clip = read_examples(str(ROOT / "samples" / "manifest.jsonl"))[0]
    cache = FeatureCache(tmp_path / "features", model, 640)
    ids = ("odd\udcff", "odd\udcfe", "x" * 300 + "\udcff")
    paths = [cache.path(Example(odd, clip.audio, "", ())) for odd in ids]
    assert len(set(paths)) == 3 and all(path.parent == cache.folder and len(path.name) < 255 for path in paths)
    assert cache.fill([Example(odd, clip.audio, "", ()) for odd in ids], 4) == 3
    assert all(path.is_file() for path in paths)


def test_the_feature_cache_fills_utterances_in_order_of_their_length_not_of_their_files_size(tmp_path):
    """An encoder pass pads its utterances to its longest: they are taken shortest first, by their length (a
    segment's duration, a whole file's from its header); the segments of one talk were in manifest order (one
    size), so each pass of a MuST-C manifest padded seconds-long segments to its longest, and a file of another
    format or rate was placed by bytes."""
    import numpy as np
    import soundfile

    from speechstream.config import ModelConfig, from_dict
    from speechstream.model import build_model
    from speechstream.train import Example, FeatureCache

    jfk = ROOT / "samples" / "jfk.wav"  # 11 s
    short = ROOT / "samples" / "austen-0880.wav"  # 2.99 s
    stereo = tmp_path / "stereo-44k.wav"  # 1.5 s, but more bytes than the 2.99 s clip
    soundfile.write(stereo, np.zeros((66150, 2), np.float32), 44100, subtype="FLOAT")
    examples = [Example("a", jfk, "", (), offset=1.0, duration=3.0),
                Example("b", jfk, "", (), offset=5.0, duration=1.0),
                Example("c", jfk, "", (), offset=7.0, duration=2.0), Example("short", short, "", ()),
                Example("stereo", stereo, "", ())]
    torch.manual_seed(0)
    cache = FeatureCache(tmp_path / "features", build_model(from_dict(ModelConfig, TINY_LORA)), 640)
    assert [e.id for e in cache.missing(examples)] == ["b", "stereo", "c", "short", "a"]


def test_a_run_killed_while_caching_features_leaves_nothing_behind_and_the_rerun_keeps_whole_entries(
        tmp_path, monkeypatch):
    """Killed between writing an entry and its rename, a run leaves a temporary file; the rerun deletes it (its
    writer is gone), keeps the entries already renamed into place and encodes only the rest."""
    import subprocess

    recipe = write_recipe(tmp_path, steps=1, cache_batch_size=6)
    renamed = []
    real_rename = Path.rename

    def rename_then_die(path, target):
        if len(renamed) == 2:
            raise KeyboardInterrupt  # the kill, after the third entry's file was written whole
        renamed.append(target)
        return real_rename(path, target)

    monkeypatch.setattr(Path, "rename", rename_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(load_train_config(str(recipe), []), progress=False)
    monkeypatch.undo()
    [folder] = (tmp_path / "run" / "features").iterdir()
    [leftover] = folder.glob("*.tmp")
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()  # the killed writer: an id no running process has
    leftover.rename(leftover.with_name(leftover.name.replace(f".{os.getpid()}.", f".{gone.pid}.")))
    kept = {Path(path): Path(path).stat().st_mtime_ns for path in renamed}
    train(load_train_config(str(recipe), []), progress=False)
    assert list(folder.glob("*.tmp")) == []
    assert {path: path.stat().st_mtime_ns for path in kept} == kept  # not encoded again
    assert len(list(folder.glob("*.safetensors"))) == 6


def test_a_dev_clip_sharing_a_training_id_is_refused(capsys, tmp_path):
    from speechstream.cli import main

    rows = [json.loads(line) for line in (ROOT / "samples" / "manifest.jsonl").read_text().splitlines()]
    dev = tmp_path / "dev.jsonl"
    dev.write_text(json.dumps({**rows[1], "id": rows[0]["id"], "audio": str(ROOT / "samples" / rows[1]["audio"])})
                   + "\n")
    path = write_recipe(tmp_path, dev_manifest=str(dev))
    assert main(["train", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"id {rows[0]['id']!r} is also in the train manifest" in err and len(err.strip().splitlines()) == 1, err


def test_init_checkpoint_is_held_to_its_content_not_its_spelling(tmp_path):
    from speechstream.errors import InputError
    from speechstream.train.recipe import check_same_recipe, file_digest

    weights = tmp_path / "ckpt.safetensors"
    weights.write_bytes(b"first")
    (tmp_path / "out").mkdir()
    saved = {"init_checkpoint": "ckpt.safetensors", "init_checkpoint_sha256": file_digest(weights)}
    (tmp_path / "out" / "recipe.json").write_text(json.dumps(saved))
    same = {"init_checkpoint": str(weights), "init_checkpoint_sha256": file_digest(weights)}
    check_same_recipe(tmp_path / "out", same, 3)  # the same file by another path
    weights.write_bytes(b"other")
    other = {"init_checkpoint": "ckpt.safetensors", "init_checkpoint_sha256": file_digest(weights)}
    with pytest.raises(InputError, match="another init_checkpoint"):
        check_same_recipe(tmp_path / "out", other, 3)


@pytest.mark.parametrize("change, match", [
    ({"text": 12}, "text must be a string"),
    ({"text": None}, "text must be a string"),
    ({"words": [{"w": "a", "end": 0.5}, {"w": "b", "end": 0.2}]}, "in order"),
    ({"words": [{"w": "a", "end": float("nan")}]}, "finite"),
    ({"words": [{"w": "a", "end": -1}]}, "non-negative"),
    ({"text": "he was 42", "words": [{"w": "he", "end": 0.3}, {"w": "was", "end": 0.6}, {"w": 40, "end": 1.0},
                                     {"w": 2, "end": 1.3}]}, "w must be a string"),
    ({"words": [{"w": None, "end": 0.3}]}, "w must be a string"),
])
def test_manifest_lines_with_bad_text_or_word_times_are_refused(tmp_path, change, match):
    """A training line whose text is no string, whose word end times are NaN, negative or out of order, or whose
    aligned words are not strings, is one error naming the line (its text was turned into a string; NaN ends went
    into the last chunk; a number as a word, written into the targets where the alignment has other words than the
    transcript, ended training at the step that drew it with a TypeError traceback)."""
    from speechstream.errors import InputError
    from speechstream.train import read_examples

    row = json.loads((ROOT / "samples" / "manifest.jsonl").read_text().splitlines()[0])
    row["audio"] = str(ROOT / "samples" / row["audio"])
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "second", **change}) + "\n")
    with pytest.raises(InputError, match=f"m.jsonl:2: bad manifest line .*{match}"):
        read_examples(str(manifest))


def test_a_null_optional_field_of_a_training_line_is_one_left_out(tmp_path):
    """``"words": null`` (as a table tool writes the lines without an alignment) is a line without word times, as a
    null translation, offset or duration is one without them, and as eval reads any null optional field; it was
    refused: "bad manifest line (TypeError: 'NoneType' object is not iterable)"."""
    from speechstream.train import read_examples

    row = json.loads((ROOT / "samples" / "manifest.jsonl").read_text().splitlines()[0])
    row["audio"] = str(ROOT / "samples" / row["audio"])
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({**row, "words": None, "translation": None, "offset": None, "duration": None})
                        + "\n" + json.dumps({**row, "id": "aligned", "words": [{"w": "and", "end": 0.3}]}) + "\n")
    plain, aligned = read_examples(str(manifest))
    assert (plain.words, plain.translation, plain.offset, plain.duration) == ((), None, 0.0, None)
    assert [word.word for word in aligned.words] == ["and"]


def test_a_home_relative_audio_path_is_read_as_eval_reads_it(tmp_path, monkeypatch):
    """An ``audio`` of "~/clip.wav" is the clip in the home folder, for training as for eval's manifest reader (it
    was taken as a folder named "~" beside the manifest: no such audio file)."""
    import shutil

    from speechstream.manifest import read_manifest
    from speechstream.train import read_examples

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    row = json.loads((ROOT / "samples" / "manifest.jsonl").read_text().splitlines()[0])
    (tmp_path / "home").mkdir()
    shutil.copy(ROOT / "samples" / row["audio"], tmp_path / "home" / "clip.wav")
    manifest = tmp_path / "data" / "m.jsonl"
    manifest.parent.mkdir()
    manifest.write_text(json.dumps({**row, "audio": "~/clip.wav"}) + "\n")
    [example] = read_examples(str(manifest))
    [utterance] = read_manifest(manifest)
    assert example.audio == utterance.audio == tmp_path / "home" / "clip.wav"


def test_manifest_segments_train_on_their_time_range_and_long_clips_are_skipped_by_their_length(tmp_path):
    """``offset``/``duration`` make an utterance a time range of its file (docs/manifest.md), in training as in eval:
    the cache encodes that range (each range its own entry); ``max_audio_s`` skips by the clip's length, read from
    the file's header where the line gives no duration; a range outside the file is one error naming the line."""
    from speechstream.audio import load_audio
    from speechstream.config import ModelConfig, from_dict
    from speechstream.errors import InputError
    from speechstream.model import build_model
    from speechstream.train import FeatureCache, read_examples

    jfk = str(ROOT / "samples" / "jfk.wav")  # 11 s
    short = str(ROOT / "samples" / "austen-0880.wav")  # 2.99 s
    rows = [{"id": "a", "audio": jfk, "text": "and so", "offset": 1.0, "duration": 2.5},
            {"id": "b", "audio": jfk, "text": "my fellow", "offset": 4.0, "duration": 2.0},
            {"id": "whole", "audio": jfk, "text": "ask not"},
            {"id": "short", "audio": short, "text": "he was not"}]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows))
    examples = read_examples(str(manifest), max_audio_s=5.0)
    assert [e.id for e in examples] == ["a", "b", "short"]  # "whole" is 11 s: skipped though it gives no duration
    assert (examples[0].offset, examples[0].duration) == (1.0, 2.5)
    torch.manual_seed(0)
    model = build_model(from_dict(ModelConfig, TINY_LORA), for_training=True)
    cache = FeatureCache(tmp_path / "features", model, 640)
    assert cache.fill(examples, 4) == 3  # two ranges of one file: two entries
    for example in examples[:2]:
        frames, ends, samples = cache.frames(example)
        assert samples == round(example.duration * 16000)
        audio = load_audio(jfk, example.offset, example.duration)
        with torch.no_grad():
            expected = model.encode([audio], 640)
        assert ends == expected.frame_ends[0]
        assert torch.allclose(frames, expected.frames[0, : ends[-1]].half().float(), atol=2e-3)
    assert not torch.equal(cache.frames(examples[0])[0][:10], cache.frames(examples[1])[0][:10])
    manifest.write_text(json.dumps(rows[0] | {"offset": 10.0}) + "\n")
    with pytest.raises(InputError, match=r"m.jsonl:1: .*not inside the audio"):
        read_examples(str(manifest))
    manifest.write_text(json.dumps(rows[0] | {"duration": -1}) + "\n")
    with pytest.raises(InputError, match=r"m.jsonl:1: bad manifest line .*duration must be a positive number"):
        read_examples(str(manifest))


def test_a_failing_dev_evaluation_loses_no_training(tmp_path, monkeypatch):
    """The steps are saved before the dev set is scored: an error there (here a stand-in) leaves the last step's
    checkpoint and weights, and the rerun only finishes the evaluation."""
    import speechstream.train.dev as train_dev

    recipe = load_train_config(str(write_recipe(tmp_path, steps=3, save_every=10,
                                                dev_manifest=str(ROOT / "samples" / "manifest.jsonl"))), [])

    def broken(*args, **kwargs):
        raise RuntimeError("dev evaluation failed")

    monkeypatch.setattr(train_dev, "dev_ctc_wer", broken)
    with pytest.raises(RuntimeError, match="dev evaluation failed"):
        train(recipe, progress=False)
    assert json.loads((tmp_path / "run" / "progress.json").read_text())["step"] == 3
    assert json.loads((tmp_path / "run" / "state" / "step.json").read_text())["step"] == 3
    assert (tmp_path / "run" / "trainable.safetensors").is_file()
    weights = (tmp_path / "run" / "trainable.safetensors").read_bytes()
    monkeypatch.undo()
    train(recipe, progress=False)  # (it said "nothing to do", and the run never got its dev score)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3, 3] and "dev_ctc_wer" in rows[-1]
    assert (tmp_path / "run" / "trainable.safetensors").read_bytes() == weights  # not trained again
    train(recipe, progress=False)
    assert len((tmp_path / "run" / "log.jsonl").read_text().splitlines()) == 4  # scored once


def test_export_replaces_the_models_files_atomically_and_transcribe_loads_the_run(tmp_path, monkeypatch, capsys):
    """recipes/asr/export.py: a write that fails halfway leaves the model's weights and config as they were; a
    completed export names its weights once in config.yaml, and ``speechstream transcribe`` runs on the weights the
    training run saved."""
    import argparse

    from speechstream.cli import main
    from speechstream.model import load_model
    from tests.helpers import load_recipe

    export = load_recipe(ROOT / "recipes" / "asr" / "export.py")
    train(load_train_config(str(write_recipe(tmp_path, steps=2)), []), progress=False)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text(yaml.safe_dump(TINY_LORA | {"checkpoint": "old.safetensors"}))
    (model_dir / "trainable.safetensors").write_bytes(b"the weights shipped before")
    args = argparse.Namespace(run=tmp_path / "run", model=model_dir, recipe=None)
    real_save = export.save_file

    def torn_save(tensors, path, metadata=None):
        Path(path).write_bytes(b"torn")
        raise OSError("No space left on device")

    monkeypatch.setattr(export, "save_file", torn_save)
    before = {path.name: path.read_bytes() for path in model_dir.iterdir()}
    with pytest.raises(OSError, match="No space left"):
        export.export(args)
    assert {path.name: path.read_bytes() for path in model_dir.iterdir()} == before
    monkeypatch.setattr(export, "save_file", real_save)
    export.export(args)
    config_text = (model_dir / "config.yaml").read_text()
    assert config_text.count("checkpoint:") == 1
    assert yaml.safe_load(config_text)["checkpoint"] == "trainable.safetensors"
    assert sorted(path.name for path in model_dir.iterdir()) == ["config.yaml", "trainable.safetensors"]
    trained = load_file(str(tmp_path / "run" / "trainable.safetensors"))
    loaded = load_model(str(model_dir), for_training=True).state_dict()  # (adapters unmerged)
    weights = [key for key in trained if trained[key].is_floating_point()]
    assert any(key.startswith("projector.") for key in weights) and any("lora_" in key for key in weights)
    for key in weights:  # (export ships float16)
        assert torch.equal(loaded[key], trained[key].half().float()), key
    capsys.readouterr()
    assert main(["transcribe", str(ROOT / "samples" / "austen-0880.wav"), "--model", str(model_dir),
                 "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["audio_s"] == pytest.approx(2.99, abs=0.01)


@pytest.mark.parametrize("config_text, message", [
    ("llm: [\n", "cannot read model config"),
    ("- 1\n", "a model config must be a mapping"),
    ("", "a model config must be a mapping"),
])
def test_export_refuses_a_model_config_that_is_none_before_writing(tmp_path, config_text, message):
    """A run without recipe.json (an earlier version's) did not have the model's config.yaml read before the export:
    YAML that does not parse, or a list or nothing, stopped it with a ScannerError or AttributeError traceback; it is
    the one-line input error of any other command given that folder, and nothing is written."""
    import argparse

    from speechstream.errors import InputError
    from tests.helpers import load_recipe

    export = load_recipe(ROOT / "recipes" / "asr" / "export.py")
    run, model_dir = tmp_path / "run", tmp_path / "model"
    run.mkdir()
    model_dir.mkdir()
    save_file({"projector.weight": torch.zeros(2)}, str(run / "trainable.safetensors"))
    (run / "progress.json").write_text(json.dumps({"step": 2}))
    (model_dir / "config.yaml").write_text(config_text)
    with pytest.raises(InputError, match=message):
        export.export(argparse.Namespace(run=run, model=model_dir, recipe=None))
    assert sorted(path.name for path in model_dir.iterdir()) == ["config.yaml"]


def trained_for_export(tmp_path: Path, steps: int):
    """A tiny run of ``steps`` trained under ``tmp_path``/run and an empty model folder beside it holding the tiny
    LoRA config: (recipes/asr/export.py loaded, the model folder, export's arguments for them)."""
    import argparse

    from tests.helpers import load_recipe

    export = load_recipe(ROOT / "recipes" / "asr" / "export.py")
    train(load_train_config(str(write_recipe(tmp_path, steps=steps)), []), progress=False)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text(yaml.safe_dump(TINY_LORA))
    return export, model_dir, argparse.Namespace(run=tmp_path / "run", model=model_dir, recipe=None)


def test_export_keeps_the_modes_of_the_models_files(tmp_path):
    """safetensors writes its files 0600: an export replaced a model's world-readable trainable.safetensors (git's
    0644) with one only its owner could read, so a model folder exported for others (a shared checkout, ``pip
    install .`` as root) failed to load for every other user. The weights keep the mode of the file they replace
    (a new file: the umask's), as config.yaml does."""
    import stat


    export, model_dir, args = trained_for_export(tmp_path, steps=2)
    umask = os.umask(0o022)
    try:
        export.export(args)  # (a new file)
        assert stat.S_IMODE((model_dir / "trainable.safetensors").stat().st_mode) == 0o644
        (model_dir / "trainable.safetensors").chmod(0o664)
        (model_dir / "config.yaml").chmod(0o664)
        export.export(args)  # (replacing the shipped ones)
    finally:
        os.umask(umask)
    assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in model_dir.iterdir()} == {
        "config.yaml": 0o664, "trainable.safetensors": 0o664}


def test_export_refuses_a_model_config_without_the_runs_adapters_and_notes_another_right_context(tmp_path, capsys):
    """A recipe's lora_targets and lookahead_frames change the model it trains. Exported into a copy of its model
    config, the MLP adapters did not load (an error naming tensors): export refuses, naming the setting, and writes
    nothing. The right context was silently left out (the weights decode other frames than they were trained on,
    which the shipped model does on purpose): export says so."""
    import argparse

    from speechstream.errors import InputError
    from speechstream.model import load_model
    from tests.helpers import load_recipe

    export = load_recipe(ROOT / "recipes" / "asr" / "export.py")
    train(load_train_config(str(write_recipe(tmp_path, steps=2, lora_targets="all", lookahead_frames=8)), []),
          progress=False)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    args = argparse.Namespace(run=tmp_path / "run", model=model_dir, recipe=None)
    (model_dir / "config.yaml").write_text(yaml.safe_dump(TINY_LORA))
    with pytest.raises(InputError, match="lora_targets=all .* set llm.lora_targets: all there first"):
        export.export(args)
    assert sorted(path.name for path in model_dir.iterdir()) == ["config.yaml"]
    llm = TINY_LORA["llm"] | {"lora_targets": "all"}
    (model_dir / "config.yaml").write_text(yaml.safe_dump(TINY_LORA | {"llm": llm}))
    capsys.readouterr()
    export.export(args)
    err = capsys.readouterr().err
    assert "lookahead_frames=8" in err and "encoder.lookahead_frames: 0" in err and "not trained on" in err, err
    assert load_model(str(model_dir)).config.llm.lora_targets == "all"
    encoder = TINY_LORA["encoder"] | {"lookahead_frames": 8}
    (model_dir / "config.yaml").write_text(yaml.safe_dump(TINY_LORA | {"llm": llm, "encoder": encoder}))
    export.export(args)
    assert "note" not in capsys.readouterr().err


def test_export_refuses_a_model_config_without_the_runs_fine_ctc_head(tmp_path):
    """A ctc_head_only run (ctc_hop=2) exported into a model config without ctc_hop did not load ('checkpoint does not
    fit the model'); export names the setting and writes nothing."""
    import argparse

    from speechstream.errors import InputError
    from tests.helpers import load_recipe

    export = load_recipe(ROOT / "recipes" / "asr" / "export.py")
    train(load_train_config(str(write_recipe(tmp_path, steps=1, warmup_steps=0, ctc_head_only=True, ctc_hop=2)), []),
          progress=False)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text(yaml.safe_dump(TINY_LORA))
    with pytest.raises(InputError, match="ctc_hop=2 .* has ctc_hop: 0; set ctc_hop: 2 there first"):
        export.export(argparse.Namespace(run=tmp_path / "run", model=model_dir, recipe=None))
    assert sorted(path.name for path in model_dir.iterdir()) == ["config.yaml"]


def test_export_average_with_ships_the_mean_of_two_checkpoints_and_refuses_another_models(tmp_path, capsys):
    """``--average-with FILE``: every floating tensor is the mean of the run's and the file's (each as export ships
    it, float16), the CTC class ids are the union of both, and the metadata names the file, its sha256 and its
    step. Weights of another model (a tensor missing, another shape) or no file at all are a one-line input error,
    and nothing is written."""
    import argparse

    from safetensors.torch import save_file

    from speechstream.errors import InputError
    from speechstream.model import CTC_CLASSES
    from tests.helpers import load_recipe

    export = load_recipe(ROOT / "recipes" / "asr" / "export.py")
    train(load_train_config(str(write_recipe(tmp_path, steps=1)), []), progress=False)
    run_file = tmp_path / "run" / "trainable.safetensors"
    state = load_file(str(run_file))
    state[CTC_CLASSES] = torch.tensor([3, 5, 9])
    save_file(state, str(run_file))
    other = {name: tensor * 3 + 0.25 if tensor.is_floating_point() else tensor for name, tensor in state.items()}
    other[CTC_CLASSES] = torch.tensor([1, 5, 11])
    other_file = tmp_path / "other.safetensors"
    save_file({name: t.half() if t.is_floating_point() else t for name, t in other.items()}, str(other_file),
              metadata={"step": "7"})
    other_bytes = other_file.read_bytes()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text(yaml.safe_dump(TINY_LORA))
    args = argparse.Namespace(run=tmp_path / "run", model=model_dir, recipe=None, average_with=other_file)
    export.export(args)
    assert f"averaged with {other_file}" in capsys.readouterr().out
    target = model_dir / "trainable.safetensors"
    shipped = load_file(str(target))
    assert shipped[CTC_CLASSES].tolist() == [1, 3, 5, 9, 11]
    floats = [name for name in state if state[name].is_floating_point()]
    assert floats and all(shipped[name].dtype == torch.float16 for name in floats)
    for name in floats:
        mean = (state[name].half().float() + other[name].half().float()) / 2
        assert torch.equal(shipped[name], mean.half()), name
        assert not torch.equal(shipped[name], state[name].half()), name  # (the mean, not the run's own)
    from safetensors import safe_open

    with safe_open(str(target), "pt") as handle:
        assert handle.metadata() == {"step": "1", "averaged_with": "other.safetensors",
                                     "averaged_with_sha256": hashlib.sha256(other_bytes).hexdigest(),
                                     "averaged_with_step": "7"}
    before = target.read_bytes()
    name = floats[0]
    for change, match in (({name: None}, "not the same model's weights .1 tensors in only one"),
                          ({name: torch.zeros(2, 2)}, f"{name} has shape .2, 2., the run's")):
        broken = {key: value for key, value in other.items() if change.get(key, value) is not None}
        broken.update({key: value for key, value in change.items() if value is not None})
        save_file(broken, str(other_file))
        with pytest.raises(InputError, match=match):
            export.export(args)
    with pytest.raises(InputError, match="missing.safetensors: not found"):
        export.export(argparse.Namespace(**vars(args) | {"average_with": tmp_path / "missing.safetensors"}))
    assert target.read_bytes() == before


def test_export_run_weight_interpolates_between_the_two_checkpoints(tmp_path, capsys):
    """``--run-weight W`` ships W * run + (1 - W) * other (each side float16 as shipped), records W in the
    metadata; a weight outside (0, 1), or one without ``--average-with``, is a one-line input error and nothing is
    written."""
    import argparse

    from safetensors import safe_open
    from safetensors.torch import save_file

    from speechstream.errors import InputError
    from tests.helpers import load_recipe

    export = load_recipe(ROOT / "recipes" / "asr" / "export.py")
    train(load_train_config(str(write_recipe(tmp_path, steps=1)), []), progress=False)
    state = load_file(str(tmp_path / "run" / "trainable.safetensors"))
    other = {name: tensor * 3 + 0.25 if tensor.is_floating_point() else tensor for name, tensor in state.items()}
    other_file = tmp_path / "other.safetensors"
    save_file({name: t.half() if t.is_floating_point() else t for name, t in other.items()}, str(other_file))
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text(yaml.safe_dump(TINY_LORA))
    args = argparse.Namespace(run=tmp_path / "run", model=model_dir, recipe=None, average_with=other_file,
                              run_weight=0.8)
    export.export(args)
    assert "(run weight 0.8)" in capsys.readouterr().out
    target = model_dir / "trainable.safetensors"
    shipped = load_file(str(target))
    floats = [name for name in state if state[name].is_floating_point()]
    for name in floats:
        expected = 0.8 * state[name].half().float() + 0.2 * other[name].half().float()
        assert torch.equal(shipped[name], expected.half()), name
        plain_mean = (state[name].half().float() + other[name].half().float()) / 2
        assert not torch.equal(shipped[name], plain_mean.half()), name
    with safe_open(str(target), "pt") as handle:
        assert handle.metadata()["run_weight"] == "0.8"
    before = target.read_bytes()
    for change, match in (({"run_weight": 1.0}, "--run-weight 1: must lie strictly between 0 and 1"),
                          ({"run_weight": -0.2}, "--run-weight -0.2: must lie"),
                          ({"average_with": None, "run_weight": 0.7}, "--run-weight needs --average-with")):
        with pytest.raises(InputError, match=match):
            export.export(argparse.Namespace(**vars(args) | change))
    assert target.read_bytes() == before


def test_export_names_a_damaged_run_record(tmp_path):
    """A progress.json or recipe.json that is not the JSON object train writes is a one-line error naming the file
    (a progress.json without its step was a KeyError traceback; bad JSON a message naming no file)."""

    from speechstream.errors import InputError

    export, model_dir, args = trained_for_export(tmp_path, steps=1)
    for name, text, match in (("progress.json", "{}", "progress.json: no step number"),
                              ("progress.json", "[1", "progress.json: not valid JSON"),
                              ("recipe.json", "[]", "recipe.json: not a JSON object")):
        saved = (tmp_path / "run" / name).read_text()
        (tmp_path / "run" / name).write_text(text)
        with pytest.raises(InputError, match=match):
            export.export(args)
        (tmp_path / "run" / name).write_text(saved)
    assert sorted(path.name for path in model_dir.iterdir()) == ["config.yaml"]
    export.export(args)
    assert (model_dir / "trainable.safetensors").is_file()


def test_ctc_targets_longer_than_their_frames_count_as_zero_and_are_logged(tmp_path):
    """An utterance whose CTC target needs more frames than it has (labels plus a blank between repeats) adds 0 to
    the CTC loss (zero_infinity) and nothing to its gradient; the log says which share of the batch that was
    (the tiny byte-level model hears 4 of the 6 sample clips at 12.5 speech tokens/s, too few for their letters)."""
    from speechstream.model import load_model
    from speechstream.train import StreamingLoss
    from speechstream.train.objective import unfit_ctc_targets

    assert unfit_ctc_targets([3, 3, 3, 2, 0], [[1, 2, 3], [1, 1, 2], [1, 1], [], [5]]) == 2
    torch.manual_seed(0)
    speech = torch.randn(1, 3, 64, requires_grad=True)
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(TINY_LORA))
    model = load_model(str(tmp_path / "model.yaml"), for_training=True)
    source = type("Source", (), {"speech": speech, "speech_lengths": torch.tensor([3])})()
    loss = StreamingLoss(model, 1.0)
    unfit = loss.ctc_loss(source, [[7, 7, 8]])  # needs 4 frames
    unfit.backward()
    assert float(unfit.detach()) == 0.0 and not speech.grad.any()
    blank_only = loss.ctc_loss(source, [[]])  # an empty target: every frame blank
    expected = -model.ctc_logits(speech).log_softmax(-1)[0, :, -1].sum()
    assert torch.allclose(blank_only, expected)
    train(load_train_config(str(write_recipe(tmp_path, steps=2, batch_size=6, ctc_only_steps=1, warmup_steps=1)), []),
          progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [row["ctc_unfit"] for row in rows] == [pytest.approx(4 / 6), pytest.approx(4 / 6)]


@pytest.mark.parametrize(("script", "arguments", "message"), [
    ("export.py", [], "export: error: the following arguments are required: run, model"),
    ("model_card.py", ["--model", "m"], "model_card: error: the following arguments are required: --run, --eval"),
    ("ctc_probe.py", ["--model", "m", "--chunk-ms", "x"], "ctc_probe: error: argument --chunk-ms: invalid int value"),
])
def test_a_recipe_tool_usage_error_is_one_line_and_exit_2(script, arguments, message):
    """The ASR recipe's tools answer a bad command line in one line, exit 2, as their other errors (argparse printed
    its usage lines and '<script>: error: ...' first)."""
    done = subprocess.run([sys.executable, str(ROOT / "recipes" / "asr" / script), *arguments], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and done.stderr.startswith(message), done.stderr


def test_a_partly_tuned_encoder_trains_its_last_layers_and_ships_them(tmp_path):
    """encoder_tuned_layers=1: the cache holds the rows below the last encoder layer; the steps train that layer
    and the final layer norm (at lr_encoder) and leave the layer below as it was; the checkpoint carries them,
    and a model loaded from it (its config without the field) encodes with them. Resumed after step 3, the run
    gives the weights of a run never stopped."""
    from speechstream.model import build_model, load_model
    from speechstream.config import load_model_config

    runs = {}
    for name, stop in (("straight", None), ("resumed", 3)):
        folder = tmp_path / name
        folder.mkdir()
        recipe = write_recipe(folder, encoder_tuned_layers=1, lr_encoder=1e-2, mask_time=0.2,
                              dev_manifest=str(ROOT / "samples" / "manifest.jsonl"), eval_utterances=2)
        config = load_train_config(str(recipe), [])
        if stop:
            train(config, progress=False, stop_after=stop)
        train(config, progress=False)
        runs[name] = load_file(str(folder / "run" / "trainable.safetensors"))
    trained = runs["straight"]
    assert trained.keys() == runs["resumed"].keys()
    for key in trained:
        assert torch.allclose(trained[key], runs["resumed"][key], atol=1e-6), key
    tuned = sorted(key for key in trained if key.startswith("encoder."))
    assert tuned and all(key.startswith(("encoder.layers.1.", "encoder.layer_norm.")) for key in tuned), tuned
    initial = build_model(load_model_config(str(tmp_path / "straight" / "model.yaml"))).state_dict()
    assert all(not torch.equal(trained[key], initial[key]) for key in tuned if key.endswith("weight")), tuned
    caches = [path.name for path in (tmp_path / "straight" / "run" / "features").iterdir()]
    assert len(caches) == 1 and "-frozen1-" in caches[0], caches
    log = [json.loads(line) for line in (tmp_path / "straight" / "run" / "log.jsonl").read_text().splitlines()]
    assert any("dev_ctc_wer" in row for row in log)
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(
        TINY_LORA | {"checkpoint": str(tmp_path / "straight" / "run" / "trainable.safetensors")}))
    model = load_model(str(tmp_path / "model.yaml"))
    for key in tuned:
        assert torch.equal(model.state_dict()[key], trained[key]), key
    frozen = "encoder.layers.0.fc1.weight"
    assert torch.equal(model.state_dict()[frozen], initial[frozen])


def test_a_checkpoint_with_tuned_encoder_layers_keeps_them_in_later_stages(tmp_path):
    """A stage continuing a partly tuned encoder's run (its recipe and model config say nothing of the encoder)
    trains and ships the layers the checkpoint carries, instead of silently dropping them from its own; a
    checkpoint whose encoder weights are not the last layers and the final norm is refused in one line."""
    from safetensors.torch import save_file

    from speechstream.errors import InputError
    from speechstream.model import load_model

    (tmp_path / "a").mkdir()
    train(load_train_config(str(write_recipe(tmp_path / "a", steps=2, encoder_tuned_layers=1)), []), progress=False)
    first = tmp_path / "a" / "run" / "trainable.safetensors"
    (tmp_path / "b").mkdir()
    recipe = write_recipe(tmp_path / "b", steps=2, init_checkpoint=str(first), lr_encoder=1e-2)
    train(load_train_config(str(recipe), []), progress=False)
    before, after = load_file(str(first)), load_file(str(tmp_path / "b" / "run" / "trainable.safetensors"))
    tuned = [key for key in before if key.startswith("encoder.")]
    assert tuned and set(tuned) <= set(after)
    assert not torch.equal(before["encoder.layers.1.fc1.weight"], after["encoder.layers.1.fc1.weight"])
    assert any("-frozen1-" in path.name for path in (tmp_path / "b" / "run" / "features").iterdir())
    wrong = dict(before)
    wrong["encoder.layers.0.fc1.weight"] = wrong.pop("encoder.layers.1.fc1.weight")
    save_file(wrong, str(tmp_path / "wrong.safetensors"))
    wrong_model = TINY_LORA | {"checkpoint": str(tmp_path / "wrong.safetensors")}
    (tmp_path / "model.yaml").write_text(yaml.safe_dump(wrong_model))
    with pytest.raises(InputError, match="not the encoder's last layers and final layer norm"):
        load_model(str(tmp_path / "model.yaml"))


def test_spec_augment_masks_what_a_tuned_encoder_gives_not_the_rows_it_reads(tmp_path):
    """With a partly tuned encoder the SpecAugment mask falls on the frames the tuned layers give (as on a frozen
    encoder's frames): zeros where it masks, the tuned layers' output elsewhere. (Masking the cached rows they read
    instead, as first built, fed the projector layer-normed noise in place of zeros: the training CTC loss of the
    real model started at 6.9 instead of 3.3.)"""
    from speechstream.audio import load_audio
    from speechstream.model import load_model
    from speechstream.train import StreamingLoss

    (tmp_path / "model.yaml").write_text(yaml.safe_dump(TINY_LORA | {
        "encoder": TINY_LORA["encoder"] | {"tuned_layers": 1, "lookahead_frames": 8}}))
    model = load_model(str(tmp_path / "model.yaml"), for_training=True)
    audio = load_audio(ROOT / "samples" / "jfk.wav")[:48000]
    rows, ends = model.encode_frozen([audio], 640)
    assert len(rows[0]) > ends[0][-1]  # (the look-ahead copies follow the frames)
    keep = torch.ones(1, ends[0][-1], 64)
    keep[0, :, 3] = 0
    keep[0, 5:10] = 0
    seen = []
    model.projector.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    StreamingLoss(model, 1.0)(rows[0][None], ends, [], [model._ids(" and so")], 1, ctc_only=True, keep=keep)
    with torch.no_grad():
        expected = model.frames_from_frozen(rows[0][None], ends) * keep
    assert torch.allclose(seen[0], expected, atol=1e-6)
    assert not seen[0][0, :, 3].any() and not seen[0][0, 5:10].any() and seen[0][0, 10:, 4].abs().min() > 0
