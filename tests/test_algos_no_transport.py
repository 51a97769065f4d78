"""Algorithms know no sockets: nothing under embodyrl/algos imports the transport (or ZeroMQ).

The distributed algorithms take an exchange function; the runner
(:mod:`embodyrl.learner.consensus`) plugs peer links in."""

import ast
from pathlib import Path

ALGOS = Path(__file__).resolve().parents[1] / "embodyrl" / "algos"
FORBIDDEN = ("embodyrl.transport", "zmq")


def _package(path: Path) -> list[str]:
    return ["embodyrl", *path.relative_to(ALGOS.parent).parent.parts]


def _imports(source: str, package: list[str]) -> list[str]:
    """Absolute names of what ``source`` imports (relative imports resolved from ``package``)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            names += [module, *(f"{module}.{alias.name}" for alias in node.names)]
    return names


def test_no_algorithm_imports_the_transport():
    offending = [f"{path.relative_to(ALGOS.parent.parent)}: {name}"
                 for path in sorted(ALGOS.rglob("*.py")) for name in _imports(path.read_text(), _package(path))
                 if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)]
    assert offending == []


def test_the_check_sees_a_relative_import_of_the_transport():
    # the check itself: the relative import the distributed algorithms once had
    package = _package(ALGOS / "dqn" / "distributed.py")
    assert package == ["embodyrl", "algos", "dqn"]
    assert "embodyrl.transport.peers.PeerLink" in _imports("from ...transport.peers import PeerLink\n", package)
    assert "embodyrl.algos.consensus" in _imports("from ..consensus import Exchange\n", package)
