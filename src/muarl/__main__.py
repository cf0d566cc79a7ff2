import sys

from muarl.cli import main

sys.exit(main())
