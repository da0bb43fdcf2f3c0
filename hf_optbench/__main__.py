"""``python -m hf_optbench`` is the ``hf-optbench`` command."""

import sys

from hf_optbench.cli import main

sys.exit(main())
