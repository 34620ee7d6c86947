"""bench/advantage_mass.py: the advantage mass per workflow structure, on a group computed by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import polars as pl
import pytest

from spogw_dagster.core.hyperparams import CurationConfig

_PATH = Path(__file__).resolve().parents[1] / "bench" / "advantage_mass.py"
_spec = importlib.util.spec_from_file_location("bench_advantage_mass", _PATH)
am = sys.modules["bench_advantage_mass"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(am)

GEN_TEST = ("class Workflow:\n    async def run(self):\n        s = await self.code_generate(instruction='a')\n"
            "        return await self.test(solution=s)\n")
SC = ("class Workflow:\n    async def run(self):\n        xs = [await self.code_generate(instruction='b') for _ in "
      "range(3)]\n        best = await self.sc_ensemble(solutions=xs)\n        return await self.test(solution=best)\n")


def _rows(scores, answers, statuses, workflows) -> pl.DataFrame:
    n = len(scores)
    return pl.DataFrame({"iteration": [0] * n, "query_id": ["q"] * n, "sample_idx": list(range(n)),
                         "workflow": workflows, "prompt_group": [None] * n, "score": scores, "status": statuses,
                         "answer_score": answers},
                        schema_overrides={"prompt_group": pl.String})


def test_structure_and_variant_parsing():
    assert am.structure(GEN_TEST, "ok") == "code_generate->test"
    assert am.structure(SC, "ok") == "code_generate->sc_ensemble->test"
    assert am.structure(GEN_TEST, "invalid") == "<invalid>"
    assert am.parse_variant("answer_only,n=4,adv_std_floor=0.25") == (True, {"n": 4, "adv_std_floor": 0.25})
    assert am.parse_variant("valid_only,m=16") == (False, {"valid_only": True, "m": 16})
    with pytest.raises(SystemExit, match="not a number"):
        am.parse_variant("valid_only=true")
    assert am.parse_variant("") == (False, {})
    with pytest.raises(SystemExit, match="not name=value"):
        am.parse_variant("n4")


def test_mass_per_structure_by_hand():
    # one group of 4 (n = 4, t = 2: every member is kept). Ladder scores 1.0 (gen_test, right), 0.25 (sc, ran,
    # wrong), 0.05 and 0.05 (invalid): mean 0.3375, std (ddof 0) = sqrt((0.6625² + 0.0875² + 2·0.2875²) / 4)
    # = sqrt(0.152969) = 0.391112; advantages (s − mean) / (std + ε), ε = 1e-4:
    # gen_test 0.6625 / 0.391212 = +1.6935, sc −0.0875 / 0.391212 = −0.2237, each invalid −0.7349
    rows = _rows([1.0, 0.25, 0.05, 0.05], [1.0, 0.0, 0.0, 0.0], ["ok", "ok", "invalid", "invalid"],
                 [GEN_TEST, SC, "x = 1", "y = 2"])
    cfg = CurationConfig(m=4, n=4, t=2, g_max=1, tau_sim=1.0, tau_std=0.01)
    summary, by = am.advantage_mass(rows, cfg, answer_only=False)
    assert summary["groups_kept"] == 1 and summary["member_rows"] == 4
    assert by["code_generate->test"] == (1, pytest.approx(1.6935, abs=1e-4))
    assert by["code_generate->sc_ensemble->test"] == (1, pytest.approx(-0.2237, abs=1e-4))
    assert by["<invalid>"] == (2, pytest.approx(-1.4698, abs=1e-4))
    # answer only: scores 1, 0, 0, 0: mean 0.25, std sqrt((0.5625 + 3 · 0.0625) / 4) = 0.433013;
    # gen_test 0.75 / 0.433113 = +1.7317, the three others −0.25 / 0.433113 = −0.5772 each
    _, by = am.advantage_mass(rows, cfg, answer_only=True)
    assert by["code_generate->test"] == (1, pytest.approx(1.7317, abs=1e-4))
    assert by["<invalid>"] == (2, pytest.approx(-1.1544, abs=1e-4))
