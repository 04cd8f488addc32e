"""One machine: the rendezvous store listens on 127.0.0.1 only.

torch's TCPStore server listens on every interface whatever host name it is given (torchrun's
static rendezvous with --master-addr 127.0.0.1 and its --standalone c10d store both show up as
`*:PORT` in `ss -ltn`), so a single-machine run would be reachable from the network. Instead we
bind a socket to 127.0.0.1 ourselves (port 0: the kernel picks a free one, with no race between
choosing and binding) and start the store on it with `master_listen_fd`, as a multi-tenant
server. torch's static rendezvous asks for a multi-tenant TCPStore on the same port in the same
process, and TCPStore hands it this server instead of opening another. The ranks connect to it
as clients (TORCHELASTIC_USE_AGENT_STORE). gloo's and nccl's own sockets are kept on the loopback
by GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME (see torchrun_args.launcher_environment).
"""

from __future__ import annotations

import datetime
import socket
from contextlib import contextmanager
from typing import Iterator

from mpslaunch.errors import MpslaunchError
from mpslaunch.torchrun_args import LOOPBACK

STORE_TIMEOUT = datetime.timedelta(seconds=900)  # torchrun's default rendezvous timeout


@contextmanager
def loopback_store(port: int) -> Iterator[int]:
    """Serve the rendezvous store on 127.0.0.1:port (0: a free port); yield the port."""
    from torch.distributed import TCPStore  # the torchrun path only

    listener = _listen(port)
    chosen = listener.getsockname()[1]
    # The store owns the descriptor from here on and closes it: detach it from Python's socket.
    descriptor = listener.detach()
    try:
        store = TCPStore(LOOPBACK, chosen, None, True, STORE_TIMEOUT, wait_for_workers=False,
                         multi_tenant=True, master_listen_fd=descriptor)
    except (RuntimeError, ValueError) as error:
        socket.close(descriptor)
        raise MpslaunchError(f"cannot start the rendezvous store on {LOOPBACK}:{chosen}: "
                             f"{_first_line(error)}") from None
    try:
        yield chosen
    finally:
        del store


def _listen(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((LOOPBACK, port))
        listener.listen(socket.SOMAXCONN)
    except OSError as error:
        listener.close()
        raise MpslaunchError(
            f"cannot listen on {LOOPBACK}:{port} for the rendezvous ({error.strerror}); "
            "use --main_process_port 0 to pick a free port, or another port") from None
    return listener


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
