"""What the user asks for, from the command line, a profile file or an Accelerate config.

options.py declares every launch option and profile key once (the option table); request.py
(LaunchOptions, LaunchRequest) and profile.py (Profile) write its fields out; profile_files.py
finds, reads and writes profile files; accelerate_config.py reads Accelerate's config files as
profiles; layers.py merges the defaults, a profile file, the command line (or mpslaunch.launch()'s
keywords) and a cluster's facts into Settings, each value with where it came from; flags.py is the
table's command-line side (argparse), and accelerate_flags.py the words for Accelerate's launch
options that mean nothing here; paths.py opens the files the user names (scripts too) only when
they are regular files. Nothing here probes the machine or decides anything. Other packages take
these names from here; the command-line side and the Accelerate translation are imported on first
use.
"""

from mpslaunch import lazy_names
from mpslaunch.settings import profile_files
from mpslaunch.settings.layers import (
    ACCELERATE,
    API,
    CLUSTER,
    COMMAND_LINE,
    DEFAULT,
    PROFILE,
    Layer,
    Settings,
    file_layer,
    merge,
    options_layer,
    profile_layer,
)
from mpslaunch.settings.options import (
    ACCELERATOR,
    BY_NAME,
    DEFAULT_GRACE_SECONDS,
    DEFAULT_PORT,
    DEVICES,
    MACHINES,
    MPS_WATERMARK_MAX,
    OPTIONS,
    OUTPUT,
    PLAN,
    PRECISIONS,
    PROFILE_OPTIONS,
    RDZV_BACKENDS,
    RDZV_TIMEOUT_MAX,
    REQUEST_OPTIONS,
    Option,
    cut,
)
from mpslaunch.settings.paths import (
    NotAFileError,
    current_folder,
    folder_main,
    open_regular,
    unreadable,
)
from mpslaunch.settings.profile import KNOWN_KEYS, MPS_KEYS, Profile, check_profile, check_value
from mpslaunch.settings.profile_files import ProfileFile, read_active
from mpslaunch.settings.request import LaunchOptions, LaunchRequest, request_problem

__getattr__ = lazy_names(
    __name__,
    {
        "accelerate_config": ("Translation", "default_config_path", "unused_default_note"),
        "flags": ("add_option", "add_table_options", "request_from_args", "spellings"),
        "accelerate_flags": ("WAYS", "refusal"),
    },
)
