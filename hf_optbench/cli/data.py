"""``hf-optbench data difficulty``: gzip compression ratio of a data source, or a search for synthetic alphas.

The measurements live in :mod:`hf_optbench.data.difficulty`; this module only parses flags and prints.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from hf_optbench.cli import wrap_help
from hf_optbench.cli.flags import canonical_flags
from hf_optbench.errors import OptBenchError

USAGE = "usage: hf-optbench data difficulty [--data_source ...] [--target_ratio 0.75] [--json]"
HELP = wrap_help(f"""{USAGE}

Data tools. `difficulty`: the gzip compression ratio of a data source (the recipe's DataArguments
flags), or with --target_ratio a search for the synthetic source's alphas that give that ratio (0.75:
hard but learnable). `hf-optbench data difficulty --help` lists every flag.""")


def _parser() -> Any:
    """DataArguments' flags (as in a recipe) plus the measurement's own."""
    from transformers import HfArgumentParser

    from hf_optbench.config.data_args import DataArguments

    class _Parser(HfArgumentParser):
        """One line on a bad flag (exit 2), not argparse's usage block."""

        def error(self, message: str) -> None:  # type: ignore[override]
            raise OptBenchError(f"{message}. `hf-optbench data difficulty --help` lists the flags.")

    parser = _Parser(DataArguments, prog="hf-optbench data difficulty",
                     description="gzip compression ratio of a data source; alpha search for a target ratio.")
    parser.add_argument("--target_ratio", type=float, default=None,
                        help="search synthetic alphas that give this token ratio (hard but learnable: 0.75)")
    parser.add_argument("--tune", choices=("both", "alpha_x", "alpha_z"), default="both",
                        help="which concentration the search varies (both: alpha_x = alpha_z)")
    parser.add_argument("--sample_tokens", type=int, default=1 << 18, help="tokens sampled per measurement")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    for action in parser._actions:  # one spelling shown per flag, as every subcommand (hf_optbench.cli.flags)
        hidden = [o for o in action.option_strings if o.startswith("--") and "-" in o[2:]]
        for option in hidden:
            parser._option_string_actions.pop(option)
        action.option_strings = [o for o in action.option_strings if o not in hidden]
    return parser


# What each printed number is, with its unit (hf_optbench/data/difficulty.py defines them).
MEANINGS = {
    "token_ratio": "gzip bits per token / log2(vocab): 1 = no structure, ~0.75 hard but learnable",
    "byte_ratio": "gzip bytes / UTF-8 bytes of the text",
    "ratio": "the token ratio the found alphas give",
    "target_ratio": "the token ratio searched for",
    "alpha_x": "Dirichlet concentration of the synthetic source's emission rows (smaller: sharper)",
    "alpha_z": "Dirichlet concentration of its hidden-state transition rows (smaller: sharper)",
    "tokens": "tokens sampled",
    "vocab_size": "token ids",
    "documents": "documents read",
    "bytes": "UTF-8 bytes read",
}


def main(argv: list[str] | None = None) -> int:
    """``hf-optbench data difficulty [DataArguments flags] [--target_ratio R] [--tune both|alpha_x|alpha_z]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(HELP)
        return 0
    if not argv or argv[0] != "difficulty":
        got = f"unknown data tool '{argv[0]}'" if argv else "no data tool given"
        raise OptBenchError(f"{got}: the one tool is `difficulty`. {USAGE}")
    argv = ["--data_source" if a == "--source" else a for a in argv[1:]]
    from hf_optbench.data.difficulty import calibrate_alphas, source_difficulty

    parser = _parser()
    data_args, extra = parser.parse_args_into_dataclasses(args=canonical_flags(argv, parser._option_string_actions))
    if extra.target_ratio is not None:
        if data_args.data_source != "synthetic":
            raise OptBenchError("--target_ratio searches synthetic alphas: add --data_source synthetic.")
        result = calibrate_alphas(
            extra.target_ratio, tune=extra.tune, alpha_x=data_args.synthetic_alpha_x, alpha_z=data_args.synthetic_alpha_z,
            vocab_size=data_args.synthetic_vocab_size, hidden_nodes=data_args.synthetic_hidden_nodes,
            hidden_states=data_args.synthetic_hidden_states, seed=data_args.synthetic_seed, sample_tokens=extra.sample_tokens,
        )
    else:
        result = source_difficulty(data_args, sample_tokens=extra.sample_tokens)
    if extra.json:
        print(json.dumps(result, indent=2))
        return 0
    for key, value in result.items():
        if key == "evaluations":
            continue
        text = f"{value:.4g}" if isinstance(value, float) else f"{value}"
        meaning = MEANINGS.get(key)
        print(f"{key:>24}: {text}" + (f"  ({meaning})" if meaning else ""))
    if "alpha_x" in result and extra.target_ratio is not None:
        print(f"recipe lines: synthetic_alpha_x: {result['alpha_x']:.4g}\n              synthetic_alpha_z: {result['alpha_z']:.4g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
