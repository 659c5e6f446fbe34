"""Token arrays stored as packed little-endian bytes: a 1,000-token response is 4 KB, not a JSON list."""
import array
from collections.abc import Sequence
from functools import cached_property

import numpy as np
from django.db import models


class PackedArrayField(models.BinaryField):
    """A 1-D numeric array stored as raw bytes. Reads back as a Python list (None stays None)."""

    def __init__(self, *args, dtype: str = "<i4", **kwargs):
        self.dtype = np.dtype(dtype)
        kwargs.setdefault("null", True)
        kwargs.setdefault("blank", True)
        kwargs.setdefault("editable", False)
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        kwargs["dtype"] = self.dtype.str
        for key in ("null", "blank", "editable"):
            kwargs.pop(key, None)
        return name, path, args, kwargs

    def unpack(self, value):
        if value is None:
            return None
        return np.frombuffer(bytes(value), dtype=self.dtype).tolist()

    def pack(self, value) -> bytes | None:
        """The array as bytes. A Python list (what the engines give) goes through array.array,
        whose constructor also refuses floats for ints and values out of range; numpy, for
        anything else, says what is wrong. A 128-row write's four columns: 3.5 ms this way, 10.9
        through one numpy conversion of each whole column (bench/README, issue #29)."""
        if value is None:
            return None
        if isinstance(value, (bytes, memoryview)):
            return bytes(value)
        if self._typecode and isinstance(value, list):
            try:
                return array.array(self._typecode, value).tobytes()
            except (TypeError, OverflowError):
                pass  # a float among ints, a value out of range, a nested list: numpy's message below
        values = np.asarray(value)
        if values.size == 0:
            return b""
        if values.ndim != 1:
            raise ValueError(f"{self.name}: expected a 1-D array, got shape {values.shape}")
        return self._checked(values).tobytes()

    @cached_property
    def _typecode(self) -> str | None:
        """array.array's code whose C type is this dtype, byte order included (numpy reads the
        codes as the same C types); None where none is (a big-endian machine)."""
        return next((code for code in "bBhHiIlLqQfd" if np.dtype(code) == self.dtype), None)

    def unpack_many(self, values: Sequence) -> list[np.ndarray | None]:
        """A whole column read back as numpy arrays, views into one buffer (None stays None).
        `unpack`'s Python lists of a 256-row sample (4 arrays of 512 tokens) took 14 ms, longer
        than the statement that read them; views take under 1 ms, and the trainer copies them into
        its tensors without a list in between."""
        flat = np.frombuffer(bytearray(b"".join(v for v in values if v is not None)), dtype=self.dtype)
        arrays, offset = [], 0
        for value in values:
            if value is None:
                arrays.append(None)
                continue
            end = offset + len(value) // self.dtype.itemsize
            arrays.append(flat[offset:end])
            offset = end
        return arrays

    def _checked(self, array: np.ndarray) -> np.ndarray:
        if array.size == 0:
            return array.astype(self.dtype)
        if self.dtype.kind in "iu":
            if not (np.issubdtype(array.dtype, np.integer) or array.dtype == np.bool_):  # a list of bools packs too
                raise ValueError(f"{self.name}: expected integers, got {array.dtype}")
            bounds = np.iinfo(self.dtype)
            if array.min() < bounds.min or array.max() > bounds.max:
                raise ValueError(f"{self.name}: values outside [{bounds.min}, {bounds.max}]")
        return array.astype(self.dtype)

    def from_db_value(self, value, expression, connection):
        return self.unpack(value)

    def to_python(self, value):
        if isinstance(value, (bytes, memoryview)):
            return self.unpack(value)
        return value

    def get_db_prep_value(self, value, connection, prepared=False):
        return super().get_db_prep_value(self.pack(value), connection, prepared)

    def value_to_string(self, obj):
        return str(self.value_from_object(obj))
