"""Which device, and what runs on it: the device choice (mps, cuda, cpu) and why, what rules mps
or cuda out on this machine, and the precision and torch.compile rules per device. Pure: the
machine is a described `Machine`; each rule cites its fact in docs/mps-facts.md.
"""

from __future__ import annotations

from mpslaunch.machine import Machine, version_tuple
from mpslaunch.output import MpslaunchError
from mpslaunch.settings import ACCELERATE, PROFILE, Settings


def choose_device(settings: Settings, machine: Machine) -> tuple[str, str]:
    """The device for the setting and a one-line reason. Explicit requests never fall back
    silently; a refusal names the setting and where it came from."""
    wanted = settings.device
    if wanted == "cpu":
        # The plan line names a file's choice as the profile's, keeping the line short.
        asker = (
            "the profile"
            if settings.kind("device") in (PROFILE, ACCELERATE)
            else settings.named("device")
        )
        return "cpu", f"cpu: asked for by {asker}"
    if wanted in ("mps", "cuda"):
        problem = mps_problem(machine) if wanted == "mps" else cuda_problem(machine)
        if problem:
            raise MpslaunchError(
                f"{settings.named('device')} asks for {wanted}, but {problem}; "
                "use --device auto to pick what this machine has, or --cpu"
            )
        return wanted, _describe(wanted, machine)
    # In a VM, say so before torch's verdict: a small check can pass there and training fail.
    mps_auto_problem = (
        platform_mps_problem(machine)
        or virtual_machine_problem(machine)
        or torch_mps_problem(machine)
    )
    for device, problem in (("mps", mps_auto_problem), ("cuda", cuda_problem(machine))):
        if problem is None:
            return device, _describe(device, machine)
    why = mps_auto_problem if machine.is_mac else cuda_problem(machine)
    return "cpu", f"cpu: {why}"


def mps_minimum_macos(torch_version: str) -> tuple[int, ...]:
    """The oldest macOS whose MPS backend this torch supports (docs/mps-facts.md: Detecting MPS)."""
    release = version_tuple(torch_version)[:2]
    if release >= (2, 9):
        return (14, 0)  # macOS 13 support dropped in 2.9 (pytorch PR #162921)
    if release >= (2, 5):
        return (13, 0)  # macOS 12 dropped in 2.5 (pytorch PR #133141)
    return (12, 3)


def mps_problem(machine: Machine) -> str | None:
    """Why mps cannot be used here, or None when it can."""
    return platform_mps_problem(machine) or torch_mps_problem(machine)


def platform_mps_problem(machine: Machine) -> str | None:
    """Why the platform facts alone rule mps out, or None."""
    if not machine.is_mac:
        return f"mps needs a Mac with Apple silicon and this is {machine.system} {machine.arch}"
    if machine.rosetta:
        # An x86_64 Python under Rosetta has no MPS (docs/mps-facts.md: Detecting MPS).
        return (
            "this Python is an x86_64 build running under Rosetta, which has no mps; "
            "install an arm64 Python (python.org, Homebrew in /opt/homebrew, or conda "
            "osx-arm64) and torch inside it"
        )
    if machine.arch != "arm64":
        # The last x86_64 macOS wheels are torch 2.2 (docs/mps-facts.md: Detecting MPS).
        return "this is an Intel Mac; mps training needs Apple silicon"
    if not machine.torch_version:
        return f"torch is not installed for {machine.python}; run `pip install torch`"
    needed = mps_minimum_macos(machine.torch_version)
    if machine.macos_version and machine.macos_version < needed:
        return (
            f"torch {machine.torch_version} needs macOS {'.'.join(map(str, needed))} or later "
            f"for mps and this Mac runs macOS {machine.macos_text}; update macOS, or install "
            f"{_older_torch_for(machine.macos_version)}"
        )
    return None


def torch_mps_problem(machine: Machine) -> str | None:
    """torch's own verdict, from a child (docs/mps-facts.md: Detecting MPS): it sees what no
    version rule predicts, such as a macOS 26 release that torch does not take yet."""
    answer = machine.mps_answer
    if machine.is_mac and answer is not None and not answer.usable:
        return (
            f"torch {machine.torch_version} cannot use mps on this Mac: {answer.detail} "
            f"(checked {answer.checked_at}); {answer.fix}"
        )
    return None


