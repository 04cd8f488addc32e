"""The launch core that every door shares (`mpslaunch launch`, `test`, `check`, `env`, `config
show` and `mpslaunch.launch()`): `prepare` makes the plan (prepare.py, with the target's checks
in targets.py), `announce` prints it, `execute` runs it (run/). api.py is `mpslaunch.launch()`,
imported on first use.
"""

from mpslaunch import lazy_names
from mpslaunch.launcher.prepare import accelerate_note, announce, prepare
from mpslaunch.launcher.targets import check_target
from mpslaunch.run import describe, execute

__getattr__ = lazy_names(__name__, {"api": ("launch", "FreshCall")})
