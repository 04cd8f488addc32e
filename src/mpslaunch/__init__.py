"""mpslaunch: launch PyTorch training on your own machine, Apple silicon first."""

__version__ = "0.1.0"
