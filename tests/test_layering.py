"""The layering of the tree (docs/architecture.md "Where things are", ../shared/DESIGN.md), checked on the AST.

Engines and routing sit on the contracts and the machinery they share, the product sits on top:
- `sdk.protocol` (the contracts) imports only the standard library, third-party packages and itself;
- `sdk.engine_common` (the machinery both engines share) imports only `sdk.protocol` and itself;
- `local_runtime`, `cloud_engine`, `router`, `confidence` import only those two from `sdk`,
  and never each other, except `router` -> `confidence`; `cloud_engine` does not serve (no `grpc`);
- `sdk.state` (the state database replicas share) imports only `sdk.protocol` and itself;
- `sdk.serving` (the gRPC server for any engine, and what both servers share) imports only those
  three and itself;
- the rest of `sdk` stands in PRODUCT_LAYERS, bottom to top: a package imports from its own layer only
  itself, and otherwise only what stands below it (the stores and tiers, the cascade, the HTTP server,
  the in-process client, the settings, what puts a server together, the CLI);
- it reaches the cloud engine only through the contracts (`sdk.protocol.cloud_backend`, `sdk.protocol.wire`):
  only the modules that configure or start a cloud engine import `cloud_engine` (SDK_MODULES_STARTING_CLOUD_ENGINE);
- `android_bridge` and `bench` may import anything, and nothing below them imports them;
- no import cycle anywhere (strongly connected components of the module graph).

Every import counts, function-level ones included (deferring an import hides a cycle, it does
not break it); only imports under `if TYPE_CHECKING:` are left out. A module's own package
`__init__` files are not edges (Python runs them first, whoever imports the module)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGES = ("sdk", "local_runtime", "cloud_engine", "router", "confidence", "android_bridge", "bench")
ENGINES = ("local_runtime", "cloud_engine", "router", "confidence")
ALLOWED_BETWEEN_ENGINES = {("router", "confidence")}
TOP = ("android_bridge", "bench")
# The product above sdk.serving, bottom to top (sdk.protocol, sdk.engine_common, sdk.state and sdk.serving have
# their own rules below them); packages in one layer do not import each other.
PRODUCT_LAYERS = (
    ("sdk.data_dir", "sdk.sqlite_writer", "sdk.lazy_exports"),
    ("sdk.response_store", "sdk.budgets", "sdk.traffic", "sdk.embeddings", "sdk.cloud"),
    ("sdk.owner_migration",),  # moves the stores' rows at a server's start
    ("sdk.cascade",),
    ("sdk.openai_server",),
    ("sdk.client",),
    ("sdk.settings",),
    ("sdk.assembly", "sdk.evaluation"),
    ("sdk.cli",),
)
# The product's modules that configure or start a cloud engine in this process; the rest of sdk talks
# to a cloud tier (embedded or remote) through sdk.protocol.cloud_backend and sdk.protocol.wire.
SDK_MODULES_STARTING_CLOUD_ENGINE = {
    "sdk.cloud.tier": "starts the embedded tier (engine, gRPC listener)",
    "sdk.cli.cloud": "`tandem cloud serve`",
    "sdk.settings.loading": "builds the CloudEngineConfig [cloud] describes",
    "sdk.settings.fields": "reads the [cloud] keys CloudEngineConfig declares",
    "sdk.settings.checks": "checks [cloud] speculative with the engine's own parser",
}
REPO = Path(__file__).resolve().parents[1]


def find_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the project's packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                skipped.update(id(n) for n in ast.walk(inner))
    return skipped


def imported_names(name: str, path: Path) -> list[tuple[str, int]]:
    """(absolute dotted name, line) of every import in a module, `if TYPE_CHECKING` blocks excluded.
    `from a.b import c` yields a.b.c (a submodule, or a name of a.b: resolved later)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    skipped = _type_checking_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return found


def resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The project module an imported name lives in (the longest known prefix), or None (outside)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def import_graph(root: Path) -> tuple[dict[str, set[str]], dict[tuple[str, str], int]]:
    """Module -> project modules it imports, and the line of the first such import."""
    modules = find_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    lines: dict[tuple[str, str], int] = {}
    for name, path in modules.items():
        for target, line in imported_names(name, path):
            module = resolve(target, modules)
            if module is None or module == name or name.startswith(module + "."):
                continue  # outside the project, itself, or one of its own parent packages
            graph[name].add(module)
            lines.setdefault((name, module), line)
    return graph, lines


def _top(module: str) -> str:
    return module.partition(".")[0]


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _is_protocol(module: str) -> bool:
    return _in(module, "sdk.protocol")


def _below_engines(module: str) -> bool:
    """What the engines may import from sdk: the contracts and the machinery they share."""
    return _in(module, "sdk.protocol") or _in(module, "sdk.engine_common")


