"""PackedArrayField.pack: Python lists go through array.array (the write path's fast way), anything
else through numpy; both give the same bytes and refuse the same values, naming the problem."""
import numpy as np
import pytest

from apps.buffer.models import Experience as ExperienceRow


def field(name):
    return ExperienceRow._meta.get_field(name)


def by_numpy(name, value):
    return np.asarray(value).astype(field(name).dtype).tobytes()


@pytest.mark.parametrize("name, value", [
    ("response_ids", [3, 4, 5]),
    ("response_ids", [2**31 - 1, -(2**31)]),
    ("response_ids", [np.int64(7), 8]),
    ("response_ids", [True, False]),
    ("action_mask", [1, 0, 255]),
    ("action_mask", [True, False]),
    ("logprobs", [-0.25, -1.5, 0, -1e-9]),
    ("logprobs", [np.float32(-0.5), -2]),
])
def test_a_list_packs_as_numpy_packs_it(name, value):
    assert field(name)._typecode  # the fast path is taken on this machine
    assert field(name).pack(value) == by_numpy(name, value)
    assert field(name).pack(np.asarray(value)) == by_numpy(name, value)


def test_empty_none_and_bytes():
    assert field("response_ids").pack([]) == b""
    assert field("response_ids").pack(None) is None
    assert field("response_ids").pack(b"\x01\x00\x00\x00") == b"\x01\x00\x00\x00"


@pytest.mark.parametrize("name, value, error", [
    ("response_ids", [1, 2**31], "outside"),
    ("response_ids", [-(2**31) - 1], "outside"),
    ("action_mask", [256], "outside"),
    ("action_mask", [-1], "outside"),
    ("response_ids", [1, 0.5], "expected integers"),
    ("response_ids", [np.float32(1.5)], "expected integers"),
    ("response_ids", [[1, 2], [3, 4]], "1-D"),
])
def test_a_bad_list_is_refused_naming_the_field(name, value, error):
    with pytest.raises(ValueError, match=f"{name}: .*{error}"):
        field(name).pack(value)
    with pytest.raises(ValueError, match=error):  # the same as an array
        field(name).pack(np.asarray(value))
