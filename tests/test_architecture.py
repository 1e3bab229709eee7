"""The shape of the library: layered imports with no cycle, modules of one size, the config layer
on top, and commands that nothing below them imports.

The import graph is read from the source (``ast``), so it counts every import statement of a
module: at the top, inside functions, and under ``TYPE_CHECKING``. An edge goes to the deepest
``jdml`` module an import names (``from jdml.a import b`` is an edge to ``jdml.a.b`` when that is a
module, else to ``jdml.a``). The import of a package's ``__init__`` that Python runs before any of
its submodules is not an edge: counted, it would make a cycle of every package that imports its
own modules to register them.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO, load_script

PACKAGE = Path(REPO) / "jdml"
MAX_MODULE_LINES = 700
#: The user commands: nothing in the library imports them.
COMMANDS = ("jdml.__main__", "jdml.commands", "jdml.look", "jdml.report")


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported_names(module: str, path: Path) -> Iterator[tuple[str, int, bool]]:
    """``(dotted name, line, at top level)`` of every name an import statement of ``path`` reads."""
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno, id(node) in top


def import_graph() -> dict[str, set[str]]:
    """module -> the jdml modules its import statements name."""
    files = module_files()
    graph: dict[str, set[str]] = {name: set() for name in files}
    for module, path in files.items():
        for name, _, _ in _imported_names(module, path):
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module:
                graph[module].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}, "f": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_has_no_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "modules that import each other, directly or through others: " + "; ".join(
        " <-> ".join(component) for component in found
    )


def test_every_module_is_under_the_size_limit() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in module_files().items()}
    over = {name: lines for name, lines in sizes.items() if lines > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines (split them by job): {over}"


def test_the_config_layer_imports_at_the_top() -> None:
    """``jdml.config`` sits on top of the components, so it needs no import inside a function."""
    files = module_files()
    local = [
        f"{module}:{line} {name}"
        for module, path in files.items()
        if module == "jdml.config" or module.startswith("jdml.config.")
        for name, line, at_top in _imported_names(module, path)
        if not at_top and name.startswith("jdml")
    ]
    assert not local, f"function-local imports in jdml/config: {local}"


def test_the_library_imports_no_command() -> None:
    def is_command(module: str) -> bool:
        return any(module == c or module.startswith(c + ".") for c in COMMANDS)

    wrong = [
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if not is_command(module)
        for target in targets
        if is_command(target)
    ]
    assert not wrong, f"library modules importing a user command: {wrong}"


def _function_lines(path: str, name: str) -> int:
    tree = ast.parse((Path(REPO) / path).read_text())
    [node] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return node.end_lineno - node.lineno + 1


def test_the_train_step_reads_in_one_screen() -> None:
    """The plain ``jdml.step.train_step`` and the cohort's are at most 40 lines each: the
    cohort's work is in named parts (``step_context``, ``phase_update``, ``commit``,
    ``step_metrics``), and what the losses give besides their value has names (``LossAux``,
    ``MembersAux``), not positions."""
    for path in ("jdml/step.py", "jdml/cohort/step.py"):
        lines = _function_lines(path, "train_step")
        assert lines <= 40, f"{path}::train_step has {lines} lines; move work into named parts"


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


def test_the_plain_step_knows_nothing_of_cohorts() -> None:
    """A plain run's step is Flax-shaped and reads alone (issue 81): ``jdml/step.py`` has at
    most 250 lines, imports nothing of the members (cohort, layout, members, exchanges, mesh),
    and its reader meets at most 3 types (``tools/spine_metrics.py``)."""
    path = PACKAGE / "step.py"
    assert len(path.read_text().splitlines()) <= 250
    spine = {"jdml.cohort", "jdml.mesh"}
    imported = {m for m in _imports(path) if any(m.startswith(s) for s in spine)}
    assert not imported, f"jdml/step.py imports {imported}"
    types = load_script("tools/spine_metrics.py").step_types("jdml.step")
    assert len(types) <= 3, types


@pytest.mark.slow
def test_a_plain_run_reaches_its_loss_in_few_frames() -> None:
    """``python train.py`` reaches the margin loss's first line in at most 12 of this
    repository's frames (Flax's ImageNet example: 6)."""
    frames = load_script("tools/spine_metrics.py").frames_to_loss()
    assert frames and frames[-1].filename.endswith("losses/margin.py")
    assert len(frames) <= 12, [f"{f.filename}:{f.lineno} {f.name}" for f in frames]


def test_the_trainer_reads_in_one_screen() -> None:
    """``jdml.trainer._train`` is at most 50 lines: the evaluations, their records and the best
    checkpoint are ``jdml.evaluations.Evaluations``, the steps ``_Loop``."""
    lines = _function_lines("jdml/trainer.py", "_train")
    assert lines <= 50, f"jdml.trainer._train has {lines} lines; move work into named parts"


def _string_kind_tests(path: Path) -> list[int]:
    """Lines of ``path`` comparing an attribute named ``kind`` with a string literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            attribute = any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides)
            literal = any(isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides)
            if attribute and literal:
                found.append(node.lineno)
    return found


