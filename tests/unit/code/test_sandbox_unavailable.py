"""Where the sandbox cannot run (here: a worker that is not root, as on a Kubernetes
node without the needed privileges), a code rollout is `error` with the reason and
a count, never run unsandboxed and never a pass. A real unprivileged process."""

from __future__ import annotations

import json
import os
import sys
import textwrap

CHILD = textwrap.dedent("""
    import json, os
    from workers.code.grade import grade_code
    from workers.code.sandbox import UNAVAILABLE, CodeSandbox
    from workers.code.suite import StdioCase, TestSuite
    # after the imports: the interpreter lives under /root, which is 0700
    os.setgroups([]); os.setgid(65534); os.setuid(65534)
    case = StdioCase(stdin="", expected_stdout="1\\n")
    suite = TestSuite(mode="stdio", stdio=(case,))
    box = CodeSandbox()
    verdict = grade_code("print(1)", suite, sandbox=box)
    print(json.dumps([verdict.to_dict(), sum(UNAVAILABLE.values())]))
""")


def test_unavailable_sandbox_gives_error_with_a_reason_and_a_count():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a plain child process that gives up root, then grades
        os.close(read)
        os.dup2(write, 1)
        os.execv(sys.executable, [sys.executable, "-c", CHILD])
    os.close(write)
    with os.fdopen(read) as out:
        text = out.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    verdict, unavailable = json.loads(text)
    assert verdict["status"] == "error"
    assert verdict["correct"] is False
    assert verdict["kind"] == "code"
    assert "root" in verdict["reason"]
    assert unavailable == 1
