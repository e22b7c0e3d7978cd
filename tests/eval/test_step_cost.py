"""recipes/eval/step_cost.py: the LLM step's cost by rows, on the tiny seeded model."""

import importlib.util
from pathlib import Path

import pytest
import torch

from speechstream.errors import InputError

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "eval" / "step_cost.py"


@pytest.fixture(scope="module")
def step_cost():
    spec = importlib.util.spec_from_file_location("step_cost_recipe", RECIPE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_prints_a_row_per_count_with_the_first_as_the_unit(step_cost, capsys):
    threads = torch.get_num_threads()
    try:
        assert step_cost.main(["--model", "tiny-random", "--rows", "1,4", "--repeats", "2", "--cache", "8"]) == 0
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("tiny-random: one step after 8 source slots, 1 thread(s), LLM in float32, median of 2")
    table = [line.split() for line in lines[2:]]
    assert [row[0] for row in table] == ["1", "4"]
    assert float(table[0][3]) == 1.0 and float(table[1][3]) > 0
    assert float(table[1][2]) == pytest.approx(float(table[1][1]) / 4, abs=0.1)  # ms per row


def test_the_timed_step_leaves_the_stream_as_it_was(step_cost):
    from speechstream import gpe
    from speechstream.model import load_model

    model = load_model("tiny-random")
    state = model.decoder.new_state(1)
    hidden = model.decoder.llm.get_input_embeddings().weight.shape[1]
    with torch.no_grad():
        model.decoder.step(state, torch.zeros(1, 3, hidden), torch.full((1, 3), gpe.SOURCE))
        assert step_cost.time_step(model, state, 5) > 0
    assert state.kinds.shape[1] == 3 and state.cache.get_seq_length() == 3
    assert int(state.next_target_pos[0]) == model.decoder.phi


@pytest.mark.parametrize("rows", ["1,x", "0", "1,1", "", "65"])
def test_bad_row_counts_are_input_errors(step_cost, rows):
    with pytest.raises(InputError, match="--rows"):
        step_cost.row_counts(rows)


def test_threads_past_the_command_lines_limit_are_refused_before_any_are_set(step_cost, monkeypatch):
    """--threads 100000 set torch's threads and then failed to map a library ('memory allocation failed', the process
    aborted); it is held to the command line's limit, as `speechstream --threads` is, before torch is told."""
    from speechstream.config import MAX_THREADS

    def no_threads(count):
        raise AssertionError(f"torch was told {count} threads")

    monkeypatch.setattr(torch, "set_num_threads", no_threads)
    with pytest.raises(InputError, match=f"--threads must be at most {MAX_THREADS}, got 100000"):
        step_cost.main(["--model", "tiny-random", "--threads", "100000"])
