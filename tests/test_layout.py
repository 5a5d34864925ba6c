"""How the packages depend on each other: one way, with no circles.

Every import counts, at module level, under ``TYPE_CHECKING`` or inside a
function: a circle of any kind ties two modules into one room.
"""

import ast
import graphlib
from collections.abc import Iterable
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


def concern(module: str, rooms: dict[str, set[str]] = MAY_IMPORT, top: str = LANGUAGE) -> str:
    """The folder of ``rooms`` that ``module`` belongs to (``top`` for the modules directly in the package)."""
    folder = ".".join(module.split(".")[:2])
    return folder if folder in rooms else top


def crossings(
    graph: dict[str, set[str]],
    rooms: dict[str, set[str]] = MAY_IMPORT,
    top: str = LANGUAGE,
    exempt: Iterable[str] = LANGUAGE_REACHES,
) -> list[str]:
    """The imports in ``graph`` from one folder of package ``top`` to one it may not import."""
    return [
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module.split(".")[0] == top and module not in exempt
        for target in targets
        if target.split(".")[0] == top
        and concern(target, rooms, top) != concern(module, rooms, top)
        and concern(target, rooms, top) not in rooms[concern(module, rooms, top)]
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
        f.startswith("echo_learner/verify/verifier.py") and "__init__ (8)" in f
        for f in many_parameters("echo_learner", 7)
    )


# echo_learner/ by concern (echo_learner/__init__.py). The modules directly
# under it are shared by every room (config, ledger, metrics), except the
# assembly, which may import anything and which nothing imports.
LEARNER = "echo_learner"
ASSEMBLY = "echo_learner (assembly)"
ASSEMBLY_MODULES = {"echo_learner.service", "echo_learner.cli", "echo_learner.__main__"}
ROOMS = {
    LEARNER: set(),
    "echo_learner.tasks": {LEARNER},
    "echo_learner.training": {LEARNER, "echo_learner.tasks"},
    "echo_learner.verify": {LEARNER, "echo_learner.training"},
    "echo_learner.swarm": {LEARNER, "echo_learner.tasks", "echo_learner.training", "echo_learner.verify"},
    "echo_learner.operator": {
        LEARNER,
        "echo_learner.tasks",
        "echo_learner.training",
        "echo_learner.verify",
        "echo_learner.swarm",
    },
}


def learner_graph() -> dict[str, set[str]]:
    """The import graph with the assembly as a room of its own, which every room may not import."""
    graph = imports()
    rename = {m: ASSEMBLY + "." + m for m in ASSEMBLY_MODULES}
    return {rename.get(m, m): {rename.get(t, t) for t in ts} for m, ts in graph.items()}


def learner_crossings(graph: dict[str, set[str]]) -> list[str]:
    assembly = [
        f"{m} imports {t}"
        for m, ts in graph.items()
        if not m.startswith(ASSEMBLY)
        for t in ts
        if t.startswith(ASSEMBLY)
    ]
    inside = {m: ts for m, ts in graph.items() if not m.startswith(ASSEMBLY)}
    return assembly + crossings(inside, ROOMS, LEARNER, ())


def test_learner_folders_import_down_only():
    assert learner_crossings(learner_graph()) == []


def test_the_learner_folder_rule_sees_a_crossing():
    graph = learner_graph()
    graph["echo_learner.verify.recompute"] |= {"echo_learner.swarm.pool"}
    graph["echo_learner.training.trainer"] |= {"echo_learner.verify.verifier"}
    graph["echo_learner.ledger"] |= {"echo_learner.training.lora"}
    graph["echo_learner.swarm.pool"] |= {ASSEMBLY + ".echo_learner.service"}
    assert sorted(learner_crossings(graph)) == [
        "echo_learner.ledger imports echo_learner.training.lora",
        "echo_learner.swarm.pool imports echo_learner (assembly).echo_learner.service",
        "echo_learner.training.trainer imports echo_learner.verify.verifier",
        "echo_learner.verify.recompute imports echo_learner.swarm.pool",
    ]


def test_learner_top_holds_the_shared_modules_and_the_assembly_only():
    """At most 12 modules directly under echo_learner/; the rest sit in folders by concern."""
    top = sorted(p.stem for p in (ROOT / "echo_learner").glob("*.py") if p.stem != "__init__")
    assert len(top) <= 12, top
    folders = {f"echo_learner.{p.name}" for p in (ROOT / "echo_learner").iterdir() if (p / "__init__.py").exists()}
    assert folders == set(ROOMS) - {LEARNER}, "a new folder needs its row in ROOMS"


