"""``python -m receivewal``."""

import sys

from receivewal.commands.cli import main

sys.exit(main())
