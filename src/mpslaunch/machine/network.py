"""This machine on the network: its interface addresses, what a host name stands for, and how
an address and a port are written. Nothing is sent anywhere: interfaces are listed, and names
are looked up as the system resolves them. psutil and socket are imported only when used.
"""

from __future__ import annotations

import sys

from mpslaunch.machine.facts import Machine


def loopback_interface(platform: str = sys.platform) -> str:
    """The loopback network interface's name, as GLOO_SOCKET_IFNAME wants it."""
    return "lo0" if platform == "darwin" else "lo"


def with_addresses(machine: Machine, main_address: str) -> Machine:
    """`machine` with its interface addresses (unless already known) and, when `main_address`
    is a host name, what it resolves to. Nothing is sent anywhere: the interfaces are listed,
    and a name is looked up as the system resolves it."""
    known = machine.addresses if machine.addresses is not None else interface_addresses()
    lookup = (
        None if plain_address(main_address) else (main_address, resolved_addresses(main_address))
    )
    return machine._replace(addresses=known, name_lookup=lookup)


def with_own_name(machine: Machine) -> Machine:
    """`machine` with its host name and what that name resolves to here (gloo advertises it)."""
    import socket

    name = socket.gethostname()
    return machine._replace(own_name=(name, resolved_addresses(name)))


def interface_addresses() -> tuple[str, ...]:
    """Every IPv4 and IPv6 address of this machine's network interfaces (loopback included)."""
    import socket

    import psutil  # here only: a several-machine launch is the one that needs it

    found = {
        plain_address(entry.address)
        for entries in psutil.net_if_addrs().values()
        for entry in entries
        if entry.family in (socket.AF_INET, socket.AF_INET6)
    }
    return tuple(sorted(address for address in found if address is not None))


def resolved_addresses(name: str) -> tuple[str, ...]:
    """The addresses a host name stands for; () when it resolves to nothing."""
    import socket

    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return ()
    plain = {plain_address(str(entry[4][0])) for entry in found}
    return tuple(sorted(address for address in plain if address is not None))


def address_and_port(text: str) -> tuple[str, str | None]:
    """What a user typed for an address, split: `[::1]` and `::1` are ('::1', None);
    `10.0.0.1:29500`, `[::1]:29500` and `host:29500` carry a port ('29500')."""
    if text.startswith("["):
        inside, _, rest = text[1:].partition("]")
        return inside, rest[1:] if rest.startswith(":") else (rest or None)
    if text.count(":") == 1:  # two or more: an IPv6 address without brackets
        host, _, port = text.partition(":")
        return host, port
    return text, None


def endpoint(address: str, port: int | str) -> str:
    """address:port as torch parses it and as users read it: an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def is_loopback(address: str) -> bool:
    import ipaddress

    literal = plain_address(address)
    return literal is not None and ipaddress.ip_address(literal).is_loopback


def plain_address(text: str) -> str | None:
    """An IP address in one spelling (IPv6 compressed, without its zone: fe80::1%eth0), or None
    when `text` is not an address (a host name)."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(text.split("%", 1)[0]))
    except ValueError:
        return None
