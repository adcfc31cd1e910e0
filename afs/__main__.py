import sys

from afs.cli import main

sys.exit(main())
