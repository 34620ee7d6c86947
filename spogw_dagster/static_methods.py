"""The names of the static workflows `spogw baseline` scores (their code: `evaluation.baseline_workflow`).

Names only, so that the CLI's parser can offer them without importing the evaluation stack at start-up.
"""

# AFlow's static baselines, written in the workflow language
BASELINE_METHODS = ("io", "cot", "cot_sc", "self_refine", "multipersona")
# Static structures of the code operators, measured beside the baselines to find the headroom a generator can
# learn (is there a workflow clearly above IO on this executor? docs/methods.md): name -> (code_generate calls,
# whether `test` checks the result); one call goes straight to `test`, several through `sc_ensemble` first.
STRUCTURES: dict[str, tuple[int, bool]] = {"gen_test": (1, True), "sc3": (3, False), "sc3_test": (3, True),
                                           "sc5": (5, False)}
# Structures that spend calls only where needed: one draft, returned when the public tests pass (`check`, no
# executor call); otherwise that many drafts in all through `sc_ensemble`, then `test` (sc3_test's tail).
ADAPTIVE_STRUCTURES: dict[str, int] = {"adaptive_sc3": 3}
CODE_STRUCTURES = tuple(STRUCTURES) + tuple(ADAPTIVE_STRUCTURES)  # defined for code benchmarks only
STATIC_METHODS = BASELINE_METHODS + CODE_STRUCTURES
