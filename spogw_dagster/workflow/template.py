"""The workflow language: the template, the operators offered per benchmark family, the generator prompt.

A workflow is the source of one class `Workflow` with an `async def run(self)` method. The operators are
bound to the query by the runtime and appear as `self.<operator>`; the workflow never sees the query text
(ScoreFlow's shape: the generator writes a workflow *for* a query, not one that embeds it).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass


@dataclass(frozen=True)
class OperatorSpec:
    name: str
    signature: str  # as shown to the generator
    doc: str
    params: tuple[str, ...]  # accepted keyword/positional parameter names, in order
    required: int  # how many leading params are required


OPERATORS: dict[str, OperatorSpec] = {
    s.name: s
    for s in [
        OperatorSpec("custom", "custom(instruction: str) -> str",
                     "Ask the executor LLM to answer the query following your instruction.", ("instruction",), 1),
        OperatorSpec("answer_generate", "answer_generate() -> str",
                     "Think step by step, then give a short final answer to the query.", (), 0),
        OperatorSpec("code_generate", "code_generate(instruction: str) -> str",
                     "Write a Python solution to the coding task following your instruction; returns code.",
                     ("instruction",), 1),
        OperatorSpec("programmer", "programmer(analysis: str = '') -> str",
                     "Write and run a Python program that computes the answer; returns the code and its output.",
                     ("analysis",), 0),
        OperatorSpec("sc_ensemble", "sc_ensemble(solutions: list[str]) -> str",
                     "Self-consistency: return the solution that agrees with most of the others.",
                     ("solutions",), 1),
        OperatorSpec("review", "review(solution: str) -> str",
                     "Critique a solution and return a revised solution.", ("solution",), 1),
        OperatorSpec("test", "test(solution: str) -> str",
                     "Run the task's public example tests on a code solution and fix it if they fail; returns code.",
                     ("solution",), 1),
        OperatorSpec("check", "check(solution: str) -> str",
                     "Run the task's public example tests on a code solution; returns \"pass\" or \"fail\".",
                     ("solution",), 1),
    ]
}

# Operators that write a solution from the query (the others pass their inputs on: test, review, sc_ensemble).
# A workflow whose answer is not one of their outputs did not attempt the task (`dataflow`, `rewards.is_trivial`).
PRODUCING_OPERATORS = frozenset({"custom", "answer_generate", "code_generate", "programmer"})

# Operators whose output is a verdict on their input, not a solution: a workflow branches on it (spend more calls
# only where a draft fails); returned as the answer it is the workflow's own text (`dataflow`, `provenance`).
VERDICT_OPERATORS = frozenset({"check"})

# The operators each family's prompts show (and so the prompts' text and hashes).
FAMILY_OPERATORS: dict[str, tuple[str, ...]] = {
    "code": ("code_generate", "sc_ensemble", "test"),
    "math": ("custom", "programmer", "sc_ensemble", "review"),
    "qa": ("custom", "answer_generate", "sc_ensemble", "review"),
}
# Offered to every workflow of the family but shown by no prompt: the static structures that branch on the public
# tests use them (`static_methods.STRUCTURES`); showing them to the generator would change every prompt.
UNPROMPTED_OPERATORS: dict[str, tuple[str, ...]] = {"code": ("check",)}

# The starting workflow per family: one executor call (what the generator is asked to improve on).
TEMPLATES: dict[str, str] = {
    "code": (
        "class Workflow:\n"
        "    async def run(self):\n"
        "        solution = await self.code_generate(instruction=\"Write the function.\")\n"
        "        return solution\n"
    ),
    "math": (
        "class Workflow:\n"
        "    async def run(self):\n"
        "        solution = await self.custom(instruction=\"Solve the problem step by step.\")\n"
        "        return solution\n"
    ),
    "qa": (
        "class Workflow:\n"
        "    async def run(self):\n"
        "        solution = await self.answer_generate()\n"
        "        return solution\n"
    ),
}

# Few-shot examples for the completion-style generator prompt. Small models copy the shape of what they
# see, so each example is short, valid and ends with `return`.
FEW_SHOT: dict[str, tuple[str, ...]] = {
    "code": (
        "        a = await self.code_generate(instruction=\"Think step by step, then write the code.\")\n"
        "        b = await self.code_generate(instruction=\"Write simple, correct code.\")\n"
        "        c = await self.code_generate(instruction=\"Handle edge cases carefully.\")\n"
        "        best = await self.sc_ensemble(solutions=[a, b, c])\n"
        "        return await self.test(solution=best)\n",
        "        solution = await self.code_generate(instruction=\"Write the function.\")\n"
        "        return await self.test(solution=solution)\n",
        "        solutions = []\n"
        "        for i in range(3):\n"
        "            solutions.append(await self.code_generate(instruction=\"Write the code.\"))\n"
        "        return await self.sc_ensemble(solutions=solutions)\n",
    ),
    "math": (
        "        a = await self.custom(instruction=\"Solve step by step.\")\n"
        "        b = await self.programmer(analysis=a)\n"
        "        best = await self.sc_ensemble(solutions=[a, b])\n"
        "        return await self.review(solution=best)\n",
        "        solution = await self.programmer(analysis=\"Compute the answer.\")\n"
        "        return solution\n",
        "        solutions = []\n"
        "        for i in range(3):\n"
        "            solutions.append(await self.custom(instruction=\"Think step by step.\"))\n"
        "        return await self.sc_ensemble(solutions=solutions)\n",
    ),
    "qa": (
        "        a = await self.answer_generate()\n"
        "        b = await self.custom(instruction=\"Find the key facts, then answer briefly.\")\n"
        "        best = await self.sc_ensemble(solutions=[a, b])\n"
        "        return await self.review(solution=best)\n",
        "        solution = await self.answer_generate()\n"
        "        return await self.review(solution=solution)\n",
        "        solutions = []\n"
        "        for i in range(3):\n"
        "            solutions.append(await self.answer_generate())\n"
        "        return await self.sc_ensemble(solutions=solutions)\n",
    ),
}

# The anchored style (what `anchored` shows): the starting workflow as the thing to improve on, then better
# structures built from it. No example returns a constant or passes one to an operator: small generators copy
# what they see, and the earlier examples' `return await self.test(...)` primed `test(solution=<a literal>)`.
ANCHORED_EXAMPLES: dict[str, tuple[str, ...]] = {
    "code": (
        "        solution = await self.code_generate(instruction=\"Write the function.\")\n"
        "        return await self.test(solution=solution)\n",
        "        solutions = []\n"
        "        for i in range(3):\n"
        "            solutions.append(await self.code_generate(instruction=\"Write the function.\"))\n"
        "        best = await self.sc_ensemble(solutions=solutions)\n"
        "        return await self.test(solution=best)\n",
    ),
    "math": FEW_SHOT["math"][:2],
    "qa": FEW_SHOT["qa"][:2],
}

# What each operator really does, for the anchored prompt (the signatures' one-line docs say less).
ANCHORED_DOCS: dict[str, str] = {
    "code_generate": "the executor reads the task and writes a complete solution, following your instruction",
    "sc_ensemble": ("picks one of several solutions: one that passes the task's example tests, else the one most "
                    "agree on"),
    "test": "runs the task's example tests on a solution; if one fails, the executor rewrites it (2 tries)",
    "custom": "the executor answers the task, following your instruction",
    "answer_generate": "the executor thinks step by step and gives a short answer",
    "programmer": "the executor writes and runs a program that computes the answer",
    "review": "the executor checks a solution and returns a corrected one",
    "check": "runs the task's example tests on a solution: \"pass\" or \"fail\" (no executor call)",
}

WORKFLOW_HEADER = "class Workflow:\n    async def run(self):\n"
# The generator's completion is cut here: the next example would start with this line. Any comment at column 0
# ends the workflow's body: 37 of run F's 54 valid completions (before this stop) went on past the body with
# "# Example workflow 5 ...", tokens the trainer credited with the workflow's advantage and the sampler paid for.
GENERATOR_STOP = ("\nclass ", "\n#", "\n```", "\n\n\n")


def prompted_operators(family: str) -> tuple[str, ...]:
    """The operators the family's prompts show."""
    try:
        return FAMILY_OPERATORS[family]
    except KeyError:
        raise ValueError(f"unknown benchmark family {family!r}; expected one of {sorted(FAMILY_OPERATORS)}") from None


