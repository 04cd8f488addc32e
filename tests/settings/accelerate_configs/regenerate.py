"""Write the Accelerate config fixtures again with the installed Accelerate (run by hand, not in CI).

    python tests/settings/accelerate_configs/regenerate.py [NAME ...]

Most files come from the real `accelerate config` questionnaire, answered in a private tmux
server as a user types (menus: number keys or arrows, then Enter; questions: text, then Enter)
and written with `--config_file`. The questionnaire never counts GPUs for these paths: it asks,
and the answers below give the counts (2 or 8 GPUs, 2 machines). Where it cannot get through on
a machine without those packages (DeepSpeed asserts that deepspeed is installed, fp8 that an fp8
backend is), the file is written by Accelerate's own ClusterConfig writer instead, as the
questionnaire would have written it. `accelerate config default` runs as the real command;
write_basic_config also runs with torch told there are 1 or 8 CUDA GPUs. The hand-written files
(hand_*.yaml) are older formats still found in the wild, labelled as such in their first line.
Each file's first comment line says how it was made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
ACCELERATE = Path(sys.executable).with_name("accelerate")

# Menu answers are ("menu", index); anything else is typed, then Enter ("" takes the default).
LOCAL = [("compute environment", ("menu", 0))]
NO_DYNAMO = [("optimize your script with torch dynamo", "no")]
ONE_MACHINE = [("How many different machines", "1")]


def machine(kind: int) -> list:
    return LOCAL + [("Which type of machine", ("menu", kind))]


def precision(index: int) -> list:
    return [("Do you wish to use mixed precision", ("menu", index))]


def gpu_tail(processes: str, numa: str = "no", mixed: int = 0) -> list:
    """After the plugin questions of a multi-GPU path: counts, ids, NUMA, precision."""
    return [("How many GPU(s) should be used", processes), ("(by id) should be used", ""),
            ("numa efficiency", numa)] + precision(mixed)


NO_PLUGINS = [("use DeepSpeed", "no"), ("FullyShardedDataParallel", "no"), ("use Megatron-LM", "no")]
DYNAMO_CUSTOM = [("optimize your script with torch dynamo", "yes"),
                 ("Which dynamo backend", ("menu", 2)),  # inductor, the default
                 ("customize the defaults sent to torch.compile", "yes"),
                 ("Which mode do you want to use", ("menu", 2)),  # max-autotune
                 ("fullgraph mode", "yes"), ("dynamic shape tracing", "no"),
                 ("regional compilation", "yes")]


def two_machines(rank: int, c10d: bool) -> list:
    network = [("same local network", "no"), ("rendezvous backend", "c10d")] if c10d else \
        [("same local network", "")]
    return [("How many different machines", "2"), ("rank of this machine", ("menu", rank)),
            ("IP address of the machine", "10.0.0.1"), ("port you will use", "29500")] + network


def other_accelerator(kind: int, count_question: str) -> list:
    return machine(kind) + ONE_MACHINE + [("checked while running", "no")] + NO_DYNAMO + \
        [("use DeepSpeed", "no"), ("FullyShardedDataParallel", "no"), (count_question, "2"),
         ("(by id) should be used", "")] + precision(0)


# name -> the answers, in the order the questionnaire asks.
QUESTIONNAIRE = {
    "no_distributed_cpu": machine(0) + [("CPU only", "yes")] + NO_DYNAMO + [("use DeepSpeed", "no")]
    + precision(0),
    "no_distributed_cpu_bf16": machine(0) + [("CPU only", "yes")] + NO_DYNAMO + [("use DeepSpeed", "no")]
    + precision(2),
    "no_distributed_gpu": machine(0) + [("CPU only", "")] + NO_DYNAMO + [("use DeepSpeed", "no"),
                                                                         ("(by id) should be used", ""),
                                                                         ("numa efficiency", "")]
    + precision(0),
    "no_distributed_gpu_fp16": machine(0) + [("CPU only", "no")] + NO_DYNAMO
    + [("use DeepSpeed", "no"), ("(by id) should be used", "0"), ("numa efficiency", "no")] + precision(1),
    "no_distributed_gpu_bf16_dynamo": machine(0) + [("CPU only", "no")] + DYNAMO_CUSTOM
    + [("use DeepSpeed", "no"), ("(by id) should be used", ""), ("numa efficiency", "no")] + precision(2),
    "no_distributed_gpu_numa": machine(0) + [("CPU only", "no")] + NO_DYNAMO
    + [("use DeepSpeed", "no"), ("(by id) should be used", ""), ("numa efficiency", "yes")] + precision(0),
    "multi_cpu_2": machine(1) + ONE_MACHINE + [("checked while running", "no"), ("launch mpirun", "no")]
    + NO_DYNAMO + [("How many processes should be used", "2")] + precision(0),
    "multi_cpu_2_bf16_dynamo": machine(1) + ONE_MACHINE + [("checked while running", "no"),
                                                          ("launch mpirun", "no")]
    + [("optimize your script with torch dynamo", "yes"), ("Which dynamo backend", ("menu", 0)),
       ("customize the defaults sent to torch.compile", "no")]
    + [("How many processes should be used", "2")] + precision(2),
    "multi_cpu_2_fp16": machine(1) + ONE_MACHINE + [("checked while running", "no"), ("launch mpirun", "no")]
    + NO_DYNAMO + [("How many processes should be used", "2")] + precision(1),
    "multi_cpu_mpirun": machine(1) + ONE_MACHINE + [("checked while running", "no"), ("launch mpirun", "yes"),
                                                   ("path to the hostfile", "/etc/mpi-hostfile")]
    + NO_DYNAMO + [("How many processes should be used", "4")] + precision(0),
    "multi_cpu_mpirun_2_machines": machine(1) + two_machines(0, c10d=False)
    + [("checked while running", "no"), ("launch mpirun", "yes"), ("path to the hostfile", "/etc/mpi-hostfile")]
    + NO_DYNAMO + [("How many processes should be used", "4")] + precision(0),
    "multi_gpu_2": machine(4) + ONE_MACHINE + [("checked while running", "no")] + NO_DYNAMO + NO_PLUGINS
    + gpu_tail("2"),
    "multi_gpu_2_fp16_debug": machine(4) + ONE_MACHINE + [("checked while running", "yes")] + NO_DYNAMO
    + NO_PLUGINS + gpu_tail("2", mixed=1),
    "multi_gpu_8_bf16_dynamo": machine(4) + ONE_MACHINE + [("checked while running", "no")] + DYNAMO_CUSTOM
    + NO_PLUGINS + gpu_tail("8", mixed=2),
    "multi_gpu_8_numa": machine(4) + ONE_MACHINE + [("checked while running", "no")] + NO_DYNAMO
    + NO_PLUGINS + gpu_tail("8", numa="yes"),
    "multi_gpu_2_of_8_ids": machine(4) + ONE_MACHINE + [("checked while running", "no")] + NO_DYNAMO
    + NO_PLUGINS + [("How many GPU(s) should be used", "2"), ("(by id) should be used", "2,5"),
                    ("numa efficiency", "no")] + precision(2),
    "two_machines_rank0_16_gpus": machine(4) + two_machines(0, c10d=False) + [("checked while running", "no")]
    + NO_DYNAMO + NO_PLUGINS + gpu_tail("16", mixed=2),
    "two_machines_rank1_c10d_4_gpus": machine(4) + two_machines(1, c10d=True)
    + [("checked while running", "no")] + NO_DYNAMO + NO_PLUGINS + gpu_tail("4", mixed=1),
    # Refused: no meaning for mpslaunch.
    "fsdp": machine(4) + ONE_MACHINE + [("checked while running", "no")] + NO_DYNAMO
    + [("use DeepSpeed", "no"), ("FullyShardedDataParallel", "yes"), ("FSDP version", ("menu", 1)),
       ("resharding after forward", ""), ("offload parameters and gradients", ""),
       ("auto wrap policy", ("menu", 0)), ("_no_split_modules", "yes"),
       ("state dict type", ("menu", 0)), ("CPU RAM efficient", ""), ("activation checkpointing", ""),
       ("use the parallelism config", "no"), ("How many GPU(s) should be used", "2")] + precision(2),
    "megatron_lm": machine(4) + ONE_MACHINE + [("checked while running", "no")] + NO_DYNAMO
    + [("use DeepSpeed", "no"), ("FullyShardedDataParallel", "no"), ("use Megatron-LM", "yes"),
       ("Tensor Parallelism degree", "2"), ("Sequence Parallelism", ""), ("Pipeline Parallelism degree", "1"),
       ("selective activation recomputation", ""), ("distributed optimizer", ""),
       ("gradient clipping value", ""), ("How many GPU(s) should be used", "2")] + precision(2),
    "tpu": machine(10) + NO_DYNAMO + [("should be used for distributed training", "8"), ("name of the function", ""),
                                      ("using a TPU cluster", "no")],
    "multi_xpu": other_accelerator(2, "How many XPU(s)"),
    "multi_hpu": other_accelerator(3, "How many HPU(s)"),
    "multi_npu": other_accelerator(5, "How many NPU(s)"),
    "multi_mlu": other_accelerator(6, "How many MLU(s)"),
    "multi_sdaa": other_accelerator(7, "How many SDAA(s)"),
    "multi_musa": other_accelerator(8, "How many MUSA(s)"),
    "multi_neuron": other_accelerator(9, "How many NEURON cores"),
    "sagemaker": [("compute environment", ("menu", 1)), ("How do you want to authorize", ("menu", 0)),
                  ("AWS Profile name", ""), ("AWS Region", ""), ("IAM Role for executing", ("menu", 0)),
                  ("IAM role name", "accelerate-role"), ("custom Docker image", ""),
                  ("SageMaker input channels", ""), ("SageMaker metrics", ""),
                  ("distributed mode", ("menu", 0))] + NO_DYNAMO
    + [("EC2 instance type", ""), ("FP16 or BF16", ("menu", 1))],
}


class Tmux:
    """One private tmux server (its own socket), killed at the end."""

    def __init__(self, command: str):
        self.socket = f"mpslaunch-acc-{uuid.uuid4().hex[:8]}"
        self.tmux("new-session", "-d", "-s", "t", "-x", "200", "-y", "60", command)
        self.seen: dict[str, int] = {}

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True,
                              check=True, timeout=10).stdout

    def history(self) -> str:
        return self.tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "t")

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        """Until `text` shows once more than it has been answered (prompts stay on screen)."""
        wanted = self.seen.get(text, 0) + 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.history().count(text) >= wanted:
                self.seen[text] = wanted
                time.sleep(0.3)  # the menu switches the terminal to raw input after drawing
                return
            time.sleep(0.1)
        raise RuntimeError(f"{text!r} never appeared; the screen:\n{self.history()}")

    def answer(self, value) -> None:
        if isinstance(value, tuple):  # a menu: number keys reach 0-9, arrows the rest
            index = value[1]
            keys = [str(index)] if index <= 9 else ["9"] + ["Down"] * (index - 9)
            for key in keys:
                self.tmux("send-keys", "-t", "t", key)
                time.sleep(0.2)
            self.tmux("send-keys", "-t", "t", "Enter")
        else:
            if value:
                self.tmux("send-keys", "-t", "t", "-l", value)
            self.tmux("send-keys", "-t", "t", "Enter")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


def drive(name: str, steps: list, home: Path) -> None:
    target = HERE / f"{name}.yaml"
    written = home / f"{name}.yaml"
    command = (f"env HF_HOME={home} {ACCELERATE} config --config_file {written}; "
               "echo EXIT=$?; sleep 120")
    terminal = Tmux(command)
    try:
        for prompt, value in steps:
            terminal.wait_for(prompt)
            terminal.answer(value)
        terminal.wait_for("EXIT=")
        screen = terminal.history()
        if "EXIT=0" not in screen or not written.is_file():
            raise RuntimeError(f"{name}: accelerate config did not write the file:\n{screen}")
    finally:
        terminal.close()
    target.write_text(header(steps) + written.read_text())


def header(steps: list) -> str:
    """The file's first line: how it was made, each question (its first words) and the answer."""
    answers = "; ".join(f"{prompt}: " + (f"menu choice {value[1]}" if isinstance(value, tuple)
                                         else value or "<Enter>") for prompt, value in steps)
    return f"# written by `accelerate config` (Accelerate {version()}), answers: {answers}\n"


