import csv
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from apps.tasksets.importers import FieldMapping


class TasksetFiles:
    """Writes taskset files into a test's tmp_path and returns their paths."""

    def __init__(self, directory):
        self.directory = directory

    def raw(self, content: bytes, name: str):
        path = self.directory / name
        path.write_bytes(content)
        return path

    def jsonl(self, rows, name="tasks.jsonl"):
        """Rows are dicts, or str lines written as they are."""
        path = self.directory / name
        with open(path, "w", encoding="utf-8") as file:
            for row in rows:
                file.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
        return path

    def csv(self, header, rows, name="tasks.csv"):
        path = self.directory / name
        with open(path, "w", newline="", encoding="utf-8") as file:
            writer = csv.writer(file)
            writer.writerow(header)
            writer.writerows(rows)
        return path

    def parquet(self, columns: dict, name="tasks.parquet", row_group_size=None):
        path = self.directory / name
        pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
        return path


@pytest.fixture
def files(tmp_path):
    return TasksetFiles(tmp_path)


@pytest.fixture
def mapping():
    return FieldMapping(prompt="question", answer="answer")
