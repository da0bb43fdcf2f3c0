"""``python -m hf_optbench`` is the ``hf-optbench`` command."""

import sys

from .cli import main

sys.exit(main())
