"""What `launch`, `test` and `mpslaunch.launch()` ask for: the options of a request, one field per
option of the table that is not `request=False`, in the table's order, and what to run.
tests/settings/test_options.py holds these fields to the table (names, types, defaults).
"""

from __future__ import annotations

from mpslaunch import Record, record
from mpslaunch.settings.options import DEFAULT_GRACE_SECONDS, REQUEST_OPTIONS

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing on every launch


@record
class LaunchOptions(Record):
    """What the command line asked for, the target aside. None means 'not given': the profile
    decides."""

    # what to run on
    cpu: bool = False
    device: str | None = None  # auto, mps, cuda or cpu
    mixed_precision: str | None = None
    num_processes: int | None = None  # on this machine
    # several machines
    num_machines: int | None = None
    machine_rank: int | None = None  # this machine's, from 0
    main_process_ip: str | None = None  # machine 0's address
    main_process_ip_via_nat: bool | None = None
    main_process_port: int | None = None
    # how torch.distributed.run meets and watches the ranks
    rdzv_backend: str | None = None
    rdzv_timeout: int | None = None  # seconds
    max_restarts: int | None = None
    slurm: bool | None = None  # False: --no_slurm
    monitor_interval: float | None = None  # seconds; None: the launcher's own
    # NVIDIA GPUs
    gpu_ids: str | None = None  # CUDA_VISIBLE_DEVICES for the ranks
    multi_gpu: bool = False
    # torch.compile, for the script's Accelerator
    dynamo_backend: str | None = None
    dynamo_mode: str | None = None
    dynamo_use_fullgraph: bool | None = None  # no graph breaks
    dynamo_use_dynamic: bool | None = None
    dynamo_use_regional_compilation: bool | None = None
    # more for the script's Accelerator
    debug: bool | None = None
    num_cpu_threads_per_process: int | None = None  # OMP_NUM_THREADS
    # output, and what runs beside the script
    log_dir: str | None = None
    tee: str | None = None  # taken for Accelerate; every rank's output reaches the console
    check: bool | None = None  # read the script first (mpslaunch check)
    keep_awake: bool | None = None
    # the run itself
    grace_period: float = DEFAULT_GRACE_SECONDS
    module: bool = False
    no_python: bool = False

    def __new__(cls, **options: object):  # by name only: the fields are many
        return super().__new__(cls, **options)


@record
class LaunchRequest(LaunchOptions):
    """What to run, and the options it was asked with: a script path (a module name with
    `module`, an executable with `no_python`) and its arguments. Made as
    LaunchRequest(target, target_args, **options)."""

    target: str = ""
    target_args: tuple[str, ...] = ()

    def __new__(cls, target: str, target_args: tuple[str, ...] = (), **options: object):
        return super().__new__(cls, target=target, target_args=target_args, **options)

    if TYPE_CHECKING:  # __new__'s signature, where type checkers look (the fields' order differs)

        def __init__(
            self, target: str, target_args: tuple[str, ...] = (), **options: object
        ) -> None: ...


def request_problem(options: LaunchOptions) -> str | None:
    """The first option given with a value it may not have, as `--name why`; or None."""
    for option in REQUEST_OPTIONS:
        value = getattr(options, option.name)
        if value is None:
            continue
        problem = option.problem(value)
        if problem:
            return f"{option.spelling} {problem}"
    return None
