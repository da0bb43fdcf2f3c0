"""Data layer: where tokens come from and how they are cut (above ``config``, below ``measure``).

- ``sources``: local files (incl. the c4 layout), Hub streaming, the bundled Thai sample; iterating documents.
- ``tokenizers``: load exactly the named tokenizer (never a silent fallback), train one offline.
- ``pipeline``: tokenize, split by document, pack into blocks -> :func:`~hf_optbench.data.pipeline.prepare_data`.
- ``split``: which document goes to train, eval or the tuning split, and the checks that each is usable.
- ``cache``: the fingerprint and the memory-mapped Arrow cache behind ``prepare_data``, checksummed per file.
- ``synthetic`` / ``difficulty``: a hidden-Markov token source of tunable difficulty, and gzip's measure of it.
"""
