"""The code grader: a rollout's program run against its row's unit tests, in a sandbox.

What it owns: turning a code rollout (`response`, the row's tests, optional `prompt`
and `entry_point`) into a `Verdict` of kind "code" — `correct` only when every test
passed, else `wrong` with the tests passed, the total and the first failure;
`invalid_gold` for zero or malformed tests, `error` when the sandbox fails.

The trust boundary. Everything the model wrote is hostile and runs only inside a fresh
sandbox (own network, PID, mount and IPC namespaces, no host files, an empty
environment, hard rlimits, an unprivileged uid). The expected values and the pass/fail
decision never live in a process that ran model code: stdout is compared here
(`compare`), and call/assert tests run in a separate harness process that reaches the
model's function over a channel carrying plain data only (`plain`).

Modules, by side of the boundary:
- pure, no model code ever executed (stdlib only): `errors`, `program` (extract the
  program from the response), `suite` (read the row's tests into a `TestSuite`),
  `pickled` (LiveCodeBench's pickled tests, plain data only), `compare` (stdout and
  value comparison), `plain` (the channel codec; the sandbox imports it too),
  `describe` (a first failing test as text, for explanations and diffs);
- execution: the sandbox, the harness and the grading entry (see their docstrings).

Adding a test format: a reader in `suite._READERS` (its docstring lists the shapes
and their conventions), with a row of the new shape in
`tests/unit/code/test_inputs_suite.py`.
If the shape needs a new kind of check, add a mode to `suite.Mode` and teach the
harness to run it.

Adding a language: `program.extract_program` would take the language's fence names, a
`TestSuite` would carry the language, and the sandbox would need that language's
runtime mounted read-only and a runner for it. Stdio tests then work unchanged (the
comparison is language-neutral); call tests need a runner that speaks the plain-data
channel in that language; assert tests are Python source and stay Python-only.

Keep this module import-light: importing `workers.code` must not import the sandbox.
"""

from __future__ import annotations
