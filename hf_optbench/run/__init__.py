"""The one-run layer: a recipe in, a run directory out.

Read :mod:`hf_optbench.run.train` top to bottom: ``main`` -> ``train`` resolves the run's plan once
(:mod:`~hf_optbench.run.plan`: every value with its source, validated, and its identity) and hands it to each step,
called once. Beside it: what is checked before transformers is imported (:mod:`~hf_optbench.run.preflight`, the
directory lock in :mod:`~hf_optbench.run.lock`), the checkpoint a resume loads and the plan stamped into every
checkpoint (:mod:`~hf_optbench.run.identity`), the output directory (:mod:`~hf_optbench.run.output`), summary.json
and its provenance (:mod:`~hf_optbench.run.summary`), training time over resumed processes
(:mod:`~hf_optbench.run.segments`), console progress, the stock-Trainer hooks of the Python API
(:mod:`~hf_optbench.run.trainer`), eval accuracy and the learning-rate finder.
"""
