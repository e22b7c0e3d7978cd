"""The CTranslate2 model.bin reader: round trips, every dtype, aliases, and clear errors on damaged files."""

import struct

import numpy as np
import pytest

from speechstream.errors import SpeechstreamError
from speechstream.weights.ctranslate2 import CT2FormatError, read_model_bin, read_variables
from tests.weights.ct2_helpers import Bfloat16, write_ct2


def sample_variables() -> dict:
    rng = np.random.default_rng(1)
    return {
        "encoder/layer_0/self_attention/linear_0/weight": rng.normal(size=(6, 4)).astype(np.float32),
        "encoder/layer_0/ffn/linear_0/bias": rng.normal(size=5).astype(np.float16),
        "decoder/q8/weight": rng.integers(-128, 128, size=(3, 2)).astype(np.int8),
        "decoder/q16/weight": rng.integers(-3000, 3000, size=(2, 2, 2)).astype(np.int16),
        "decoder/ids": np.arange(7, dtype=np.int32) - 3,
        "encoder/num_heads": np.array(6, dtype=np.int16),
        "decoder/activation": np.array(3, dtype=np.int8),
        "decoder/empty": np.zeros((0, 4), dtype=np.float32),
    }


def test_round_trip_names_shapes_dtypes_values():
    variables = sample_variables()
    model = read_model_bin(write_ct2(variables, {"decoder/tied": "decoder/ids"}, spec_name="TestSpec", revision=9))
    assert (model.binary_version, model.spec_name, model.spec_revision) == (6, "TestSpec", 9)
    assert model.aliases == {"decoder/tied": "decoder/ids"}
    assert set(model.variables) == set(variables) | {"decoder/tied"}
    for name, expected in variables.items():
        got = model.variables[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected)
    assert model.variables["decoder/tied"] is model.variables["decoder/ids"]
    assert int(model.variables["encoder/num_heads"]) == 6


def test_bfloat16_is_widened_exactly_to_float32():
    values = np.array([[1.0, -2.5, 0.15625], [3.0e38, -1.0e-30, 0.0]], dtype=np.float32)
    values = (values.view(np.uint32) & 0xFFFF0000).view(np.float32)  # exactly representable in bfloat16
    got = read_variables(write_ct2({"w": Bfloat16(values)}))["w"]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, values)


def test_reads_from_a_path(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(write_ct2(sample_variables()))
    assert set(read_variables(path)) == set(sample_variables())


@pytest.mark.parametrize("version", [1, 2, 3, 6])
def test_optional_header_fields_follow_the_version(version):
    data = write_ct2({"x": np.ones(2, np.float32)}, {"y": "x"} if version >= 3 else None, version=version)
    model = read_model_bin(data)
    assert model.binary_version == version
    assert ("y" in model.variables) == (version >= 3)


@pytest.mark.parametrize("keep", [0, 3, 6, 20, 60, 200, -40, -1])
def test_truncated_file_raises_a_clear_error(keep):
    data = write_ct2(sample_variables(), {"decoder/tied": "decoder/ids"})
    with pytest.raises(CT2FormatError, match="truncated CTranslate2 model file") as caught:
        read_model_bin(data[:keep] if keep >= 0 else data[:keep], name="tiny.bin")
    assert isinstance(caught.value, SpeechstreamError) and "tiny.bin" in str(caught.value)


def test_trailing_bytes_are_refused():
    with pytest.raises(CT2FormatError, match="trailing"):
        read_model_bin(write_ct2(sample_variables()) + b"\0\0")


def test_unknown_version_is_refused():
    with pytest.raises(CT2FormatError, match="binary version 99"):
        read_model_bin(struct.pack("<I", 99) + b"\0" * 16)


def test_unknown_dtype_and_wrong_byte_count_are_refused():
    good = write_ct2({"x": np.ones(2, np.float32)}, version=4)
    dtype_at = good.index(b"x\0") + 2 + 1 + 4  # name, rank, one dimension
    bad_dtype = good[:dtype_at] + bytes([9]) + good[dtype_at + 1:]
    with pytest.raises(CT2FormatError, match="unknown dtype id 9"):
        read_model_bin(bad_dtype)
    bad_count = good[: dtype_at + 1] + struct.pack("<I", 7) + good[dtype_at + 5:]
    with pytest.raises(CT2FormatError, match="should take 8 bytes"):
        read_model_bin(bad_count)


def test_alias_to_a_missing_variable_is_refused():
    with pytest.raises(CT2FormatError, match="unknown variable"):
        read_model_bin(write_ct2({"x": np.ones(1, np.float32)}, {"y": "nope"}))


@pytest.mark.parametrize("version", [1, 2, 3])
def test_files_before_version_4_give_item_sizes_and_value_counts(version):
    """Binary versions 1 to 3 give each variable's item size (4, 2, 1) and value count, not a dtype id and bytes."""
    old_dtypes = (np.float32, np.int16, np.int8)  # the only ones those versions know
    variables = {name: value for name, value in sample_variables().items() if value.dtype in old_dtypes}
    model = read_model_bin(write_ct2(variables, version=version))
    assert set(model.variables) == set(variables)
    for name, expected in variables.items():
        got = model.variables[name]
        assert got.dtype == expected.dtype and got.shape == expected.shape, name
        np.testing.assert_array_equal(got, expected)


def test_an_unknown_item_size_before_version_4_is_refused():
    good = write_ct2({"x": np.ones(2, np.float32)}, version=3)
    size_at = good.index(b"x\0") + 2 + 1 + 4  # name, rank, one dimension
    with pytest.raises(CT2FormatError, match="x has unknown item size 8"):
        read_model_bin(good[:size_at] + bytes([8]) + good[size_at + 1:])
