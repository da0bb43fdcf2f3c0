"""The report: a sweep directory's runs -> the verdict, tables, plots and exports.

:func:`hf_optbench.report.build.build_report` writes report.md (the answer), evidence.md, report.html, summary.csv,
runs.parquet and the plots from
:func:`hf_optbench.report.analysis.analyse` (records, comparability, targets, speedups, the verdict statistics of
:mod:`hf_optbench.measure.verdict`). It reads what :mod:`hf_optbench.study` (the sweeps and the tuner) wrote.
"""
