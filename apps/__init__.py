"""The Gradio apps: the demo (demo.py) and the rating page (rating.py)."""
from __future__ import annotations

import errno
import socket

# an address of a kind this machine has none of (::1 without IPv6): no obstacle where another binds
NOT_HERE = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)


def check_port(host: str, port: int) -> None:
    """ValueError (the CLI's one-line error, exit 2) where the server could not listen on
    host:port, e.g. another server has it: said before any work, with the flag that fixes it.
    Every address the host resolves to is tried (e.g. localhost: 127.0.0.1 and ::1): the server
    may listen on any of them."""
    if not 0 <= port <= 65535:  # getaddrinfo would take it, and bind() raise OverflowError
        raise ValueError(f"--port {port}: a port is a number in 0..65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: {e.strerror}") from None
    addresses = list(dict.fromkeys((family, addr) for family, _, _, _, addr in infos))
    failed = [(addr, e) for family, addr in addresses if (e := bind_error(family, addr)) is not None]
    if len(failed) < len(addresses):
        failed = [(addr, e) for addr, e in failed if e.errno not in NOT_HERE]
    if failed:
        addr, e = failed[0]
        at = f" at {addr[0]}" if len(addresses) > 1 else ""
        raise ValueError(f"cannot listen on {host}:{port}{at} ({e.strerror}); another server may have it: "
                         "choose another --port")


def bind_error(family, addr) -> OSError | None:
    """The error binding a listening socket to addr raises, or None where it binds."""
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no obstacle
            s.bind(addr)
    except OSError as e:
        return e
    return None