def virtual_machine_problem(machine: Machine) -> str | None:
    """Why auto avoids mps in a macOS virtual machine, where torch says yes and allocations then
    fail (docs/mps-facts.md: Where torch's own answer and the platform disagree)."""
    if machine.is_mac and machine.virtual_machine:
        return (
            "this Mac is a virtual machine (kern.hv_vmm_present=1), where mps is "
            "paravirtualised and known to fail (GitHub's macOS runners are such machines); "
            "--device mps tries it anyway"
        )
    return None


def _older_torch_for(macos: tuple[int, ...]) -> str:
    if macos >= (13, 0):
        return "'torch<2.9' (the last releases for macOS 13)"
    return "'torch<2.5' (the last releases for macOS 12.3)"


def cuda_problem(machine: Machine) -> str | None:
    """Why cuda cannot be used here, or None when it can."""
    if not machine.cuda_devices:
        return "no NVIDIA GPU is visible" + (" (this is a Mac)" if machine.is_mac else "")
    if not machine.torch_version:
        return f"torch is not installed for {machine.python}; run `pip install torch`"
    if not machine.torch_cuda:
        return (
            f"torch {machine.torch_version} is a CPU-only build; install a CUDA build of "
            "torch (see pytorch.org's install selector)"
        )
    return None


def _describe(device: str, machine: Machine) -> str:
    if device == "mps":
        return f"mps: {machine.chip or 'Apple silicon'}, macOS {machine.macos_text}, torch {machine.torch_version}"
    count = len(machine.cuda_devices)
    names = ", ".join(sorted(set(machine.cuda_devices)))
    return f"cuda: {count} x {names}, torch {machine.torch_version} (CUDA {machine.torch_cuda})"


# ---------------------------------------------------------------- precision


def check_precision(settings: Settings, device: str, machine: Machine) -> None:
    precision = settings.mixed_precision
    refusal = precision_refusal(precision, device, machine)
    if refusal:
        why, advice = refusal
        raise MpslaunchError(
            f"{settings.named('mixed_precision')} asks for {precision}, but {why}; {advice}"
        )


def precision_refusal(precision: str, device: str, machine: Machine) -> tuple[str, str] | None:
    """(why this precision cannot run on this device, the command-line flags to use instead), or
    None. The questionnaire and bench show the reason with advice of their own."""
    torch_release = version_tuple(machine.torch_version)
    if precision == "fp16" and device == "cpu":
        # Accelerate turns fp16 on cpu into plain fp32 without a word; we say so instead.
        return (
            "fp16 mixed precision does not run on cpu (Accelerate would silently train in fp32)",
            "use --mixed_precision bf16 on cpu, or no",
        )
    if precision == "fp16" and device == "mps" and torch_release < (2, 8):
        # GradScaler works on mps from torch 2.8 (docs/mps-facts.md: Precision).
        return (
            f"fp16 training on mps needs torch 2.8 or later (GradScaler on mps), this is "
            f"torch {machine.torch_version}",
            "upgrade torch, or use --mixed_precision no",
        )
    if precision == "bf16" and device == "mps":
        if machine.macos_version and machine.macos_version < (14, 0):
            # bfloat16 on MPS needs macOS 14 (docs/mps-facts.md: Precision).
            return (
                f"bf16 on mps needs macOS 14 or later and this Mac runs macOS {machine.macos_text}",
                "use --mixed_precision fp16 (torch 2.8 or later) or no",
            )
        if torch_release < (2, 6):
            # bf16 autocast on mps needs torch 2.6 (docs/mps-facts.md: Precision).
            return (
                f"bf16 on mps needs torch 2.6 or later, this is torch {machine.torch_version}",
                "upgrade torch, or use --mixed_precision no",
            )
    return None


# The first torch whose inductor compiles for mps as a release feature; 2.7's is a prototype
# (docs/mps-facts.md: torch.compile on mps).
MPS_COMPILE_TORCH = (2, 8)
# Backends that trace but generate no kernels: they run wherever eager mode runs.
_NON_COMPILING_BACKENDS = ("no", "eager", "aot_eager")


def dynamo_problem(backend: str, device: str, machine: Machine, named: str) -> str | None:
    """Why torch.compile with this backend cannot run on this device with this torch, or None.
    `named`: the setting as the message names it, with where it came from."""
    if device != "mps" or backend in _NON_COMPILING_BACKENDS:
        return None
    if version_tuple(machine.torch_version) >= MPS_COMPILE_TORCH:
        return None
    needed = ".".join(map(str, MPS_COMPILE_TORCH))
    return (
        f"{named} asks torch.compile for mps, which compiles for mps from torch "
        f"{needed} and this is torch {machine.torch_version}; install it with "
        f"`pip install -U 'torch>={needed}'`, or use --dynamo_backend aot_eager or no"
    )
