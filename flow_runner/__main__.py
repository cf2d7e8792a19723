"""``python -m flow_runner``: the runner, as `storage-migrator worker` starts it."""

import sys

from flow_runner.main import main

sys.exit(main())
