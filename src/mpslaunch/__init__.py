"""mpslaunch: launch PyTorch training on your own machine, Apple silicon first."""

__version__ = "0.1.0"


def lazy_names(package: str, modules: dict[str, tuple[str, ...]]):
    """A package's module `__getattr__` (PEP 562): each name in `modules` (module -> names) is
    imported from its module on first use, so importing the package costs nothing more."""
    where = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        import importlib

        return getattr(importlib.import_module(f"{package}.{where[name]}"), name)

    return __getattr__


# mpslaunch.launch, imported on first use: `import mpslaunch` stays cheap.
__getattr__ = lazy_names(__name__, {"launcher": ("launch",)})
