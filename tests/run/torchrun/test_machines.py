"""Several machines: what a run of several is refused or told before it starts, a launcher too
many, machine 0 lost during the wait, and two hosts for real.

The two hosts are two Linux network namespaces joined by a veth pair (root and `ip netns`
needed; the tests skip with the reason elsewhere). Each namespace gets a unique name, its own
/etc/hosts (`ip netns exec` mounts /etc/netns/<name>/hosts over /etc/hosts), and is deleted
at the end with whatever still runs in it; the traffic never leaves them. The other cases run
on the loopback, as tests/run/torchrun/test_rendezvous.py does.
"""

from __future__ import annotations

import datetime
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from helpers import run_cli, write_script
from mpslaunch.run.torch_internals import bound_store, c10d_ranks_share_the_rendezvous_store
from test_rendezvous import free_port, start, wait_until_machine_0_waits  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="Linux processes and namespaces")

NEVER_RUNS = "open(__file__ + '.ran', 'w')\n"
# A plan for two hosts on a computer whose name stands for the loopback (as here, often) is
# refused unless gloo is told its interface (test_two_hosts_whose_names_stand_for_the_loopback).
IFNAME = {"GLOO_SOCKET_IFNAME": "lo"}

# Waits for <folder>/done, then exits 0: a run that lasts while the test looks at it.
WAITS_FOR_DONE = """
import sys, time
from pathlib import Path
while not (Path(sys.argv[1]) / "done").exists():
    time.sleep(0.05)
"""


def machine_args(rank: int, port: int, machines: int = 2, ip: str = "127.0.0.1") -> list[str]:
    return ["launch", "--cpu", "-q", "--num_machines", str(machines), "--machine_rank", str(rank),
            "--main_process_ip", ip, "--main_process_port", str(port)]


def wait_until_joined(port: int, rank: int, launcher: subprocess.Popen) -> None:
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=30),
                     wait_for_workers=False)
    deadline = time.monotonic() + 90
    while not store.check([f"mpslaunch/joined/{rank}"]):
        assert time.monotonic() < deadline and launcher.poll() is None, f"machine {rank} never joined"
        time.sleep(0.05)


# ---------------------------------------------------------------- refused before anything starts


@pytest.mark.slow
@pytest.mark.parametrize("given, address, port", [
    ("10.0.0.1:29500", "10.0.0.1", "29500"),
    ("[fd00::5]:29501", "fd00::5", "29501"),
    ("node7:29500", "node7", "29500"),
])
def test_a_main_address_with_a_port_in_it_is_refused_with_the_option_to_use(tmp_path, given, address, port):
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    result = run_cli("launch", "--cpu", "--num_machines", "2", "--machine_rank", "1",
                     "--main_process_ip", given, "--dry-run", str(script), env=IFNAME)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        f"mpslaunch: error: --main_process_ip {given} has a port in it; give the address alone "
        f"({address}) and the port with --main_process_port {port}")


@pytest.mark.slow
def test_an_ipv6_main_address_is_taken_with_or_without_brackets_and_shown_with_them(tmp_path):
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    for given in ("::1", "[::1]"):
        result = run_cli("launch", "--cpu", "--num_machines", "2", "--machine_rank", "0",
                         "--main_process_ip", given, "--main_process_port", "29600",
                         "--rdzv_backend", "c10d", "--dry-run", str(script), env=IFNAME)
        assert result.returncode == 0, result.stderr
        assert "--rdzv-endpoint '[::1]:29600'" in result.stdout
        assert "serves the rendezvous store, on [::1]:29600 only" in result.stdout


@pytest.mark.slow
def test_a_machine_0_that_never_comes_at_an_ipv6_address_is_named_in_brackets(tmp_path):
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    port = free_port()
    result = run_cli(*machine_args(1, port, ip="::1"), "--rdzv_timeout", "1", str(script),
                     timeout=90)
    assert result.returncode == 1, result.stderr
    assert f"machine 0 at [::1]:{port} " in result.stderr
    assert f"::1:{port}" not in result.stderr.replace(f"[::1]:{port}", "")


@pytest.mark.slow
def test_max_restarts_on_several_machines_needs_c10d(tmp_path):
    """With a static rendezvous the restarted ranks go to the old gloo addresses: machine 1 exits
    1, machine 0 waits forever (torch does the same). Refused; c10d restarts."""
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    args = ["launch", "--cpu", "--num_machines", "2", "--machine_rank", "1",
            "--main_process_ip", "10.0.0.1", "--max_restarts", "1"]
    result = run_cli(*args, "--dry-run", str(script), env=IFNAME)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "mpslaunch: error: --max_restarts 1 on several machines needs --rdzv_backend c10d: after "
        "a restart, a static rendezvous sends the restarted ranks to the old gloo addresses, and "
        "machine 0 waits forever; give every machine --rdzv_backend c10d, or --max_restarts 0"]
    assert run_cli(*args, "--rdzv_backend", "c10d", "--dry-run", str(script), env=IFNAME).returncode == 0


