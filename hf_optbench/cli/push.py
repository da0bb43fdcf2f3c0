"""``hf-optbench push RUN_DIR --repo_id ID [--public] [--dry_run]``: stage, check and upload a run to the Hub.

The token comes from ``HF_TOKEN`` or ``hf auth login`` (never from the command line: it would land in the shell
history and the process list); the work is done by :mod:`hf_optbench.publish.hub`. A token-like option (``--token``,
``--hub-token``...) is refused by name, and no error message repeats the value of such an option or anything
shaped like a token (argparse quotes the offending arguments in its errors).
"""

from __future__ import annotations

import sys

from hf_optbench.cli import ArgumentParser
from hf_optbench.errors import OptBenchError
from hf_optbench.publish.redact import is_secret_name, redact_text, secret_option_values


class _RedactingParser(ArgumentParser):
    """One-line errors (hf_optbench.cli.ArgumentParser) that never echo a secret given on the command line."""

    secrets: list[str] = []

    def error(self, message: str) -> None:  # type: ignore[override]
        super().error(redact_text(message, self.secrets))


def _refuse_token_options(argv: list[str]) -> None:
    for tok in argv:
        name = tok.partition("=")[0]
        if tok.startswith("-") and is_secret_name(name):
            raise OptBenchError(
                f"push takes no {name} option: a token on the command line lands in the shell history and the process "
                "list. Set HF_TOKEN in the environment or run `hf auth login`."
            )


def _parser(secrets: list[str] | None = None) -> ArgumentParser:
    p = _RedactingParser(
        prog="hf-optbench push",
        description="Upload a run (safetensors weights, config, tokenizer, benchmark model card) to the Hub. "
                    "The token comes from HF_TOKEN or `hf auth login`, never from the command line.",
    )
    p.add_argument("run_dir", help="the run's output_dir (holds summary.json)")
    p.add_argument("--repo_id", required=True, help="target repository, 'user-or-org/name'")
    p.add_argument("--public", action="store_true", help="create the repository public (default: private)")
    p.add_argument("--dry_run", action="store_true", help="stage and check the upload folder, upload nothing")
    p.add_argument("--stage_dir", default=None,
                   help="where to stage, kept afterwards (default: a temporary folder, removed; the run directory is "
                        "never written). An existing folder is used only when empty or holding exactly what an earlier "
                        "staging wrote (its manifest); anything else in it is refused by name, never removed")
    p.add_argument("--commit_message", default=None, help="commit message on the Hub")
    p.secrets = list(secrets or [])
    return p


def main(argv: list[str] | None = None) -> int:
    """Stage and upload (or, with --dry-run, only stage and list) a run directory; 0 on success."""
    from hf_optbench.publish.card import card_gaps
    from hf_optbench.publish.hub import check_repo_id, push_run
    from hf_optbench.publish.stage import STAGE_MARKER, staged_upload

    argv = list(sys.argv[1:] if argv is None else argv)
    secrets = secret_option_values(argv)
    try:
        _refuse_token_options(argv)
        args = _parser(secrets).parse_args(argv)
    except OptBenchError as exc:  # belt and braces: whatever the message, it never carries those values
        raise OptBenchError(redact_text(str(exc), secrets)) from None
    if args.dry_run:
        check_repo_id(args.repo_id)  # what the push itself would refuse
        with staged_upload(args.run_dir, args.stage_dir, repo_id=args.repo_id) as staged:
            names = sorted(p.name for p in staged.iterdir() if p.name != STAGE_MARKER)
        where = f"in {staged}" if args.stage_dir else "(in a temporary folder, removed)"
        print(f"staged {len(names)} files {where}: checks passed, nothing uploaded:")
        for name in names:
            print(f"  {name}")
        _print_gaps(card_gaps(args.run_dir))
        return 0
    url = push_run(args.run_dir, args.repo_id, private=not args.public, stage_dir=args.stage_dir,
                   commit_message=args.commit_message)
    print(f"uploaded to https://huggingface.co/{args.repo_id} ({'public' if args.public else 'private'}): {url}")
    _print_gaps(card_gaps(args.run_dir))
    return 0


def _print_gaps(gaps: list[str]) -> None:
    """What the upload lacks for a reproducible card, one ``note:`` line each: the card says so too, and a reader
    of the dry run should not take "checks passed" for "complete"."""
    for gap in gaps:
        print(f"note: {gap}")