def operator_names(family: str) -> tuple[str, ...]:
    """Every operator a workflow of the family may call (the validator's and the runtime's list)."""
    return prompted_operators(family) + UNPROMPTED_OPERATORS.get(family, ())


def operator_help(family: str) -> str:
    lines = []
    for name in prompted_operators(family):
        spec = OPERATORS[name]
        lines.append(f"#   await self.{spec.signature}  -- {spec.doc}")
    return "\n".join(lines)


def _task_comment(question: str, max_chars: int = 600) -> str:
    q = " ".join(question.split())
    if len(q) > max_chars:
        q = q[: max_chars - 3] + "..."
    return f"# Task: {q}"


# What the generator is shown besides the operators (generator.prompt):
#   examples     three whole example workflows (the default; small models copy their shape, and often them)
#   one_example  one of them, a different one per query (chosen by a hash of the query): less to copy verbatim
#   operators    no workflow at all: the operators' documentation and how they combine, in words
#   anchored     the starting workflow as what to improve on, operators described as they behave, two better
#                structures, and the task as a short summary (no signature or example values to copy)
PROMPT_STYLES = ("examples", "one_example", "operators", "anchored")

COMPOSITION_NOTES = (
    "# How operators combine: call a solution-writing operator several times (different instructions, or in a\n"
    "# loop) and pass the list to sc_ensemble; pass a solution to the checking or revising operators; store\n"
    "# results in variables; return one solution string."
)