@pytest.mark.slow
def test_dry_run_with_c10d_names_the_ranks_store_as_this_torch_serves_it(tmp_path):
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    result = run_cli("launch", "--cpu", "--num_machines", "2", "--machine_rank", "0",
                     "--main_process_ip", "127.0.0.1", "--main_process_port", "29602",
                     "--rdzv_backend", "c10d", "--dry-run", str(script))
    assert result.returncode == 0, result.stderr
    assert "serves the rendezvous store, on 127.0.0.1:29602 only" in result.stdout
    release = torch.__version__.split("+")[0]
    if c10d_ranks_share_the_rendezvous_store(release):  # torch 2.5
        assert (f"with c10d, torch {release}'s agent gives the ranks the rendezvous store itself "
                "(nothing else listens for them)") in result.stdout
    else:
        assert ("with c10d, the machine that gets rank 0 at the rendezvous also serves a store "
                "for the ranks (torch's agent, or rank 0 before torch 2.5), on every interface, on "
                "a port torch picks") in result.stdout


@pytest.mark.parametrize("version, address, bound, shared", [
    ("2.4.1", "10.0.0.1", True, False), ("2.5.1+cu124", "10.0.0.1", False, True),
    ("2.5.1", "127.0.0.1", True, True), ("2.5.1", "::1", True, True), ("2.6.0", "10.0.0.1", True, False),
    ("2.14.1", "fd00::5", True, False), ("2.5.0a0+git1234", "10.0.0.1", True, False),
])
def test_where_each_torch_release_serves_the_stores(version, address, bound, shared):
    """torch 2.5's store without libuv aborts at a connection from an address without a name
    (seen on 2.5.1, not on 2.4.1 or 2.6.0), so there a store other machines reach is torch's
    libuv store on every interface; and with c10d its ranks use the rendezvous store itself."""
    assert bound_store(version, address) is bound
    assert c10d_ranks_share_the_rendezvous_store(version) is shared


@pytest.mark.parametrize("own, main, environ, refused", [
    (("node1", ("127.0.1.1",)), "10.0.0.1", {}, True),  # Debian's /etc/hosts
    (("node1", ("127.0.0.1", "::1")), "10.0.0.1", {}, True),
    (("node1", ("127.0.1.1",)), "10.0.0.1", {"GLOO_SOCKET_IFNAME": "eth0"}, False),
    (("node1", ("10.0.0.2",)), "10.0.0.1", {}, False),
    (("node1", ("127.0.1.1",)), "127.0.0.1", {}, False),  # the machines share this host
    (("node1", ()), "10.0.0.1", {}, False),  # unknown: not refused on a guess
])
def test_a_host_name_that_stands_for_the_loopback_only_is_refused_for_gloo(own, main, environ, refused):
    from helpers import MACHINES
    from mpslaunch.output import MpslaunchError
    from mpslaunch.settings import LaunchRequest
    from mpslaunch.plan import resolve
    from mpslaunch.settings import Profile

    machine = MACHINES["linux_cpu"]._replace(own_name=own)
    request = LaunchRequest("train.py", num_machines=2, machine_rank=1, main_process_ip=main)
    if refused:
        with pytest.raises(MpslaunchError, match="this machine's name node1 stands for .* only"):
            resolve(Profile(), request, machine, environ)
    else:
        assert resolve(Profile(), request, machine, environ).settings.num_machines == 2


# ---------------------------------------------------------------- launchers on the loopback


@pytest.mark.slow
def test_a_second_launcher_for_a_taken_machine_rank_is_refused_in_one_line(tmp_path, start):
    """Three launchers on one port for two machines (ranks 0, 1, 1): two run; the extra
    machine 1 says so and exits 2 instead of waiting silently until it is killed."""
    script = write_script(tmp_path, "waits.py", WAITS_FOR_DONE)
    port = free_port()
    machine_0 = start([*machine_args(0, port), str(script), str(tmp_path)])
    wait_until_machine_0_waits(port, machine_0)
    machine_1 = start([*machine_args(1, port), str(script), str(tmp_path)])
    wait_until_joined(port, 1, machine_1)
    extra = start([*machine_args(1, port), str(script), str(tmp_path)])
    try:
        _, stderr = extra.communicate(timeout=60)
    finally:
        (tmp_path / "done").write_text("")
    assert extra.returncode == 2, stderr
    (line,) = stderr.strip().splitlines()
    assert line.startswith("mpslaunch: error: machine rank 1 is taken: another launcher (")
    assert line.endswith(f"joined 127.0.0.1:{port} as machine 1; give each machine its own "
                         "--machine_rank, from 0 to 1")
    for launcher in (machine_0, machine_1):
        _, stderr = launcher.communicate(timeout=90)
        assert launcher.returncode == 0, stderr


