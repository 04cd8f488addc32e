"""torchrun's own variables as a cluster layer. torch.distributed.run reads each of its options
from PET_<OPTION> when the flag is not given, and Kubeflow's PyTorchJob sets them in every pod
(PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_NPROC_PER_NODE): where they
are set, they say the machines, this one's rank and machine 0, as SLURM's do. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from mpslaunch.output import MpslaunchError
from mpslaunch.settings import BY_NAME, CLUSTER, Layer

WHERE = "torchrun's PET_ variables"
ESCAPE = "unset the PET_ variables to ignore them"
KEYS = {
    "PET_NNODES": "num_machines",
    "PET_NODE_RANK": "machine_rank",
    "PET_MASTER_ADDR": "main_process_ip",
    "PET_MASTER_PORT": "main_process_port",
    "PET_NPROC_PER_NODE": "num_processes",
}
# torchrun's words for "as many as this machine has": mpslaunch counts them itself.
COUNTED_HERE = ("auto", "gpu", "cpu", "xpu")


def torchrun_layer(environ: Mapping[str, str]) -> Layer:
    """The PET_ variables set, as the profile keys they stand for; MpslaunchError for one that
    cannot be read."""
    values, words = {}, {}
    for name, key in KEYS.items():
        text = environ.get(name, "").strip()
        if not text or (name == "PET_NPROC_PER_NODE" and text in COUNTED_HERE):
            continue
        values[key] = _read(name, key, text)
        words[key] = (f"{name}={{value}}", name)
    return Layer(CLUSTER, values, WHERE, words, ESCAPE)


def _read(name: str, key: str, text: str) -> object:
    if name == "PET_NNODES" and ":" in text:  # torchrun's MIN:MAX, an elastic range
        low, _, high = text.partition(":")
        if low != high:
            raise MpslaunchError(
                f"{name}={text} asks for between {low} and {high} machines, "
                "an elastic run that mpslaunch does not start; give a fixed "
                f"count ({name}={high}), or {ESCAPE}"
            )
        text = low
    option = BY_NAME[key]
    value = int(text) if option.kind is int and text.isdecimal() else text
    problem = option.problem(value)
    if problem:
        raise MpslaunchError(
            f"{name}={text!r} cannot be read as --{key}: it {problem}; fix it, or {ESCAPE}"
        )
    return value
