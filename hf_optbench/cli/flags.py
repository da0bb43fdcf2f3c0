"""One flag style for every subcommand: underscores, as in a recipe and in ``hf-optbench run``.

Why underscores: ``run`` takes TrainingArguments' and our dataclasses' field names (``--output_dir``,
``--per_device_train_batch_size``), the same keys a recipe holds, and must keep them; HfArgumentParser, which parses
them, accepts the hyphen spelling of each as an alias (``--output-dir``). Every other subcommand follows the same
rule: the underscore spelling is the one the help shows, and the hyphen spelling (the old one of ``sweep``, ``report``,
``memory``, ...) still works, hidden. Names renamed for the same reason (``memory --model`` and ``optimizers --size``
are ``--model_size`` as in a recipe) keep their old names as hidden aliases too.

Why before argparse rather than as extra option strings: argparse prints every option string in the help and in its
errors, and a required option given under an alias would not count as given.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


def canonical_flags(argv: list[str], known: Collection[str], aliases: Mapping[str, str] | None = None) -> list[str]:
    """``argv`` with each long option spelled as the parser knows it: an old name in ``aliases`` becomes its new
    one, and a hyphen spelling of a known underscore option becomes that option (``--output-dir=x`` ->
    ``--output_dir=x``). Tokens after ``--``, values and unknown options are left for argparse to judge."""
    aliases = dict(aliases or {})
    out: list[str] = []
    for i, tok in enumerate(argv):
        if tok == "--":
            return out + argv[i:]
        if not tok.startswith("--") or tok in known:
            out.append(tok)
            continue
        name, eq, value = tok.partition("=")
        name = aliases.get(name, name)
        underscored = "--" + name[2:].replace("-", "_")
        if name not in known and underscored in known:
            name = underscored
        out.append(name + eq + value)
    return out