def version() -> str:
    import accelerate

    return accelerate.__version__


def by_writer(name: str, distributed_type: str, why: str, **fields) -> None:
    """Where the questionnaire stops on this machine: Accelerate's own ClusterConfig writer."""
    from accelerate.commands.config.config_args import ClusterConfig

    settings = {"compute_environment": "LOCAL_MACHINE", "distributed_type": distributed_type,
                "use_cpu": False, "debug": False, "machine_rank": 0, "num_machines": 1,
                "main_training_function": "main", "rdzv_backend": "static", "same_network": True,
                "downcast_bf16": "no", "tpu_env": [], "tpu_use_cluster": False, "tpu_use_sudo": False,
                "enable_cpu_affinity": False, **fields}
    written = Path(tempfile.mkdtemp()) / "config.yaml"
    ClusterConfig(**settings).to_yaml_file(str(written))
    (HERE / f"{name}.yaml").write_text(f"# written by Accelerate {version()}'s ClusterConfig writer "
                                       f"({why})\n" + written.read_text())


def default_command(name: str, mixed_precision: str, home: Path) -> None:
    """`accelerate config default`, the real command, on this machine (no GPU: use_cpu true)."""
    written = home / f"{name}.yaml"
    subprocess.run([str(ACCELERATE), "config", "default", "--mixed_precision", mixed_precision,
                    "--config_file", str(written)], check=True, env={**os.environ, "HF_HOME": str(home)},
                   capture_output=True)
    (HERE / f"{name}.yaml").write_text(f"# written by `accelerate config default --mixed_precision "
                                       f"{mixed_precision}` (Accelerate {version()}) on a machine "
                                       "without a GPU\n" + written.read_text())


