"""``python -m storage_migrator.cli``."""

import sys

from storage_migrator.cli.app import main

sys.exit(main())
