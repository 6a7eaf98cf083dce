"""Serving many users at once: the demo page's logic (live.py: photos read, faces offered, live
decoding), the decode service every page and API request decodes through (service.py: a bounded
queue, a decode worker per core, continuous batching), the HTTP API beside the page (webapi.py),
and the load benchmark of a running server (bench.py, `sr-blockwise bench-serve`)."""
