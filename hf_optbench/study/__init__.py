"""Many runs: a sweep (sweep_spec -> sweep, launched by launch or slurm, recorded by sweep_state), the report
(analysis -> plots + tables -> report) and learning-rate tuning (tuning). The ``hf-optbench sweep|report|tune``
commands are in hf_optbench.cli."""
