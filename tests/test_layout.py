"""How the packages depend on each other: one way, with no circles.

Every import counts, at module level, under ``TYPE_CHECKING`` or inside a
function: a circle of any kind ties two modules into one room.
"""

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("protocol", "echo_node", "echo_learner", "bootstrap")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports() -> dict[str, set[str]]:
    """Each first-party module and the first-party modules it imports."""
    known = modules()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in known.items():
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(resolve(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.update(resolve(f"{node.module}.{alias.name}") or resolve(node.module) for alias in node.names)
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def test_no_module_imports_itself_back():
    try:
        tuple(graphlib.TopologicalSorter(imports()).static_order())
    except graphlib.CycleError as exc:
        raise AssertionError(f"import circle: {' -> '.join(exc.args[1])}") from None


def test_packages_depend_one_way():
    allowed = {
        "protocol": {"protocol"},
        "bootstrap": {"bootstrap", "protocol"},
        "echo_node": {"echo_node", "protocol"},
        "echo_learner": {"echo_learner", "protocol"},
    }
    wrong = [
        f"{module} imports {target}"
        for module, targets in imports().items()
        for target in targets
        if target.split(".")[0] not in allowed[module.split(".")[0]]
    ]
    assert wrong == []


def test_the_checks_see_a_circle():
    """The walk above finds imports of every kind (else the tests pass vacuously)."""
    graph = imports()
    assert "protocol.broadcast.serving" in graph["protocol.broadcast.engine"]  # module level
    assert "echo_node.backend_llama" in graph["echo_node.backend_choice"]  # inside a function
    assert "protocol.broadcast.engine" in graph["echo_node.status"]  # under TYPE_CHECKING
    graph["protocol.codec"] = graph["protocol.codec"] | {"protocol.broadcast.engine"}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError:
        return
    raise AssertionError("a circle through protocol.codec went unseen")


def test_protocol_imports_without_torch():
    """Nodes and tools use protocol/ without torch (merging a LoRA adapter
    imports it where it is done)."""
    import subprocess
    import sys

    script = """
import importlib, pkgutil, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("torch imported by " + sys._getframe(2).f_globals.get("__name__", "?"))

sys.meta_path.insert(0, NoTorch())
import protocol
for module in pkgutil.walk_packages(protocol.__path__, "protocol."):
    importlib.import_module(module.name)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


# protocol/ by concern (protocol/__init__.py): each folder and what it may
# import of protocol/. The language is the modules directly under protocol/.
LANGUAGE = "protocol"
MAY_IMPORT = {
    "protocol.process": set(),
    LANGUAGE: {"protocol.process"},
    "protocol.models": {LANGUAGE, "protocol.process"},
    "protocol.net": {LANGUAGE, "protocol.process"},
    "protocol.wire": {LANGUAGE, "protocol.process", "protocol.models"},
    "protocol.broadcast": {LANGUAGE, "protocol.process", "protocol.models", "protocol.net", "protocol.wire"},
}
# Language modules that name what they describe elsewhere, and why.
LANGUAGE_REACHES = {
    "protocol.kinds": "gathers every message kind from the modules that own them",
    "protocol.invite": "an invite holds multiaddrs, parsed as the host parses them",
    "protocol.manifest": "a manifest's format is one of the update formats",
}


def concern(module: str) -> str:
    """The folder of protocol/ that ``module`` belongs to (``LANGUAGE`` for the top)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or parts[1:] and f"protocol.{parts[1]}" in MAY_IMPORT else LANGUAGE


def crossings(graph: dict[str, set[str]]) -> list[str]:
    """The imports in ``graph`` from one folder of protocol/ to one it may not import."""
    return [
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.startswith("protocol") and module not in LANGUAGE_REACHES
        for target in targets
        if target.startswith("protocol")
        and concern(target) != concern(module)
        and concern(target) not in MAY_IMPORT[concern(module)]
    ]


def test_protocol_folders_import_down_only():
    assert crossings(imports()) == []


def test_the_folder_rule_sees_a_crossing():
    graph = imports()
    graph["protocol.process.logs"] = graph["protocol.process.logs"] | {"protocol.net.host"}
    graph["protocol.codec"] = graph["protocol.codec"] | {"protocol.wire.work"}
    assert sorted(crossings(graph)) == [
        "protocol.codec imports protocol.wire.work",
        "protocol.process.logs imports protocol.net.host",
    ]


def test_protocol_top_holds_the_language_only():
    """At most 12 modules directly under protocol/; the rest sit in folders by concern."""
    top = sorted(p.stem for p in (ROOT / "protocol").glob("*.py") if p.stem != "__init__")
    assert len(top) <= 12, top
    folders = {f"protocol.{p.name}" for p in (ROOT / "protocol").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(MAY_IMPORT) - {LANGUAGE}, "a new folder needs its row in MAY_IMPORT"


def many_parameters(package: str, most: int = 8) -> list[str]:
    """Functions in ``package`` taking more than ``most`` parameters besides
    self/cls: state that wants an object, or inputs that want a record."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg) if x is not None]
                count = len([n for n in names if n not in ("self", "cls")])
                if count > most:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({count})")
    return found


def test_no_learner_function_takes_more_than_eight_parameters():
    assert many_parameters("echo_learner") == []


def test_the_parameter_count_sees_keyword_only_parameters():
    """``Verifier.__init__`` takes two positional and six keyword-only ones."""
    assert any(
        f.startswith("echo_learner/verify.py") and "__init__ (8)" in f for f in many_parameters("echo_learner", 7)
    )
