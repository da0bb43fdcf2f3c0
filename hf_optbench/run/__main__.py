"""``python -m hf_optbench.run`` and ``accelerate launch -m hf_optbench.run``: one benchmark run."""

from hf_optbench.run.train import exit_process, main

exit_process(main())
