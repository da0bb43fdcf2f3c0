"""``hf-optbench optimizers``: the registry's optimizers with their cited defaults for one model size."""

from __future__ import annotations

import json
from typing import Any

from hf_optbench.cli import ArgumentParser
from hf_optbench.config.checks import adam_family
from hf_optbench.models import size_names
from hf_optbench.optim.registry import CITATIONS, OPTIMIZERS, optimizer_defaults, size_class


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, tuple):
        return "(" + ", ".join(_fmt(v) for v in value) + ")"
    return str(value)


def _table_row(r: dict[str, Any]) -> tuple[str, ...]:
    """One line of the text table: name, implementation, lr, wd, the telling hyperparameters, notes."""
    d = r["defaults"]
    other = _fmt(d["betas"]) if "betas" in d else ", ".join(
        f"{k}={_fmt(d[k])}" for k in ("momentum", "beta1", "adjust_lr_fn") if k in d)
    if "rho" in d:
        other += f", rho={_fmt(d['rho'])}"
    notes = ", ".join(n for n, on in (("CUDA only", r["requires_cuda"]), ("no schedule", r["schedule_free"]),
                                      ("tune first", r["needs_tuning"])) if on)
    return (r["name"], r["implementation"], _fmt(d["learning_rate"]), _fmt(d["weight_decay"]), other, notes)


DESCRIPTION = ("The registry's optimizers: name, implementation, the cited default hyperparameters for one model "
               "size, and their sources.")


def main(argv: list[str] | None = None) -> int:
    """``hf-optbench optimizers [--model_size SIZE] [--json]``: print :data:`DESCRIPTION`'s table (the help shows
    DESCRIPTION, plain text: argparse prints a description as it is)."""
    parser = ArgumentParser(prog="hf-optbench optimizers", description=DESCRIPTION, aliases={"--size": "--model_size"})
    parser.add_argument("--model_size", default="gpt2",
                        help=f"model size whose defaults to show (default gpt2): {size_names()}")
    parser.add_argument("--json", action="store_true", help="print JSON (all fields, with full citations)")
    args = parser.parse_args(argv)
    rows = []
    family = adam_family()
    for name, spec in OPTIMIZERS.items():
        d = optimizer_defaults(name, args.model_size)
        rows.append({"name": name, "implementation": spec.implementation, "package": spec.package,
                     "requires_cuda": spec.requires_cuda, "schedule_free": spec.schedule_free,
                     "needs_tuning": spec.needs_tuning, "description": spec.description, "defaults": d,
                     "takes_adam_arguments": name in family})
    if args.json:
        print(json.dumps({"size": args.model_size, "size_class": size_class(args.model_size), "optimizers": rows},
                         indent=2, default=list))
        return 0
    print(f"Defaults for model size '{args.model_size}' (size class {size_class(args.model_size)}); `--json` for citations.\n")
    header = ("name", "implementation", "lr", "wd", "betas / other", "notes")
    table = [_table_row(r) for r in rows]
    widths = [max(len(str(row[i])) for row in [header, *table]) for i in range(len(header))]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)))
    print("  ".join("-" * w for w in widths))
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)))
    print("\nSources:")
    for key, text in CITATIONS.items():
        print(f"  [{key}] {text}")
    print(f"\nTrainingArguments' adam_beta1 / adam_beta2 / adam_epsilon set betas / eps of {', '.join(family)} "
          "(recorded as source 'user'); the others refuse them: set their arguments with optimizer_kwargs, e.g. "
          "--optimizer_kwargs '{\"betas\": [0.9, 0.99]}'.")
    print("\nAny torch.optim or pytorch_optimizer class also works by dotted path (e.g. torch.optim.RAdam); it has "
          "no cited default, so set learning_rate.")
    return 0
