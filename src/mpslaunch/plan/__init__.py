"""The plan: what runs where, decided from the settings and a described machine. Pure: it reads
no files and starts nothing, so tests can describe any computer. decision.py holds the plan's
types, `decide` and `settle` (the settings' layers merged, and the rules between keys);
device.py the device, precision and torch.compile rules; processes.py the processes, machines
and addresses; child.py the child's command and environment (and Accelerate's launch options);
environment.py what a script finds in its environment; slurm.py what an srun step gives the
settings (a cluster layer) and the rules of a run in it; torchrun_variables.py torchrun's PET_
variables (a PyTorchJob's) as another cluster layer. Each refusal is an MpslaunchError that says
what to do; each rule cites its fact in docs/mps-facts.md.
"""

from mpslaunch import lazy_names

# Imported on first use: the check asks environment.py alone, without the rest of the plan.
__getattr__ = lazy_names(
    __name__,
    {
        "decision": (
            "ENGINES",
            "Decision",
            "LaunchPlan",
            "decide",
            "decide_settings",
            "for_target",
            "mps_verdict_text",
            "resolve",
            "settle",
        ),
        "device": (
            "choose_device",
            "cuda_problem",
            "dynamo_problem",
            "mps_minimum_macos",
            "mps_problem",
            "platform_mps_problem",
            "precision_refusal",
            "torch_mps_problem",
        ),
        "processes": (
            "checks_main_address",
            "default_processes",
            "main_address_problem",
            "most_processes",
            "processes_problem",
        ),
        "slurm": (
            "NO_CLUSTER",
            "Cluster",
            "Place",
            "derived_port",
            "slurm_cluster",
            "with_slurm_config",
        ),
        "torchrun_variables": ("torchrun_layer",),
        "environment": ("Seen", "seen_by_the_script"),
    },
)
