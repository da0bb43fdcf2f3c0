"""Publishing a run: what may leave the machine (:mod:`~hf_optbench.publish.redact`), the model card
(:mod:`~hf_optbench.publish.card`) and the Hub upload (:mod:`~hf_optbench.publish.hub`)."""
