"""How many processes on how many machines: the default count, what each device allows, and what
several machines need (the main address, the rendezvous, this machine's own name). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from mpslaunch.machine import Machine
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import Profile, Settings

# Above cores, CPU processes only slow each other down; far above, they exhaust memory.
CPU_PROCESSES_PER_CORE = 4


def default_processes(device: str, machine: Machine) -> int:
    """Processes per machine when neither flag nor profile says: one per visible GPU on cuda
    (as `accelerate launch` does without a config), one on mps and cpu."""
    return max(1, len(machine.cuda_devices)) if device == "cuda" else 1


def check_processes(settings: Profile, device: str, machine: Machine) -> None:
    problem = processes_problem(settings, device, machine)
    if problem:
        raise MpslaunchError(problem)


def processes_problem(settings: Profile, device: str, machine: Machine) -> str | None:
    """Why this many processes and machines cannot run on this device here, or None; the
    message names the number of processes and where it came from (Settings.named)."""
    asked = settings.named("num_processes")
    if device == "mps" and (settings.processes > 1 or settings.num_machines > 1):
        # gloo and nccl do not work with mps tensors (docs/mps-facts.md: Training on a Mac).
        asked = (
            f"{settings.processes} processes ({asked})"
            if settings.processes > 1
            else f"{settings.num_machines} machines ({settings.named('num_machines')})"
        )
        return (
            f"{asked} cannot train on mps: only one process can use a Mac's GPU, and the "
            "distributed backends (gloo, nccl) do not work with mps tensors; run one mps process "
            f"(--num_processes 1), or use --cpu --num_processes {max(settings.processes, 2)} "
            "for several CPU processes, or a machine with several NVIDIA GPUs"
        )
    most_cpu_processes = most_processes("cpu", machine)
    if device == "cpu" and settings.processes > most_cpu_processes:
        return (
            f"{settings.processes} CPU processes ({asked}) on {machine.cpu_count} cores "
            f"would thrash the machine (each process holds a model copy); use at most "
            f"{most_cpu_processes}, usually no more than {machine.cpu_count}"
        )
    gpus = len(machine.cuda_devices)
    if device == "cuda" and settings.processes > gpus:
        return (
            f"{asked} runs one process per GPU, but "
            f"{gpus} NVIDIA GPU{'s are' if gpus != 1 else ' is'} visible; use --num_processes "
            f"{gpus} or fewer"
        )
    return None


def most_processes(device: str, machine: Machine) -> int:
    """The most processes per machine this device allows here: one on mps, one per visible GPU on
    cuda, CPU_PROCESSES_PER_CORE per core on cpu."""
    if device == "mps":
        return 1
    if device == "cuda":
        return len(machine.cuda_devices)
    return CPU_PROCESSES_PER_CORE * machine.cpu_count


# ---------------------------------------------------------------- several machines


def several_machines_settings(settings: Settings) -> Settings:
    """The settings with main_process_ip in one spelling (`[::1]` is ::1); what several machines
    cannot run is refused here, before anything is probed or started."""
    if settings.num_machines < 2:
        return settings
    if settings.main_process_ip:
        from mpslaunch.machine import address_and_port  # several machines only, as each below

        address, port = address_and_port(settings.main_process_ip)
        if port is not None:
            raise MpslaunchError(
                f"{settings.named('main_process_ip')} has a port in it; give the address alone "
                f"({address}) and the port with --main_process_port {port}"
            )
        settings = settings.replace(main_process_ip=address)
    if settings.max_restarts and settings.rdzv_backend == "static":
        raise MpslaunchError(
            f"{settings.named('max_restarts')} on several machines "
            "needs --rdzv_backend c10d: after a restart, a static rendezvous sends the restarted "
            "ranks to the old gloo addresses, and machine 0 waits forever; give every machine "
            "--rdzv_backend c10d, or --max_restarts 0"
        )
    return settings


def own_name_problem(
    settings: Profile, device: str, machine: Machine, environ: Mapping[str, str]
) -> str | None:
    """Why gloo cannot connect the machines: this machine's host name stands for the loopback
    only (as many /etc/hosts files have it), so its ranks would give the others 127.0.0.1 to
    connect to, and every machine would wait forever. None when unchecked (not probed), when
    the machines are on this host, or when GLOO_SOCKET_IFNAME names the interface to use."""
    if settings.num_machines < 2 or machine.own_name is None or device != "cpu":
        return None
    from mpslaunch.machine import is_loopback

    if (
        "GLOO_SOCKET_IFNAME" in environ
        or is_loopback(settings.main_process_ip or "")
        or settings.main_process_ip == "localhost"
    ):
        return None
    name, addresses = machine.own_name
    if not addresses or not all(is_loopback(address) for address in addresses):
        return None
    return (
        f"this machine's name {name} stands for {', '.join(addresses)} only, so gloo would "
        "give the other machines a loopback address to connect to and every machine would "
        "wait forever; set GLOO_SOCKET_IFNAME to the network interface that reaches the other "
        f"machines (such as GLOO_SOCKET_IFNAME=eth0), or map {name} to this machine's own "
        "address in /etc/hosts"
    )


def checks_main_address(settings: Profile) -> bool:
    """Machine 0 of several serves the rendezvous on the main address, so that address must be
    one of its own; unless the user says it reaches machine 0 through NAT."""
    return (
        settings.num_machines > 1
        and settings.machine_rank == 0
        and not settings.main_process_ip_via_nat
    )


def main_address_problem(settings: Profile, machine: Machine) -> str | None:
    """Why machine 0 cannot serve on main_process_ip, or None. Unchecked (None) when the
    machine's addresses were not probed."""
    address = settings.main_process_ip
    if not checks_main_address(settings) or machine.addresses is None or address is None:
        return None
    from mpslaunch.machine import plain_address  # several machines only

    literal = plain_address(address)
    if literal:
        stands_for: tuple[str, ...] = (literal,)
    elif machine.name_lookup and machine.name_lookup[0] == address:
        stands_for = machine.name_lookup[1]
    else:
        return None  # a host name that was not looked up
    if set(stands_for) & set(machine.addresses):
        return None
    what = (
        "does not resolve to any address" if not stands_for else "is not an address of this machine"
    )
    own = [ip for ip in machine.addresses if not ip.startswith(("127.", "::1", "fe80:"))]
    return (
        f"{settings.named('main_process_ip')} {what}, and machine 0 serves the rendezvous there; give "
        f"one of this machine's addresses ({', '.join(own[:5]) or 'none but the loopback'}), "
        "give this machine its own --machine_rank if it is not machine 0, or add "
        "--main_process_ip_via_nat if that address reaches this machine through NAT"
    )
