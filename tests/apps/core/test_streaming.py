"""Downloads stream under ASGI: Django reads a sync iterator whole into memory there before the
first byte goes out (a 2 GB checkpoint tar would), so the views hand it an async one."""
import asyncio

import pytest

from apps.core.streaming import file_response, streaming


def first_chunk_then_made(response, made) -> tuple[bytes, list]:
    async def first():
        return await anext(aiter(response.streaming_content))

    return asyncio.run(first()), list(made)


def test_a_download_makes_its_chunks_one_at_a_time():
    made = []

    def chunks():
        for i in range(1000):
            made.append(i)
            yield b"%d," % i

    response = streaming(chunks(), content_type="text/csv")

    assert response.is_async
    assert first_chunk_then_made(response, made) == (b"0,", [0]), "the rest is not made yet"


@pytest.mark.django_db  # response.close() sends request_finished, which closes this thread's old connections
def test_a_file_download_reads_block_by_block_and_keeps_its_headers(tmp_path):
    path = tmp_path / "export.jsonl"
    path.write_bytes(b"x" * (3 * 65536))
    file = path.open("rb")

    response = file_response(file, as_attachment=True, filename="export.jsonl")

    assert response.is_async and response["Content-Length"] == str(3 * 65536)
    assert response["Content-Disposition"] == 'attachment; filename="export.jsonl"'
    chunk, _ = first_chunk_then_made(response, [])
    assert len(chunk) < 3 * 65536 and file.tell() == len(chunk), "one block read, not the file"
    response.close()
    assert file.closed