@pytest.mark.slow
def test_machine_0_lost_during_the_wait_is_one_line_without_a_cpp_stack(tmp_path, start):
    """Three machines, two come, then machine 0 is SIGKILLed while machine 1 waits for the third."""
    script = write_script(tmp_path, "never.py", NEVER_RUNS)
    port = free_port()
    machine_0 = start([*machine_args(0, port, machines=3), str(script)])
    wait_until_machine_0_waits(port, machine_0)
    machine_1 = start([*machine_args(1, port, machines=3), str(script)])
    wait_until_joined(port, 1, machine_1)
    machine_0.kill()
    _, stderr = machine_1.communicate(timeout=60)
    assert machine_1.returncode == 1, stderr
    assert stderr.strip().splitlines() == [
        f"mpslaunch: error: lost machine 0's store at 127.0.0.1:{port} while waiting "
        "(DistNetworkError); check that machine 0 still runs"]


# ---------------------------------------------------------------- two hosts


@dataclass
class Host:
    namespace: str
    address: str
    interface: str
    name: str  # its host name (a UTS namespace of its own for each command)

    def command(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, "unshare", "--uts", "sh", "-c",
                f'hostname {self.name} && exec "$@"', "sh", *args]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _delete_namespace(name: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    for pid in pids.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)


@pytest.fixture
def two_hosts():
    """Two "hosts" (network namespaces) on 10.X.Y.1 and .2 over a veth pair, each with an
    /etc/hosts of its own that maps this machine's host name to the host's own address."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("ss") is None:
        pytest.skip("two hosts need root and iproute2's `ip netns` and `ss`")
    tag = uuid.uuid4().hex[:8]
    names = [f"mpsl-{tag}-{side}" for side in "ab"]
    subnet = f"10.{random.randint(200, 250)}.{random.randint(0, 255)}"
    hosts = [Host(names[index], f"{subnet}.{index + 1}", f"mv{tag}{side}", f"host-{side}-{tag}")
             for index, side in enumerate("ab")]
    try:
        for host in hosts:
            _ip("netns", "add", host.namespace)
        _ip("link", "add", hosts[0].interface, "netns", hosts[0].namespace, "type", "veth",
            "peer", "name", hosts[1].interface, "netns", hosts[1].namespace)
        for host in hosts:
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
            _ip("-n", host.namespace, "link", "set", host.interface, "up")
            _ip("-n", host.namespace, "link", "set", "lo", "up")
        for host in hosts:
            set_host_names(host, {other.name: other.address for other in hosts})
    except (subprocess.CalledProcessError, OSError) as error:
        for host in hosts:
            _delete_namespace(host.namespace)
        pytest.skip(f"network namespaces are not available here: {getattr(error, 'stderr', error)}")
    yield hosts
    for host in hosts:
        _delete_namespace(host.namespace)


def set_host_names(host: Host, addresses: dict[str, str]) -> None:
    """The /etc/hosts of `host`: what each host name stands for there."""
    folder = Path(f"/etc/netns/{host.namespace}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
        f"{address} {name}\n" for name, address in addresses.items()))


def start_on(host: Host, args: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(host.command(sys.executable, "-m", "mpslaunch", *args),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


# Both ranks all-reduce, say they are up, and wait for <folder>/done; the process group ends
# before the script does (no gloo abort at exit).
TRAINS_AND_WAITS = """
import os, sys, time, torch, torch.distributed as dist
from pathlib import Path
folder = Path(sys.argv[1])
dist.init_process_group("gloo")
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
(folder / f"up.{dist.get_rank()}").write_text(f"{value.item():g}\\n")
while not (folder / "done").exists():
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
"""


def listeners(namespace: str) -> set[tuple[str, int]]:
    """What listens for TCP inside the namespace (its own view: `ss` run there)."""
    lines = subprocess.run(["ip", "netns", "exec", namespace, "ss", "-Hltn"], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    found = set()
    for line in lines:
        address, _, port = line.split()[3].rpartition(":")
        address = address.strip("[]").split("%")[0]
        found.add(("::" if address == "*" else address, int(port)))
    return found


def wait_for_files(paths: list[Path], launchers: list[subprocess.Popen], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not all(path.exists() for path in paths):
        assert time.monotonic() < deadline, "the ranks never came up"
        for launcher in launchers:
            assert launcher.poll() is None, launcher.communicate()[1]
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_two_hosts_train_and_listen_where_the_dry_run_says(tmp_path, two_hosts, backend):
    """A real two-host run, each machine's launcher in its own namespace. The dry run's words
    about what listens where hold: static keeps everything on the hosts' own addresses; with
    c10d, torch's agent store listens on every interface, as the dry run says."""
    script = write_script(tmp_path, "trains.py", TRAINS_AND_WAITS)
    main = two_hosts[0].address
    port = 29500 + random.randint(100, 400)
    common = ["--rdzv_backend", backend, "--rdzv_timeout", "120"]
    launchers = [start_on(host, [*machine_args(rank, port, ip=main), *common, str(script), str(tmp_path)])
                 for rank, host in enumerate(two_hosts)]
    try:
        wait_for_files([tmp_path / "up.0", tmp_path / "up.1"], launchers)
        found = {host.namespace: listeners(host.namespace) for host in two_hosts}
    finally:
        (tmp_path / "done").write_text("")
    for launcher in launchers:
        _, stderr = launcher.communicate(timeout=90)
        assert launcher.returncode == 0, stderr
    assert [(tmp_path / f"up.{rank}").read_text().strip() for rank in (0, 1)] == ["3", "3"]
    everywhere = {(ip, p) for listening in found.values() for ip, p in listening
                  if ip in ("0.0.0.0", "::")}
    dry_run = subprocess.run(two_hosts[0].command(sys.executable, "-m", "mpslaunch",
                                                  *machine_args(0, port, ip=main), *common,
                                                  "--dry-run", str(script)),
                             capture_output=True, text=True, timeout=60).stdout
    # What this torch does (run/torch_internals.py): torch 2.5's store for other machines listens
    # on every interface, and with c10d its ranks use that store; other releases bind the
    # address alone, and with c10d serve the ranks a store of their own on every interface.
    bound = bound_store(torch.__version__, main)
    shared = c10d_ranks_share_the_rendezvous_store(torch.__version__)
    ranks_store = backend == "c10d" and not shared
    if bound:
        assert f"serves the rendezvous store, on {main}:{port} only" in dry_run
        assert (main, port) in found[two_hosts[0].namespace]
        assert port not in {port for _, port in everywhere}, found
    else:
        assert f"serves the rendezvous store, on every interface, on port {port} (" in dry_run
        assert port in {port for _, port in everywhere}, found
    assert ("on every interface, on a port torch picks" in dry_run) == ranks_store
    assert ("gives the ranks the rendezvous store itself" in dry_run) == (backend == "c10d" and shared)
    others = {(ip, p) for ip, p in everywhere if p != port}  # the ranks' store, on torch's port
    assert bool(others) == ranks_store, found
    if not ranks_store:  # gloo's own listeners are on the hosts' addresses
        assert {ip for listening in found.values() for ip, _ in listening} <= \
            {host.address for host in two_hosts} | {"127.0.0.1", "0.0.0.0", "::"}, found