def test_the_member_spine_has_no_string_kinds() -> None:
    """The storage of the members is a class (``jdml.cohort.layout.Stacked``, ``Listed``), not
    a string tested by its users; ``Program`` forwards none of its placement's members (its
    users ask ``program.placement``)."""
    spine = ("placement", "program", "step", "cohort/layout", "cohort/program", "cohort/step")
    for module in spine:
        lines = _string_kind_tests(PACKAGE / f"{module}.py")
        assert not lines, f"jdml/{module}.py compares a .kind with a string at lines {lines}"
    tree = ast.parse((PACKAGE / "program.py").read_text())
    [program] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Program"]
    forwarding = []
    for node in program.body:
        if isinstance(node, ast.FunctionDef):
            body = [n for n in node.body if not isinstance(n, ast.Expr)]  # past the docstring
            text = ast.unparse(body[0]) if len(body) == 1 else ""
            if text.startswith(("return self.layout.", "return self.placement.")):
                forwarding.append(node.name)
    assert not forwarding, f"Program forwards {forwarding}; use program.placement"


def test_the_string_kind_finder_finds_one(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('x = 1\nif self.kind == "single":\n    pass\n')
    assert _string_kind_tests(probe) == [2]


#: The packages and modules whose code computes a run's numbers.
NUMERICS = (
    "nn",
    "models",
    "losses",
    "miners",
    "evaluation",
    "native",
    "step.py",
    "cohort",
    "placement.py",
)


def _switch_reads(path: Path) -> list[tuple[str, int]]:
    """``(name, line)`` of each module-level str or bool constant of ``path`` that a function of
    it uses as a choice: compares with a string (``MODE != "auto"``), takes as the default of
    an argument left None (``impl = MODE if impl is None else impl``), or tests (``if FLAG:``).
    A caller could set it on the module instead of passing a value."""
    tree = ast.parse(path.read_text())
    constants = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        value = getattr(node, "value", None)
        if isinstance(value, ast.Constant) and isinstance(value.value, (str, bool)):
            constants |= {t.id for t in targets if isinstance(t, ast.Name)}

    def named(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id in constants

    reads = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                literal = any(
                    isinstance(s, ast.Constant) and isinstance(s.value, str) for s in sides
                )
                reads += [(s.id, node.lineno) for s in sides if named(s) and literal]
            elif isinstance(node, ast.IfExp) and named(node.body):
                reads.append((node.body.id, node.lineno))
            elif isinstance(node, (ast.If, ast.While)) and named(node.test):
                reads.append((node.test.id, node.lineno))
    return reads


def test_no_module_level_switch_chooses_the_numerics() -> None:
    """The kNN selection, the convolutions and the k-means assignment a run computes with are
    one frozen value (``jdml.backends.Backends``) passed down, not module globals that a
    function reads when traced (such as the kNN ``SELECTION`` that tests used to set)."""
    found = []
    for entry in NUMERICS:
        root = PACKAGE / entry
        for path in [root] if root.suffix == ".py" else sorted(root.rglob("*.py")):
            relative = str(path.relative_to(Path(REPO)))
            found += [(relative, name, line) for name, line in _switch_reads(path)]
    assert not found, f"module-level switches read by functions: {found}"


def test_the_switch_finder_finds_one(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        'MODE = "auto"\nKEY = "k"\nLIMIT = 3\n\n'
        "def f(impl=None, d={}):\n"
        "    impl = MODE if impl is None else impl\n"
        '    return impl != "auto" and MODE == "x" and d[KEY] and LIMIT\n'
    )
    assert sorted(_switch_reads(probe)) == [("MODE", 6), ("MODE", 7)]


def _map_paths() -> list[str]:
    """The module and package paths the map of ``docs/architecture.md`` names (its first code
    block), relative to ``jdml/``: an indented entry lies in the package above it."""
    text = (Path(REPO) / "docs" / "architecture.md").read_text()
    block = text.split("```", 2)[1]
    paths, parent = [], ""
    for line in block.splitlines()[1:]:
        head = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        names = [t for t in re.split(r"[\s,]+", head) if re.fullmatch(r"[\w.]+(/|\.py)", t)]
        if not names or line.startswith("    "):
            continue  # a description's continuation
        if line.startswith("  "):
            paths += [parent + n for n in names]
            continue
        parent = names[0] if names[0].endswith("/") else ""
        paths += names
    return paths


def test_the_architecture_map_names_the_modules_there_are() -> None:
    """Every module and package the map names exists where it places it (issue 81: it named a
    ``blocks.py`` that did not exist)."""
    paths = _map_paths()
    assert "step.py" in paths and "cohort/step.py" in paths and "placement.py" in paths
    missing = [p for p in paths if not (PACKAGE / p).exists()]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def test_only_the_optimiser_reads_the_optim_section() -> None:
    """Issue 81: the optimiser is built in one module (``jdml/optim.py``) from what its owners
    declare; no other module of the library reads a key of the ``optim`` section (``config/``
    declares and validates them)."""
    readers = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "optim.py" or relative.startswith("config/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            inner = node.value if isinstance(node, ast.Attribute) else None
            if isinstance(inner, ast.Attribute) and inner.attr == "optim":
                readers.append(f"{relative}:{node.lineno} .optim.{node.attr}")
    assert not readers, f"modules read the optim section: {readers}"
