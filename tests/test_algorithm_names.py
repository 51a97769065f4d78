"""No code picks an algorithm by comparing its name: names live in their package and the registry.

Fails when an algorithm's name ("ddpg", "td3", "sac", "rlpd", "crossq", "ppo", "dqn") appears as a string
literal (a whole string constant, f-strings' literal parts included) in Python under embodyrl/,
hal/ or envs/, outside embodyrl/algos/<its package>/ (td3 belongs to ddpg, rlpd to sac) and
embodyrl/algos/registry.py. What it does not look at:

* tests and docs (not scanned);
* docstrings, and any string standing alone as a statement: they document, they select nothing;
* the task-defaults table ``TASK_DEFAULTS`` in embodyrl/config.py (tuned values per task, keyed by
  config section and naming a task's algorithm, in one table): that assignment only;
* the benchmarks' names (``SHIPPED`` in embodyrl/bench/__init__.py): ``embodyrl bench crossq`` names
  what it measures and selects nothing.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWNER = {"ddpg": "ddpg", "td3": "ddpg", "sac": "sac", "rlpd": "sac", "crossq": "crossq", "ppo": "ppo",
         "dqn": "dqn"}
REGISTRY = Path("embodyrl/algos/registry.py")
EXEMPT_ASSIGNMENTS = {Path("embodyrl/config.py"): {"TASK_DEFAULTS"}, Path("embodyrl/bench/__init__.py"): {"SHIPPED"}}


def _exempt_nodes(tree: ast.AST, path: Path) -> set[int]:
    """Ids of the constants that document (statement strings) or sit in an exempt assignment."""
    exempt = set()
    names = EXEMPT_ASSIGNMENTS.get(path, set())
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            exempt.add(id(node.value))
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id in names for t in targets):
            exempt.update(id(n) for n in ast.walk(node))
    return exempt


def _misplaced(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse((root / path).read_text(), str(path))
    exempt = _exempt_nodes(tree, path)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in OWNER):
            continue
        home = Path("embodyrl/algos") / OWNER[node.value]
        if id(node) in exempt or path == REGISTRY or home in path.parents:
            continue
        found.append(f"{path}:{node.lineno}: {node.value!r}")
    return found


def _sources() -> list[Path]:
    return sorted(p.relative_to(ROOT) for folder in ("embodyrl", "hal", "envs") for p in (ROOT / folder).rglob("*.py"))


def test_algorithm_names_appear_only_in_their_package_and_the_registry():
    found = [hit for path in _sources() for hit in _misplaced(path)]
    assert not found, "algorithm names outside their package and the registry (ask the registry):\n" + \
        "\n".join(found)


def test_the_check_sees_literals_and_fstring_parts_but_not_docstrings(tmp_path):
    sample = Path("embodyrl/sample.py")
    (tmp_path / "embodyrl").mkdir()
    (tmp_path / sample).write_text('"""ppo in a docstring is fine."""\n'
                                   'def f(name):\n    """so is sac here"""\n'
                                   '    return name == "td3" or f"{name}" == "x" or f"rlpd" == name\n')
    assert [hit.split(": ")[1] for hit in _misplaced(sample, tmp_path)] == ["'td3'", "'rlpd'"]
