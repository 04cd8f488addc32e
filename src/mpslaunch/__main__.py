import sys

from mpslaunch import command_line

sys.exit(command_line())