@pytest.mark.slow
def test_two_hosts_whose_names_stand_for_the_loopback_are_told_before_starting(tmp_path, two_hosts):
    """As many /etc/hosts files have it: each host's name stands for 127.0.0.1. gloo would give
    the other host a loopback address and both would wait forever; both launchers say so and
    exit 2 before anything starts. GLOO_SOCKET_IFNAME, the fix the line names, then runs."""
    for host in two_hosts:  # each host's own name stands for the loopback there
        set_host_names(host, {other.name: "127.0.0.1" if other is host else other.address
                              for other in two_hosts})
    script = write_script(tmp_path, "trains.py", TRAINS_AND_WAITS)
    main, port = two_hosts[0].address, 29500 + random.randint(401, 700)
    launchers = [start_on(host, [*machine_args(rank, port, ip=main), "--rdzv_timeout", "60",
                                 str(script), str(tmp_path)])
                 for rank, host in enumerate(two_hosts)]
    for host, launcher in zip(two_hosts, launchers):
        try:
            _, stderr = launcher.communicate(timeout=60)
        finally:
            (tmp_path / "done").write_text("")
        assert launcher.returncode == 2, stderr
        (line,) = stderr.strip().splitlines()
        assert line.startswith(f"mpslaunch: error: this machine's name {host.name} stands for "
                               "127.0.0.1 only") and "GLOO_SOCKET_IFNAME" in line
    assert not list(tmp_path.glob("up.*"))
    (tmp_path / "done").unlink()
    launchers = [start_on(host, [*machine_args(rank, port, ip=main), "--rdzv_timeout", "120",
                                 str(script), str(tmp_path)],
                          env={"GLOO_SOCKET_IFNAME": host.interface})
                 for rank, host in enumerate(two_hosts)]
    try:
        wait_for_files([tmp_path / "up.0", tmp_path / "up.1"], launchers)
    finally:
        (tmp_path / "done").write_text("")
    for launcher in launchers:
        _, stderr = launcher.communicate(timeout=90)
        assert launcher.returncode == 0, stderr
