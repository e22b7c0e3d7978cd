"""The fine CTC head: its windows, its stream (equal to the whole-utterance pass), its start from the projector,
its training alone and its place in joint decoding."""

import dataclasses

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from speechstream.ctc_head import CTCHead, CTCWindowStream, ctc_windows, ready_windows
from speechstream.projector import Projector


def test_windows_start_every_hop_frames_and_are_zero_padded_at_the_end():
    frames = torch.arange(1, 6, dtype=torch.float32)[:, None]  # 5 frames of width 1: values 1..5
    windows = ctc_windows(frames, stack=4, hop=2)
    assert windows.shape == (3, 4, 1)
    assert windows[:, :, 0].tolist() == [[1, 2, 3, 4], [3, 4, 5, 0], [5, 0, 0, 0]]
    assert ctc_windows(frames[:0], 4, 2).shape == (0, 4, 1)
    assert ctc_windows(frames, 4, 4)[:, :, 0].tolist() == [[1, 2, 3, 4], [5, 0, 0, 0]]  # hop = stack: the stacks


def test_a_window_is_ready_once_its_frames_are_there_and_every_window_at_the_end():
    assert [ready_windows(n, 8, 2, final=False) for n in (0, 7, 8, 9, 10, 32)] == [0, 0, 1, 1, 2, 13]
    assert [ready_windows(n, 8, 2, final=True) for n in (0, 1, 2, 3, 32)] == [0, 1, 1, 2, 16]


def test_hop_outside_one_to_stack_is_refused():
    for hop in (0, 5):
        with pytest.raises(ValueError, match="ctc_hop"):
            CTCHead(16, 8, stack=4, hop=hop)


def test_streamed_windows_equal_the_whole_utterance_for_any_pushes():
    torch.manual_seed(0)
    head = CTCHead(16, 8, stack=4, hop=2).eval()
    with torch.no_grad():
        head.blank.normal_()
    frames = torch.randn(37, 16)
    with torch.no_grad():
        whole = head(frames)
    for sizes in ([37], [3, 0, 1, 8, 25], [1] * 37, [16, 16, 5]):
        stream, outs, start = CTCWindowStream(head), [], 0
        for i, size in enumerate(sizes):
            outs.append(stream.push(frames[start : start + size], final=i == len(sizes) - 1))
            start += size
        streamed = torch.cat(outs)
        assert streamed.shape == whole.shape == (19, 8)
        assert torch.allclose(streamed, whole, atol=1e-6), sizes


def test_a_head_started_from_the_projector_at_hop_stack_scores_what_the_speech_tokens_do():
    torch.manual_seed(1)
    projector = Projector(16, 8, stack=4, output_scale=0.1)
    blank = torch.randn(8)
    head = CTCHead(16, 8, stack=4, hop=4)
    head.init_from_projector(projector, blank)
    frames = torch.randn(10, 16)
    with torch.no_grad():
        assert torch.allclose(head(frames), projector(frames[None])[0] / 0.1, atol=1e-5)
    assert torch.equal(head.blank.detach(), blank)


def _tiny_recipe(tmp_path, **overrides):
    from tests.train.test_train import write_recipe

    return write_recipe(tmp_path, **overrides)


def test_training_the_head_alone_changes_only_the_head_and_ships_it(tmp_path):
    from speechstream.train import load_train_config, train

    (tmp_path / "a").mkdir()
    first = _tiny_recipe(tmp_path / "a", steps=2)
    train(load_train_config(str(first), []), progress=False)
    start = load_file(str(tmp_path / "a" / "run" / "trainable.safetensors"))
    assert not any(name.startswith("ctc_head.") for name in start)
    (tmp_path / "b").mkdir()
    second = _tiny_recipe(tmp_path / "b", steps=3, ctc_head_only=True, ctc_hop=2, batch_size=3,
                          init_checkpoint=str(tmp_path / "a" / "run" / "trainable.safetensors"))
    train(load_train_config(str(second), []), progress=False)
    after = load_file(str(tmp_path / "b" / "run" / "trainable.safetensors"))
    for name in start:  # projector, blank and adapters untouched
        assert torch.equal(start[name], after[name]), name
    head = {name: tensor for name, tensor in after.items() if name.startswith("ctc_head.")}
    assert set(head) >= {"ctc_head.blank", "ctc_head.window.fc1.weight", "ctc_head.window.fc2.weight"}
    # it started as the projector and its blank, and CTC training moved it away from them
    assert not torch.equal(head["ctc_head.window.fc1.weight"], start["projector.fc1.weight"])
    assert not torch.equal(head["ctc_head.blank"], start["ctc_blank"])
    assert torch.allclose(head["ctc_head.window.fc1.weight"], start["projector.fc1.weight"], atol=0.05)
    logged = (tmp_path / "b" / "run" / "log.jsonl").read_text()
    assert '"ctc"' in logged and '"lm"' not in logged  # CTC alone: no LLM pass


def test_a_model_asking_for_a_head_its_checkpoint_lacks_is_refused(tmp_path):
    from speechstream.config import load_model_config
    from speechstream.errors import InputError
    from speechstream.model import build_model
    from speechstream.train import load_train_config, train

    recipe = _tiny_recipe(tmp_path, steps=1)
    train(load_train_config(str(recipe), []), progress=False)
    config = dataclasses.replace(load_model_config(tmp_path / "model.yaml"), ctc_hop=2,
                                 checkpoint="run/trainable.safetensors")
    with pytest.raises(InputError, match="fine CTC head"):
        build_model(config, tmp_path)


def test_joint_decoding_scores_the_fine_heads_windows_in_any_buffer_sizes(tiny_model):
    from speechstream.config import DecodingConfig
    from tests.helpers import decoded_session, fine_head_model, noise

    model = fine_head_model(tiny_model)
    audio = noise(7, 21000)
    decoding = DecodingConfig(chunk_ms=320, k=2, max_tokens_per_chunk=6, max_tail_tokens=20, ctc_weight=0.5)
    whole = decoded_session(model, decoding, audio, len(audio))
    pieces = decoded_session(model, decoding, audio, 1111)
    frames = sum(stats.encoder_frames for stats in whole.stats)
    stack = model.config.projector.stack
    assert whole.joint.scorer.frames == -(-frames // 2) > -(-frames // stack)  # finer than the speech tokens
    assert pieces.target_ids == whole.target_ids and pieces.joint.scorer.frames == whole.joint.scorer.frames
    np.testing.assert_allclose(pieces.joint.scorer.lp, whole.joint.scorer.lp, atol=1e-6)
    coarse = decoded_session(tiny_model, decoding, audio, len(audio))
    assert coarse.joint.scorer.frames == -(-frames // stack)


def test_a_config_with_a_hop_outside_the_stack_is_a_one_line_input_error(tmp_path):
    import yaml

    from speechstream.config import load_model_config
    from speechstream.errors import InputError

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"projector": {"stack": 4}, "ctc_hop": 5}))
    with pytest.raises(InputError, match="ctc_hop must be 0 or 1..4"):
        load_model_config(path)
    path.write_text(yaml.safe_dump({"projector": {"stack": 4}, "ctc_hop": 2}))
    assert load_model_config(path).ctc_hop == 2