# --- objects built whole -------------------------------------------------------


def our_classes(packages: tuple[str, ...] = ("protocol", "echo_node", "echo_learner")) -> dict[str, bool]:
    """Every class defined in ``packages``, and whether it is a record (a dataclass)."""
    found = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    names = {ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}
                    found[node.name] = bool(names & {"dataclass", "dataclasses.dataclass"})
    return found


def wired_from_outside(source: str, classes: dict[str, bool]) -> list[tuple[int, str]]:
    """Attributes of another object assigned after it was built: of a
    collaborator held by ``self`` (``self.pool.on_lapsed = ...``), or of an
    object of ours built in the same function (``node = Node(...);
    node.swarm = ...``). A record (a dataclass) is filled by whoever holds it;
    a third-party object is configured as its library says."""
    found = []

    def class_name(value: ast.expr | None) -> str:
        """The class ``value`` builds or is annotated with, if it names one."""
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            return value.func.id
        if isinstance(value, ast.Name | ast.Constant):
            return str(value.id if isinstance(value, ast.Name) else value.value)
        return ""

    def held_types(cls: ast.ClassDef) -> dict[str, str]:
        """What ``self.x`` holds, where the class says: ``self.x = C(...)`` or
        ``self.x = param`` with ``param: C``."""
        types = {}
        for method in cls.body:
            if not isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            a = method.args
            annotated = {x.arg: class_name(x.annotation) for x in (*a.args, *a.kwonlyargs)}
            for n in ast.walk(method):
                if isinstance(n, ast.Assign):
                    built = annotated.get(n.value.id, "") if isinstance(n.value, ast.Name) else class_name(n.value)
                    for target in n.targets:
                        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                            if target.value.id == "self" and built:
                                types[target.attr] = built
        return types

    def constructed(function: ast.AST) -> set[str]:
        return {
            target.id
            for n in ast.walk(function)
            if isinstance(n, ast.Assign) and classes.get(class_name(n.value)) is False
            for target in n.targets
            if isinstance(target, ast.Name)
        }

    def visit(node: ast.AST, held: dict[str, str], built: set[str]) -> None:
        if isinstance(node, ast.ClassDef):
            held = held_types(node)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            built = constructed(node)
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if not isinstance(t, ast.Attribute):
                        continue
                    owner = t.value
                    of_self = isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name)
                    if of_self and owner.value.id == "self" and not classes.get(held.get(owner.attr, "")):
                        found.append((node.lineno, ast.unparse(t)))
                    elif isinstance(owner, ast.Name) and owner.id in built:
                        found.append((node.lineno, ast.unparse(t)))
        for child in ast.iter_child_nodes(node):
            visit(child, held, built)

    visit(ast.parse(source), {}, set())
    return found


def test_objects_are_built_whole():
    classes = our_classes()
    wired = [
        f"{path.relative_to(ROOT)}:{line} {target}"
        for package in ("protocol", "echo_node", "echo_learner")
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, target in wired_from_outside(path.read_text(), classes)
    ]
    assert wired == []


def test_the_wiring_check_sees_what_it_forbids():
    classes = {"Pool": False, "Stats": True}
    source = """
class Learner:
    def __init__(self, stats: Stats):
        self.pool = Pool()
        self.pool.on_lapsed = self._lapsed      # a held collaborator, wired from outside
        self.count = 0                          # its own attribute: fine
        self.stats = stats
        self.stats.seen = 1                     # a held record: fine

def doctor(swarm):
    pool = Pool()
    pool.swarm = swarm                          # built here, then wired
    stats = Stats()
    stats.seen = 1                              # a record, filled by whoever holds it
    tok = Tokenizer()
    tok.decoder = None                          # not ours: as its library says
"""
    assert wired_from_outside(source, classes) == [(5, "self.pool.on_lapsed"), (12, "pool.swarm")]


# --- sizes a newcomer can read -------------------------------------------------


def oversized(packages: tuple[str, ...] = ("protocol", "echo_node", "echo_learner")) -> list[str]:
    """Classes of more than 25 methods and functions of more than 80 lines
    (docstring included): each usually hides two."""
    found = []
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    methods = [b for b in node.body if isinstance(b, ast.FunctionDef | ast.AsyncFunctionDef)]
                    if len(methods) > 25:
                        found.append(
                            f"{path.relative_to(ROOT)}:{node.lineno} class {node.name}: {len(methods)} methods"
                        )
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > 80:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines")
    return found


def test_no_class_or_function_is_too_big_to_read():
    assert oversized() == []
