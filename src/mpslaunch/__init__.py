"""mpslaunch: launch PyTorch training on your own machine, Apple silicon first."""

__version__ = "0.1.0"


def __getattr__(name: str):
    # mpslaunch.launch, imported on first use: `import mpslaunch` stays cheap.
    if name == "launch":
        from mpslaunch.api import launch

        return launch
    raise AttributeError(f"module 'mpslaunch' has no attribute {name!r}")
