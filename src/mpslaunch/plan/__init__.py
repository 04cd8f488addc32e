"""The plan: what runs where, decided from the settings and a described machine. Pure: it reads
no files and starts nothing, so tests can describe any computer. decision.py holds the plan's
types and `decide`; device.py the device, precision and torch.compile rules; processes.py the
processes, machines and addresses; child.py the child's command and environment (and
Accelerate's launch options); environment.py what a script finds in its environment. Each
refusal is an MpslaunchError that says what to do; each rule cites its fact in
docs/mps-facts.md.
"""

from mpslaunch import lazy_names

# Imported on first use: the check asks environment.py alone, without the rest of the plan.
__getattr__ = lazy_names(__name__, {
    "decision": ("Decision", "LaunchPlan", "apply_flags", "decide", "decide_settings", "for_target",
                 "mps_verdict_text", "resolve", "with_flags"),
    "device": ("choose_device", "cuda_problem", "dynamo_problem", "mps_minimum_macos", "mps_problem",
               "platform_mps_problem", "precision_problem", "precision_refusal", "torch_mps_problem"),
    "processes": ("checks_main_address", "default_processes", "main_address_problem", "most_processes",
                  "processes_problem"),
    "environment": ("Seen", "seen_by_the_script"),
})
