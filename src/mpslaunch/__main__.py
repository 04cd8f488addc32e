import sys

from mpslaunch.cli import main

sys.exit(main())