def _example_index(question: str, n: int) -> int:
    return zlib.crc32(question.encode("utf-8", "replace")) % n


def generator_prompt(family: str, question: str, style: str = "examples") -> str:
    """Completion-style prompt for the generator, ending with the workflow header so the model writes the body.

    Designed for small models: plain completion, few-shot workflows (`style`, see PROMPT_STYLES), the class
    header and the body's indentation prefilled. The model's completion is the method body;
    `assemble_workflow` turns it back into a full class.
    """
    if style not in PROMPT_STYLES:
        raise ValueError(f"unknown generator prompt style {style!r}; expected one of {', '.join(PROMPT_STYLES)}")
    if style == "anchored":
        return anchored_prompt(family, question)
    parts = [
        "# Workflows are Python classes that solve a task by calling these operators (and nothing else):",
        operator_help(family),
        "# A workflow must not contain task-specific facts; it must end with `return`.",
        "",
    ]
    shown = list(enumerate(FEW_SHOT[family]))
    if style == "one_example":
        shown = [shown[_example_index(question, len(shown))]]
    elif style == "operators":
        shown = []
        parts += [COMPOSITION_NOTES, ""]
    for k, (i, body) in enumerate(shown):
        parts.append(f"# Example workflow {k + 1}")
        parts.append(WORKFLOW_HEADER + body)
    parts.append(_task_comment(question))
    parts.append(WORKFLOW_HEADER + "        ")
    return "\n".join(parts)


def task_summary(family: str, question: str, max_chars: int = 240) -> str:
    """The task in a few words of prose: for code, the docstring's text without its example lines (`>>>`,
    outputs) and without the signature, so that the generator is not primed with values to pass around."""
    text = question
    if family == "code":
        m = re.search(r'("""|\'\'\')(.*?)(\1|$)', question, re.S)
        doc = m.group(2) if m else question
        keep = []
        for line in doc.splitlines():
            t = line.strip()
            if t.startswith(">>>") or (keep and not t):
                break
            if t:
                keep.append(t)
        text = " ".join(keep) or doc
    q = " ".join(text.split())
    return q if len(q) <= max_chars else q[: max_chars - 3] + "..."