def basic_config(name: str, mixed_precision: str, gpus: int) -> None:
    """write_basic_config with torch told how many CUDA GPUs there are."""
    import torch
    from accelerate.utils import write_basic_config

    torch.cuda.is_available = lambda: gpus > 0
    torch.cuda.device_count = lambda: gpus
    written = Path(tempfile.mkdtemp()) / "config.yaml"
    write_basic_config(mixed_precision=mixed_precision, save_location=str(written))
    (HERE / f"{name}.yaml").write_text(f"# written by accelerate.utils.write_basic_config("
                                       f"mixed_precision={mixed_precision!r}) (Accelerate {version()}) "
                                       f"with torch reporting {gpus} CUDA GPU(s)\n" + written.read_text())


def writers() -> dict:
    """Files that Accelerate's own writers make without the questionnaire."""
    made = {}
    questionnaire_stops = "the questionnaire stops here unless the package is installed"
    made["deepspeed"] = lambda home: by_writer(
        "deepspeed", "DEEPSPEED", f"DeepSpeed: {questionnaire_stops}", num_processes=2,
        mixed_precision="bf16", deepspeed_config={"zero_stage": 2, "offload_optimizer_device": "none",
                                                  "offload_param_device": "none",
                                                  "gradient_accumulation_steps": 1, "zero3_init_flag": False})
    made["fp8"] = lambda home: by_writer(
        "fp8", "MULTI_GPU", f"fp8: {questionnaire_stops} (torchao, Transformer Engine or MS-AMP)",
        num_processes=2, gpu_ids="all", mixed_precision="fp8", fp8_config={"backend": "AO",
                                                                           "enable_fsdp_float8_all_gather": True,
                                                                           "pad_inner_dim": True})
    for precision_name in ("no", "fp16", "bf16"):
        made[f"default_command_{precision_name}"] = (
            lambda home, p=precision_name: default_command(f"default_command_{p}", p, home))
        for gpus in (0, 1, 8):
            name = f"basic_{precision_name}_{gpus}gpu"
            made[name] = lambda home, n=name, p=precision_name, g=gpus: basic_config(n, p, g)
    return made


def main(names: list[str]) -> int:
    if shutil.which("tmux") is None:
        print("tmux is needed (apt-get install -y tmux)", file=sys.stderr)
        return 2
    others = writers()
    chosen = names or [*QUESTIONNAIRE, *others]
    for name in chosen:
        home = Path(tempfile.mkdtemp(prefix="accelerate-home-"))
        if name in QUESTIONNAIRE:
            drive(name, QUESTIONNAIRE[name], home)
        else:
            others[name](home)
        print(f"wrote {name}.yaml", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
