"""The public surface: every documented name is importable from ``qftrio``."""

from __future__ import annotations

import subprocess
import sys

import qftrio

DOCUMENTED = [
    "Registry", "Job", "Lease", "QueueStats", "WorkerInfo", "Status", "Workflow", "WorkflowStatus", "HttpTransport", "Worker", "WorkerEvent", "open_worker", "Client", "SyncClient",
    "QftrioError", "ApiError", "PermanentError", "Snooze", "RetryIn", "TransportError", "NotFound", "Conflict", "Unauthorized",
    "Forbidden", "InvalidInput", "BadRequest", "PayloadTooLarge", "Unavailable", "UnexpectedAnswer", "ConfigError",
]  # fmt: skip


def test_documented_names_are_exported() -> None:
    missing = [name for name in DOCUMENTED if not hasattr(qftrio, name)]
    assert not missing
    assert sorted(qftrio.__all__) == sorted(DOCUMENTED)


def test_public_names_show_their_public_module() -> None:
    assert qftrio.Job.__module__ == "qftrio"
    assert qftrio.Registry.__module__ == "qftrio"
    assert qftrio.SyncClient.__module__ == "qftrio"


def test_importing_qftrio_does_not_load_the_server() -> None:
    code = "import sys, qftrio; print(any(m.startswith(('quart', 'qftrio.server.app', 'psycopg')) for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_worker_package_never_imports_the_server() -> None:
    # The server runs workers in-process (serve --handlers), so the
    # dependency goes one way only: the worker knows its Transport
    # interface, and the server implements it.
    import ast
    from pathlib import Path

    package = Path(qftrio.__file__).parent / "worker"
    offenders = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            offenders += [f"{path.name}: {n}" for n in names if n.startswith(("..server", "qftrio.server"))]
    assert offenders == []
