"""Downloads that stream under ASGI (daphne): big files and long exports, never whole in memory.

Django serves a StreamingHttpResponse over a plain (sync) iterator under ASGI by reading it whole
into a list first (django.http.response, "must consume synchronous iterators"): a 2 GB checkpoint
tar, export file or metrics download would sit in the server's memory before its first byte went
out. `one_at_a_time` hands the chunks over as they are made instead.
"""
from asgiref.sync import sync_to_async
from django.http import FileResponse, StreamingHttpResponse


async def one_at_a_time(chunks):
    """An async iterator over `chunks`, each made on the thread that serves the sync views (with its
    database connection), so a generator that reads the database keeps working."""
    chunks, done = iter(chunks), object()
    while (chunk := await sync_to_async(next)(chunks, done)) is not done:
        yield chunk


def streaming(chunks, **kwargs) -> StreamingHttpResponse:
    return StreamingHttpResponse(one_at_a_time(chunks), **kwargs)


def file_response(file, **kwargs) -> FileResponse:
    """FileResponse (its headers: length, type, attachment name), streamed chunk by chunk."""
    response = FileResponse(file, **kwargs)
    response.streaming_content = one_at_a_time(response.streaming_content)
    return response
