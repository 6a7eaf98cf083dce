"""The Gradio apps: the demo (demo.py) and the rating page (rating.py)."""
from __future__ import annotations

import socket


def check_port(host: str, port: int) -> None:
    """ValueError (the CLI's one-line error, exit 2) where the server could not listen on
    host:port, e.g. another server has it: said before any work, with the flag that fixes it."""
    if not 0 <= port <= 65535:  # getaddrinfo would take it, and bind() raise OverflowError
        raise ValueError(f"--port {port}: a port is a number in 0..65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: {e.strerror}") from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no obstacle
        try:
            s.bind(addr)
        except OSError as e:
            raise ValueError(f"cannot listen on {host}:{port} ({e.strerror}); another server may have it: "
                             "choose another --port") from None