def rule_broken(importer: str, imported: str) -> str | None:
    """Why importer may not import imported, or None when the layering allows it."""
    source, target = _top(importer), _top(imported)
    if target in TOP and source not in TOP:
        return f"{target} sits at the top: only {' and '.join(TOP)} import it"
    if _is_protocol(importer) and not _is_protocol(imported):
        return "sdk.protocol imports only the standard library, third-party packages and itself"
    if _in(importer, "sdk.engine_common") and not _below_engines(imported):
        return "sdk.engine_common imports only sdk.protocol and itself"
    if _in(importer, "sdk.state") and not (_is_protocol(imported) or _in(imported, "sdk.state")):
        return "sdk.state imports only sdk.protocol and itself"
    serving_may = _below_engines(imported) or _in(imported, "sdk.serving") or _in(imported, "sdk.state")
    if _in(importer, "sdk.serving") and not serving_may:
        return "sdk.serving imports only sdk.protocol, sdk.engine_common, sdk.state and itself"
    below = _product_layer_broken(importer, imported)
    if below:
        return below
    if source == "sdk" and target == "cloud_engine" and importer not in SDK_MODULES_STARTING_CLOUD_ENGINE:
        return (
            "sdk reaches the cloud engine through sdk.protocol (cloud_backend, wire); only the modules that "
            "configure or start one import it (SDK_MODULES_STARTING_CLOUD_ENGINE)"
        )
    if source in ENGINES and target == "sdk" and not _below_engines(imported):
        return f"{source} imports only sdk.protocol and sdk.engine_common from sdk"
    if source in ENGINES and target in ENGINES and source != target and (source, target) not in ALLOWED_BETWEEN_ENGINES:
        return f"{source} may not import {target} (of the engines and routing, only router -> confidence)"
    return None


def _product_package(module: str) -> tuple[int, str] | None:
    """(layer, package) of a module of the product's PRODUCT_LAYERS, or None."""
    for layer, packages in enumerate(PRODUCT_LAYERS):
        for package in packages:
            if _in(module, package):
                return layer, package
    return None


def _product_layer_broken(importer: str, imported: str) -> str | None:
    """Why the product's `importer` may not import `imported`: it stands above it, or beside it."""
    source, target = _product_package(importer), _product_package(imported)
    if source is None or target is None or source[1] == target[1] or target[0] < source[0]:
        return None
    where = "above" if target[0] > source[0] else "beside"
    return f"{target[1]} stands {where} {source[1]} (PRODUCT_LAYERS): imports point down"


def violations(graph: dict[str, set[str]], lines: dict[tuple[str, str], int]) -> list[str]:
    found = []
    for importer in sorted(graph):
        for imported in sorted(graph[importer]):
            why = rule_broken(importer, imported)
            if why:
                found.append(f"{importer} (line {lines[importer, imported]}) imports {imported}: {why}")
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
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
                        cycles.append(sorted(component))
    return sorted(cycles)


def test_the_tree_keeps_its_layers():
    graph, lines = import_graph(REPO)
    assert len(graph) > 150 and graph["sdk.cascade.runner"], "the walk found the project's modules and their imports"
    assert violations(graph, lines) == []


