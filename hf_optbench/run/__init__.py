"""The one-run layer: a recipe in, a run directory out.

Read :mod:`hf_optbench.run.train` top to bottom: ``main`` -> ``train`` calls each step once and passes its result on.
Beside it: what is checked before transformers is imported (:mod:`~hf_optbench.run.preflight`, the directory lock in
:mod:`~hf_optbench.run.lock`), the output directory (:mod:`~hf_optbench.run.output`), summary.json
(:mod:`~hf_optbench.run.summary`), training time over resumed processes (:mod:`~hf_optbench.run.segments`), code
provenance, console progress, the stock-Trainer hooks of the Python API (:mod:`~hf_optbench.run.trainer`), tracker
config, eval accuracy and the learning-rate finder.
"""
