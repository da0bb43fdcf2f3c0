"""cli/sweep.py's ending: a restarted sweep with failed runs exits 1 and names the flag that reruns them."""

from __future__ import annotations

import pytest

from hf_optbench import cli
from hf_optbench.study import sweep


@pytest.mark.parametrize(("counts", "rc", "named"), [
    ({"completed": 3, "failed": 1}, 1, "1 failed: each run's stdout.log says why; run the same command with "
                                       "--retry_failed"),
    ({"completed": 3, "oom": 2}, 1, "2 oom"),
    ({"completed": 4}, 0, None),
])
def test_failed_runs_name_retry_failed(counts: dict, rc: int, named: str | None, monkeypatch, capsys) -> None:
    monkeypatch.setattr(sweep, "run_sweep", lambda *_a, **_k: counts)
    assert cli.main(["sweep", "any.yaml"]) == rc
    err = capsys.readouterr().err
    assert (named in err) if named else "--retry_failed" not in err, err
