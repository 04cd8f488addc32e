import sys

from mpslaunch.commands import main

sys.exit(main())
