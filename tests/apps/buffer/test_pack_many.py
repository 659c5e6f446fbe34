"""PackedArrayField.pack_many, the write path's packing of a whole column, against pack, row by row."""
import numpy as np
import pytest

from apps.buffer.models import Experience as ExperienceRow


def field(name):
    return ExperienceRow._meta.get_field(name)


@pytest.mark.parametrize("name, column", [
    ("response_ids", [[3, 4, 5], None, [], [2**31 - 1, -(2**31)], b"\x01\x00\x00\x00", np.array([7, 8])]),
    ("action_mask", [[1, 0, 1], [], None, [255]]),
    ("logprobs", [[-0.25, -1.5], None, [], [0, -1], [-1e-9]]),
])
def test_a_column_packs_as_its_rows_do(name, column):
    assert field(name).pack_many(column) == [field(name).pack(value) for value in column]


@pytest.mark.parametrize("name, column, error", [
    ("response_ids", [[1, 2], [2**31]], "outside"),
    ("action_mask", [[1], [256]], "outside"),
    ("response_ids", [[1, 2], [0.5]], "expected integers"),
    ("response_ids", [[[1, 2]], [[3, 4]]], "1-D"),
])
def test_a_bad_row_refuses_the_column_as_it_refuses_the_row(name, column, error):
    with pytest.raises(ValueError, match=error):
        field(name).pack_many(column)
    with pytest.raises(ValueError, match=error):
        for value in column:
            field(name).pack(value)