def anchored_prompt(family: str, question: str) -> str:
    """The `anchored` prompt: improve on the starting workflow (ScoreFlow and AFlow anchor on a template). The
    task comes first, as what the executor will be asked, and the prompt ends on workflows, not on the task: a
    coder model shown a task last writes its solution instead of a workflow (measured on validation)."""
    ops = [f"#   await self.{OPERATORS[n].signature}\n#       {ANCHORED_DOCS[n]}" for n in prompted_operators(family)]
    parts = [
        f"# The executor LLM will be asked to solve this task: {task_summary(family, question)}",
        "# Write a workflow: a Python class whose run() gets the executor's solution through these operators:",
        *ops,
        "# The workflow never sees the task and never solves it itself; it only calls operators. Instructions are",
        "# short advice in plain English.",
        "",
        "# Example workflow 1 (the starting workflow: one executor call)",
        TEMPLATES[family].rstrip("\n"),
        "",
    ]
    for k, body in enumerate(ANCHORED_EXAMPLES[family], start=2):
        parts.append(f"# Example workflow {k} (built from it)")
        parts.append(WORKFLOW_HEADER + body)
    # the last slot is one more example: a small model completes it in the examples' shape
    parts.append(f"# Example workflow {len(ANCHORED_EXAMPLES[family]) + 2} (built from it, for this task)")
    parts.append(WORKFLOW_HEADER + "        ")
    return "\n".join(parts)


def shown_workflows(family: str, style: str) -> tuple[str, ...]:
    """The method bodies of the workflows `generator_prompt(family, _, style)` shows, in the prompt's order."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"unknown generator prompt style {style!r}; expected one of {', '.join(PROMPT_STYLES)}")
    if style == "anchored":
        return (TEMPLATES[family][len(WORKFLOW_HEADER):], *ANCHORED_EXAMPLES[family])
    if style == "examples":
        return FEW_SHOT[family]
    return ()  # one_example shows a different one per query; operators shows none


def as_completion(body: str) -> str:
    """A method body (8-space lines) written the way the generator completes the prompt's prefilled 8 spaces: a
    leading space (the tokenizer gives the first word its own), then every line one column right (Qwen2.5-Coder
    wrote 255 of 256 distinct training completions so). Its tokens are then the ones the generator samples."""
    lines = [" " + line if line.strip() else line for line in body.rstrip("\n").split("\n")]
    return "\n".join(lines)[8:] + "\n"


def assemble_workflow(completion: str) -> str:
    """Rebuild the full class from a completion of `generator_prompt` (which prefilled 8 spaces)."""
    return WORKFLOW_HEADER + "        " + completion


def _turn_prompt(prompt: str, workflow: str, title: str, notes: str, ask: str) -> str:
    """The prompt of a later turn: `prompt` up to and including its task line (a `generator_prompt` or an
    earlier turn's prompt: prompts do not grow with the turns), then `workflow` and `notes` as comments, then
    the header again, so the generator writes the body (completion-style, as `generator_prompt`)."""
    head = prompt[: prompt.index("# Task: ")] if "# Task: " in prompt else prompt
    task_line = prompt[prompt.index("# Task: "):].split("\n", 1)[0] if "# Task: " in prompt else ""
    shown = "\n".join("# | " + line for line in workflow.rstrip("\n").split("\n"))
    commented = "\n".join("# " + line for line in notes.strip().split("\n"))
    return "\n".join([head.rstrip("\n"), "", task_line, "# Previous workflow:", shown, title, commented,
                      ask, WORKFLOW_HEADER + "        "])


def refinement_prompt(prompt: str, workflow: str, feedback: str) -> str:
    """W4S's next turn: the state's workflow and the feedback of running it on example tasks."""
    return _turn_prompt(prompt, workflow, "# Feedback from running it on example tasks:", feedback,
                        "# Write an improved workflow for the task.")


def repair_prompt(prompt: str, workflow: str, error: str) -> str:
    """W4S's self-check: a workflow the validator rejected, its error, and the request to write it again."""
    return _turn_prompt(prompt, workflow, "# The validator rejected it:", error,
                        "# Write the workflow again, with that fixed.")