def test_no_engine_module_serves():
    """The gRPC server is sdk.serving.grpc's, for any engine: no module under cloud_engine (or the
    other engines) imports grpc, so none can start a server."""
    serving = []
    for package in ENGINES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                names += [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
                serving += [f"{path.relative_to(REPO)} imports {n}" for n in names if n.partition(".")[0] == "grpc"]
    assert serving == []


def test_the_tree_has_no_import_cycle():
    graph, _ = import_graph(REPO)
    assert import_cycles(graph) == []


def _plant(root: Path, files: dict[str, str]) -> None:
    for package in PACKAGES:
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.parent != root and not (path.parent / "__init__.py").exists():
            (path.parent / "__init__.py").write_text("")
        path.write_text(text)


def test_the_checks_catch_planted_violations_and_cycles(tmp_path):
    _plant(
        tmp_path,
        {
            "sdk/protocol/engine.py": "import json\nimport numpy\n",
            "sdk/protocol/schema.py": "from .engine import x\nfrom sdk.cascade.runner import Runner\n",
            "sdk/cascade/runner.py": "from local_runtime.engine import Engine\nfrom sdk.protocol.engine import x\n",
            "sdk/cloud/client.py": "from cloud_engine.loader import wire\n",  # the client half of the wire, below
            "sdk/cloud/tier.py": "from cloud_engine.loader import start\n",  # starts an engine: allowed
            "sdk/engine_common/grammar.py": "from sdk.protocol import engine\nfrom sdk.openai_server import app\n",
            "sdk/serving/grpc/server.py": "from sdk.engine_common import grammar\nimport sdk.openai_server.app\n",
            "sdk/openai_server/app.py": "",
            "sdk/state/database.py": "from sdk.serving import limits\n",  # below the serving layer
            "sdk/serving/limits.py": "",
            "sdk/traffic/learning.py": "from sdk.openai_server import app\n",  # the record reaching into the server
            "sdk/cascade/assembly.py": "from sdk.settings import serve_config\n",  # the cascade reading settings
            "sdk/settings/serve_config.py": "from sdk.cli import serve\n",  # settings reaching up to the CLI
            "sdk/assembly/cascade.py": "from sdk.settings import serve_config\nfrom sdk.cli import serve\n",
            "sdk/cli/serve.py": "",
            "sdk/budgets/ledger.py": "from sdk.traffic import learning\n",  # one store beside another
            "local_runtime/engine.py": (
                "from typing import TYPE_CHECKING\nfrom sdk.protocol import engine\n"
                "from sdk.engine_common import grammar\n"
                "if TYPE_CHECKING:\n    from sdk.cascade.runner import Runner\n"  # excluded: types only
                "def later():\n    from sdk.cascade import runner\n"  # a deferred import still counts
            ),
            "cloud_engine/loader.py": "import local_runtime.engine\n",
            "router/policy.py": "import confidence\nfrom ..confidence.signals import y\n",
            "confidence/signals.py": "from router.policy import z\nimport bench.serve\n",
            "bench/serve.py": "from sdk.cascade.runner import Runner\nfrom android_bridge import runtime\n",
            "android_bridge/runtime.py": "",
        },
    )
    graph, lines = import_graph(tmp_path)
    assert graph["router.policy"] == {"confidence", "confidence.signals"}  # relative import resolved
    found = violations(graph, lines)
    assert found == [
        "cloud_engine.loader (line 1) imports local_runtime.engine: cloud_engine may not import local_runtime"
        " (of the engines and routing, only router -> confidence)",
        "confidence.signals (line 2) imports bench.serve: bench sits at the top: only android_bridge and bench"
        " import it",
        "confidence.signals (line 1) imports router.policy: confidence may not import router"
        " (of the engines and routing, only router -> confidence)",
        "local_runtime.engine (line 7) imports sdk.cascade.runner: local_runtime imports only sdk.protocol and"
        " sdk.engine_common from sdk",
        "sdk.assembly.cascade (line 2) imports sdk.cli.serve: sdk.cli stands above sdk.assembly (PRODUCT_LAYERS):"
        " imports point down",
        "sdk.budgets.ledger (line 1) imports sdk.traffic.learning: sdk.traffic stands beside sdk.budgets"
        " (PRODUCT_LAYERS): imports point down",
        "sdk.cascade.assembly (line 1) imports sdk.settings.serve_config: sdk.settings stands above sdk.cascade"
        " (PRODUCT_LAYERS): imports point down",
        "sdk.cloud.client (line 1) imports cloud_engine.loader: sdk reaches the cloud engine through sdk.protocol"
        " (cloud_backend, wire); only the modules that configure or start one import it"
        " (SDK_MODULES_STARTING_CLOUD_ENGINE)",
        "sdk.engine_common.grammar (line 2) imports sdk.openai_server.app: sdk.engine_common imports only sdk.protocol"
        " and itself",
        "sdk.protocol.schema (line 2) imports sdk.cascade.runner: sdk.protocol imports only the standard library,"
        " third-party packages and itself",
        "sdk.serving.grpc.server (line 2) imports sdk.openai_server.app: sdk.serving imports only sdk.protocol,"
        " sdk.engine_common, sdk.state and itself",
        "sdk.settings.serve_config (line 1) imports sdk.cli.serve: sdk.cli stands above sdk.settings"
        " (PRODUCT_LAYERS): imports point down",
        "sdk.state.database (line 1) imports sdk.serving.limits: sdk.state imports only sdk.protocol and itself",
        "sdk.traffic.learning (line 1) imports sdk.openai_server.app: sdk.openai_server stands above sdk.traffic"
        " (PRODUCT_LAYERS): imports point down",
    ]
    # sdk.protocol.schema -> sdk.cascade.runner -> local_runtime.engine -> sdk.cascade.runner; and a
    # router <-> confidence pair.
    assert import_cycles(graph) == [
        ["confidence.signals", "router.policy"],
        ["local_runtime.engine", "sdk.cascade.runner"],
    ]


def test_the_contracts_name_no_machinery_even_for_types():
    """sdk.protocol imports nothing of the project's outside itself, not even under `if TYPE_CHECKING` (which
    the walk above leaves out): a type a contract names lives in the contracts."""
    found = []
    for path in sorted((REPO / "sdk" / "protocol").rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            module = node.module if isinstance(node, ast.ImportFrom) and not node.level else None
            names = [module] if module else [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [
                f"{path.relative_to(REPO)} imports {name}"
                for name in names
                if name and _top(name) in PACKAGES and not _is_protocol(name)
            ]
    assert found == []


def test_cycles_longer_than_a_pair_are_found():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_only_the_modules_starting_a_cloud_engine_import_it_from_sdk():
    graph, _ = import_graph(REPO)
    importers = {
        name
        for name, imported in graph.items()
        if _top(name) == "sdk" and any(_top(module) == "cloud_engine" for module in imported)
    }
    assert importers == set(SDK_MODULES_STARTING_CLOUD_ENGINE), (
        "name a new one there only if it starts or configures an engine"
    )


def test_the_walk_sees_every_module_python_would_import():
    modules = find_modules(REPO)
    assert "sdk.protocol" in modules and "sdk.cli.__main__" in modules
    assert all(name.partition(".")[0] in PACKAGES for name in modules)
    assert not any(name.startswith("tests") for name in modules)
