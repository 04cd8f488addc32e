"""The rendezvous store listens on the address the run is for, not on every interface.

torch's TCPStore listens on every interface whatever host it is given, so we bind the socket
ourselves and hand it to the store (torch_internals.serve_store): 127.0.0.1 for one machine; machine 0's
--main_process_ip (checked by the plan to be one of its addresses), or every interface with
--main_process_ip_via_nat. On torch 2.5 the store that takes a socket aborts at a machine whose
address has no name, so other machines' store is torch's own there, on every interface. The
other machines' launchers wait on this store (gate.py).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from mpslaunch.machine import endpoint
from mpslaunch.output import MpslaunchError, error_line
from mpslaunch.run.torch_internals import bound_store, serve_store

EVERY_INTERFACE = ""  # for store_on's `listen`: what torchrun's own store does


@contextmanager
def store_on(address: str, port: int, listen: str | None = None) -> Iterator[tuple[int, object]]:
    """Serve the rendezvous store for address:port, listening on `listen` (default: the address
    itself; port 0: a free port); yield the port and the store. On torch 2.5 a store that other
    machines reach listens on every interface (torch_internals.bound_store)."""
    import torch

    listener = _listen(address if listen is None else listen, port)
    chosen = listener.getsockname()[1]
    # Its own client connects here: on every interface, through the loopback (a NAT address
    # may not lead back to this machine from inside).
    own = address if listen is None else "127.0.0.1"
    # The store owns what it is given (it closes it, also when it fails): a copy of ours.
    given = os.dup(listener.fileno()) if bound_store(torch.__version__, address) else None
    try:
        if given is None:
            listener.close()  # the port is free and checked: torch's store listens on it itself
        store = serve_store(own, chosen, given)
    except (RuntimeError, ValueError) as error:
        raise MpslaunchError(
            f"cannot start the rendezvous store on {endpoint(address, chosen)}: {error_line(error)}"
        ) from None
    finally:
        listener.close()
    try:
        yield chosen, store
    finally:
        del store


def _listen(address: str, port: int) -> socket.socket:
    family, where = _bind_target(address, port)
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if address == EVERY_INTERFACE and family == socket.AF_INET6:
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too
    try:
        listener.bind(where)
        listener.listen(socket.SOMAXCONN)
    except OSError as error:
        listener.close()
        if error.errno == errno.EADDRNOTAVAIL:
            raise MpslaunchError(
                f"cannot listen on {address}: it is not an address of this "
                "machine; give one of its own as --main_process_ip, or add "
                "--main_process_ip_via_nat"
            ) from None
        raise MpslaunchError(
            f"cannot listen on {endpoint(address, port)} for the rendezvous ({error.strerror}); "
            "use --main_process_port 0 to pick a free port, or another port"
        ) from None
    return listener


def _bind_target(address: str, port: int) -> tuple[int, tuple]:
    if address == EVERY_INTERFACE:
        return (
            (socket.AF_INET6, ("::", port))
            if socket.has_dualstack_ipv6()
            else (socket.AF_INET, ("0.0.0.0", port))
        )
    try:
        family, _, _, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise MpslaunchError(
            f"cannot resolve {address!r} for the rendezvous: {error.strerror}; "
            "check --main_process_ip"
        ) from None
    return family, where
