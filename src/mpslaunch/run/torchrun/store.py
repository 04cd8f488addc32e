"""The rendezvous store listens on the address the run is for, not on every interface.

torch's TCPStore server listens on every interface whatever host name it is given (torchrun's
static rendezvous with --master-addr 127.0.0.1 and its --standalone c10d store both show up as
`*:PORT` in `ss -ltn`), so a single-machine run would be reachable from the network. Instead we
bind a socket ourselves and start the store on it with `master_listen_fd`, as a multi-tenant
server: torch's static rendezvous asks for a multi-tenant TCPStore on the same port in the same
process, and TCPStore hands it this server instead of opening another. The ranks connect to it
as clients (TORCHELASTIC_USE_AGENT_STORE).

- One machine: 127.0.0.1; port 0 means the kernel picks a free one, with no race between
  choosing it and binding it. gloo's and nccl's own sockets are kept on the loopback by
  GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (torchrun_args.launcher_environment).
- Several machines, static rendezvous, machine 0: --main_process_ip, when it is an address of
  this machine; when it is not (a NAT or a name that resolves elsewhere), torch's own store
  (every interface) is used, as torchrun would. c10d is left to torch: its agent also opens a
  second store, for the ranks, on a free port of every interface.
"""

from __future__ import annotations

import datetime
import errno
import socket
from contextlib import contextmanager
from typing import Iterator

from mpslaunch.errors import MpslaunchError

STORE_TIMEOUT = datetime.timedelta(seconds=900)  # torchrun's default rendezvous timeout


class NotThisMachine(Exception):
    """The address is not one of this machine's: nothing can listen on it here."""


@contextmanager
def store_on(address: str, port: int) -> Iterator[int]:
    """Serve the rendezvous store on address:port only (port 0: a free port); yield the port."""
    from torch.distributed import TCPStore  # the torchrun path only

    listener = _listen(address, port)
    chosen = listener.getsockname()[1]
    # The store owns the descriptor from here on and closes it: detach it from Python's socket.
    descriptor = listener.detach()
    try:
        store = TCPStore(address, chosen, None, True, STORE_TIMEOUT, wait_for_workers=False,
                         multi_tenant=True, master_listen_fd=descriptor)
    except (RuntimeError, ValueError) as error:
        socket.close(descriptor)
        raise MpslaunchError(f"cannot start the rendezvous store on {address}:{chosen}: "
                             f"{_first_line(error)}") from None
    try:
        yield chosen
    finally:
        del store


@contextmanager
def machine0_store(address: str, port: int) -> Iterator[int]:
    """store_on(address, port), or torch's own store when the address is not this machine's."""
    try:
        context = store_on(address, port)
        chosen = context.__enter__()
    except NotThisMachine:
        yield port
        return
    try:
        yield chosen
    finally:
        context.__exit__(None, None, None)


def _listen(address: str, port: int) -> socket.socket:
    try:
        family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise MpslaunchError(f"cannot resolve {address!r} for the rendezvous: {error.strerror}; "
                             "check --main_process_ip") from None
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(where)
        listener.listen(socket.SOMAXCONN)
    except OSError as error:
        listener.close()
        if error.errno == errno.EADDRNOTAVAIL:
            raise NotThisMachine(address) from None
        raise MpslaunchError(
            f"cannot listen on {address}:{port} for the rendezvous ({error.strerror}); "
            "use --main_process_port 0 to pick a free port, or another port") from None
    return listener


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
