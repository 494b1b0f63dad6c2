"""Kernel sources read without importing them: entry functions, local imports, content digests.

Project source is what the project itself wrote: a .py file under the root that is not inside out/, a hidden
directory (.venv, .git, .tox), a virtualenv (a directory holding pyvenv.cfg) or an installed-packages directory.
Only project source is followed for imports, keyed, or renamed in binaries (rules/compile/triton_backend.py): an
in-tree virtualenv's torch is a dependency, not the project's code.
"""
from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path


def _per_version(fn):
    """fn(path) computed once per process and file version: a file edited while the process runs is read again,
    even with its mtime put back (the ctime tells)."""
    cached = functools.lru_cache(maxsize=None)(lambda path, *version: fn(path))

    @functools.wraps(fn)
    def per_version(path: Path):
        st = path.stat()
        return cached(path, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
    return per_version


@_per_version
def parse(path: Path) -> ast.Module:
    """The file's AST, parsed once per process and file version."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (RecursionError, MemoryError) as e:   # an expression nested thousands deep: Python cannot compile it either
        said = "nested too deeply for Python's parser" + ("" if isinstance(e, RecursionError) else " (out of memory)")
        raise SyntaxError(said, (str(path), None, None, None)) from None
    except SyntaxError as e:   # a NUL byte: Python's error names no file
        e.filename = e.filename or str(path)
        raise
    for node in module_level(tree.body):   # where each module-level def is: an entry's may lie in another module
        if isinstance(node, ast.FunctionDef):
            node.kforge_file = path
    return tree


def function_names(path: Path) -> list[str]:
    """The module-level functions, guarded ones (under a module-level if, try or with) included."""
    return [n.name for n in module_level(parse(path).body) if isinstance(n, ast.FunctionDef)]


def module_level(statements: list) -> list:
    """The statements a module runs at import, those under its if/else, try/except/else/finally and with blocks
    included (a kernel defined only `if has_triton():`), in source order."""
    found = []
    for node in statements:
        found.append(node)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            handlers = [h.body for h in getattr(node, "handlers", ())]
            for block in (node.body, *handlers, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                found += module_level(block)
    return found


def entry_def(path: Path, name: str) -> tuple[ast.FunctionDef | None, tuple[str, ...]]:
    """The def a module-level name holds after import, as Triton's JIT sees it, and the names of the calls that
    wrap it (`kernel = triton.autotune(cfgs, key)(triton.heuristics(h)(_k))`: _k's def, ("autotune",
    "heuristics"); `kernel = triton.autotune(...)(kernel)` after its def too); a guarded def counts, and so do
    - a name a module-level factory returns (`kernel = _make()`, `_make` returning a def of its own);
    - a name imported from another module of the library (`from .impl import _k as kernel`, `import *`), or
      reached through a module object (`kernel = impl._k`), followed there; from another top-level package,
      ("?",) is among the calls: the import is asked, and what it read tells when it changes;
    - `Class.name`, a def in a module-level class, and a qualified name (`_make.<locals>._square`);
    - failing all those, one def of that name anywhere in the module (made lazily, by its `__getattr__`, say),
      with ("?",) among the calls: only importing the module tells what the name holds.
    (None, ()) when the source shows none."""
    return _entry_def(path, name, 0)


def _entry_def(path: Path, name: str, depth: int) -> tuple[ast.FunctionDef | None, tuple[str, ...]]:
    if depth > 8:   # a cycle of re-exports
        return None, ()
    tree = parse(path)
    statements = module_level(tree.body)
    owner, dot, attribute = name.partition(".")
    for node in statements:
        if dot and isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == owner:
            return _nested_def(node, attribute.split("."))
        if not dot and isinstance(node, ast.FunctionDef) and node.name == name:
            return node, _rewrapped(statements, name)
    for node in statements:
        if not dot and _assigns(node, name):
            found, calls = _assigned(path, statements, node.value, name, depth)
            if found is not None:
                return found, calls
        if dot and isinstance(node, ast.Import):   # `import mylib.ops as K` ... `kernel = K._impl`
            for alias in node.names:
                module = alias.name if alias.asname == owner else None
                if alias.asname is None and name.startswith(alias.name + "."):
                    module, attribute = alias.name, name[len(alias.name) + 1:]
                source = _resolve(_top_package(path).parent, module.split(".")) if module else None
                if source is not None:
                    return _with_top(path, source, _entry_def(source, attribute, depth + 1))
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if dot and (alias.asname or alias.name) == owner and (node.module or node.level):
                    submodule = _imported_module(path, node, alias.name)   # `from mylib import ops` ... ops._impl
                    if submodule is not None:
                        return _with_top(path, submodule, _entry_def(submodule, attribute, depth + 1))
                if (alias.asname or alias.name) in (owner, "*"):   # `from .ops import *` too
                    source = _imported_module(path, node)
                    there = name if alias.name == "*" else alias.name + dot + attribute
                    found, calls = (None, ()) if source is None else _with_top(
                        path, source, _entry_def(source, there, depth + 1))
                    if found is not None or alias.name != "*":
                        return found, calls
    if dot:
        return None, ()
    nested = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    if len(nested) == 1:
        return nested[0], ("?",)
    return None, ()


def _assigns(node, name: str) -> bool:
    """Whether a statement binds `name` to a value (`name = ...`, `name: T = ...`)."""
    if isinstance(node, ast.AnnAssign):
        return node.value is not None and isinstance(node.target, ast.Name) and node.target.id == name
    return isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)


def _rewrapped(statements: list, name: str) -> tuple[str, ...]:
    """The calls a module wraps its def in under the def's own name (`kernel = triton.autotune(...)(kernel)` after
    `def kernel`), outermost first: each later one wraps the earlier."""
    calls: tuple[str, ...] = ()
    for node in statements:
        if _assigns(node, name):
            inner, wrapping = _wrapped(node.value)
            if inner == name:
                calls = wrapping + calls
    return calls


def _assigned(path: Path, statements: list, value, name: str, depth: int):
    """The def behind `name = <value>`: a factory's call returning a def of its own (`kernel = _make(_relu)`: the
    def it returns, not its argument), or wrapping calls around a name."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):   # kernel = _make(...)
        factory = next((n for n in statements if isinstance(n, ast.FunctionDef) and n.name == value.func.id), None)
        if factory is not None:
            for ret in (n for n in ast.walk(factory) if isinstance(n, ast.Return) and n.value is not None):
                inner, calls = _wrapped(ret.value)
                found, more = _scope_def(factory.body, inner) if inner else (None, ())
                if found is not None:
                    return found, calls + more
    inner, calls = _wrapped(value)
    if inner is not None and inner != name:
        found, more = _entry_def(path, inner, depth + 1)
        return (found, calls + more) if found is not None else (None, ())
    return None, ()


def _nested_def(node, parts: list[str]) -> tuple[ast.FunctionDef | None, tuple[str, ...]]:
    """The def a qualified name names inside a class or function: `Kernels.add` (a class's attribute), or
    `_make.<locals>._square` (a def a function made)."""
    if parts[0] == "<locals>":
        if not isinstance(node, ast.FunctionDef) or len(parts) < 2:
            return None, ()
        parts = parts[1:]
    elif not isinstance(node, ast.ClassDef):
        return None, ()
    if len(parts) == 1:
        return _scope_def(node.body, parts[0])
    inner = next((n for n in module_level(node.body) if isinstance(n, (ast.ClassDef, ast.FunctionDef))
                  and n.name == parts[0]), None)
    return _nested_def(inner, parts[1:]) if inner is not None else (None, ())


def _scope_def(body: list, name: str) -> tuple[ast.FunctionDef | None, tuple[str, ...]]:
    """A def of `name` in a function's or class's body, and the calls that wrap it there."""
    statements = module_level(body)
    for node in statements:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node, ()
    for node in statements:
        if _assigns(node, name):
            inner, calls = _wrapped(node.value)
            if inner is not None and inner != name:
                found, more = _scope_def(body, inner)
                return (found, calls + more) if found is not None else (None, ())
    return None, ()


def _top_package(path: Path) -> Path:
    """The folder of the top-level package a module lies in (the module itself for one at a path entry's top)."""
    top = path
    while (top.parent / "__init__.py").is_file():
        top = top.parent
    return top


def _imported_module(path: Path, node: ast.ImportFrom, submodule: str | None = None) -> Path | None:
    """The file of the module a `from X import ...` in `path` names (with submodule: of X.submodule): relative to
    path's package, or absolute from the folder path's top-level package lies in."""
    base = up(path.parent, node.level - 1) if node.level else _top_package(path).parent
    parts = [*(node.module.split(".") if node.module else ()), *((submodule,) if submodule else ())]
    return _resolve(base, parts) if parts else None


def _with_top(path: Path, source: Path, found: tuple) -> tuple:
    """found (a def and its calls) as read from `source`, with ("?",) among the calls when `source` lies in another
    top-level package than `path`: no closure of path's module holds it, so the import tells when it changes."""
    node, calls = found
    if node is not None and _top_package(source) != _top_package(path):
        calls += ("?",)
    return node, calls


UNSPECIALIZED = ("do_not_specialize", "do_not_specialize_on_alignment")   # @triton.jit's options


def _wrapped(expr) -> tuple[str | None, tuple[str, ...]]:
    """The name at the heart of nested calls (`a(x)(b(y)(name))` -> name), and the calls' names, outermost first;
    a jit call given do_not_specialize is named "jit(do_not_specialize)": it changes how the entry is specialized."""
    calls: list[str] = []
    while isinstance(expr, ast.Call) and expr.args:
        factory = expr.func.func if isinstance(expr.func, ast.Call) else expr.func
        name = factory.attr if isinstance(factory, ast.Attribute) else getattr(factory, "id", "?")
        keywords = [*expr.keywords, *(expr.func.keywords if isinstance(expr.func, ast.Call) else ())]
        if name == "jit" and any(k.arg in UNSPECIALIZED for k in keywords):
            name = "jit(do_not_specialize)"
        calls.append(name)
        expr = expr.args[0]
    found = _dotted(expr)
    return (found, tuple(calls)) if found is not None else (None, ())


def _dotted(expr) -> str | None:
    """`name` or `module.name` (a kernel reached through a module object: `K._rms_norm`), else None."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.insert(0, expr.attr)
        expr = expr.value
    return ".".join([expr.id, *parts]) if isinstance(expr, ast.Name) else None


def function_params(path: Path, name: str) -> tuple[str, ...] | None:
    """Parameter names of the module-level function `name` (entry_def), or None if there is none."""
    node, _ = entry_def(path, name)
    if node is None:
        return None
    a = node.args
    return tuple(x.arg for x in a.posonlyargs + a.args + a.kwonlyargs)


def default_texts(path: Path, name: str) -> dict[str, str]:
    """Each parameter of the function that has a default, and that default's source text."""
    node, _ = entry_def(path, name)
    return {} if node is None else {arg.arg: ast.unparse(default) for arg, default in _defaults(node)}


def _defaults(node: ast.FunctionDef) -> list[tuple[ast.arg, ast.expr]]:
    """(parameter, its default's expression) for each parameter of the def that has one."""
    a = node.args
    positional = a.posonlyargs + a.args
    return [*zip(positional[len(positional) - len(a.defaults):], a.defaults),
            *((x, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None)]


def function_defaults(path: Path, name: str) -> dict:
    """The literal default values of the module-level function's parameters (`BLOCK: tl.constexpr = 128`), and
    those given by a name the def's module binds once to a literal (`DEFAULT_BLOCK = 512` or `tl.constexpr(512)`
    at its top, or imported from a module of the same top-level package); any other default is left out."""
    node, _ = entry_def(path, name)
    if node is None:
        return {}
    found = {}
    for arg, default in _defaults(node):
        if isinstance(default, ast.Name):   # a module-level def's: a nested one's names may be its scope's
            where = getattr(node, "kforge_file", None)
            value = _NOT_LITERAL if where is None else _module_constant(where, default.id, 0)
        else:
            value = _literal(default)
        if value is not _NOT_LITERAL:
            found[arg.arg] = value
    return found


_NOT_LITERAL = object()


def _literal(expr):
    """The plain value of a literal expression (`512`, `tl.constexpr(512)`), else _NOT_LITERAL."""
    if isinstance(expr, ast.Call) and len(expr.args) == 1 and not expr.keywords and \
            (getattr(expr.func, "attr", None) or getattr(expr.func, "id", None)) == "constexpr":
        expr = expr.args[0]
    try:
        value = ast.literal_eval(expr)
    except ValueError:
        return _NOT_LITERAL
    return value if value is None or isinstance(value, (bool, int, float, str)) else _NOT_LITERAL


def _module_constant(path: Path, name: str, depth: int):
    """The literal a module binds `name` to, once and unconditionally at its top (or imports from a module of its
    own top-level package); else _NOT_LITERAL."""
    if depth > 8:
        return _NOT_LITERAL
    tree = parse(path)
    if _rebinds_any(tree, name):
        return _NOT_LITERAL
    visited: set[Path] = set()   # the star-imported modules asked already, for all of this module's star imports
    bindings = [n for n in module_level(tree.body) if _binds(n, name) or _star_binds(path, n, name, visited)]
    if len(bindings) != 1 or bindings[0] not in tree.body:   # rebound, or bound under an if / try
        return _NOT_LITERAL
    node = bindings[0]
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and _assigns(node, name):
        return _literal(node.value)
    if isinstance(node, ast.ImportFrom):
        alias = next(a for a in node.names if (a.asname or a.name) == name or a.name == "*")
        source = _imported_module(path, node)
        if source is not None and _top_package(source) == _top_package(path):
            return _module_constant(source, name if alias.name == "*" else alias.name, depth + 1)
    return _NOT_LITERAL


def _binds(node, name: str) -> bool:
    """Whether a module-level statement binds `name` by its own words (a star import aside): an assignment in any
    form (a tuple, a for or with target, `:=`), a def or class, an import of that name."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name == name
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return any((a.asname or a.name.split(".")[0]) == name for a in node.names if a.name != "*")
    if isinstance(node, ast.AnnAssign) and node.value is None:   # an annotation alone binds nothing
        return False
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) or   # a match's captures:
               isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name == name or   # names, not ast.Name
               isinstance(n, ast.MatchMapping) and n.rest == name for n in _own_nodes(node))


def _own_nodes(node):
    """node and what lies under it, but not inside the functions, classes and lambdas it holds (their own scope)."""
    todo = [node]
    while todo:
        found = todo.pop()
        yield found
        if found is node or not isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(found))


def _rebinds_any(tree: ast.Module, name: str) -> bool:
    """Whether a module may bind `name` in ways no statement names: `global name` in a function (which its import
    may call), or at its top globals(), vars(), exec, or setattr on sys.modules[__name__]."""
    if any(isinstance(n, ast.Global) and name in n.names for n in ast.walk(tree)):
        return True
    return any(isinstance(n, ast.Call) and _binds_by_call(n) for statement in tree.body for n in _own_nodes(statement))


def _binds_by_call(call: ast.Call) -> bool:
    """A call that may bind any name of the module it runs in (vars and setattr only of that module)."""
    called = call.func.id if isinstance(call.func, ast.Name) else None
    if called == "vars":
        return not call.args
    if called == "setattr":   # of this very module: sys.modules[__name__], never another object's attribute
        return bool(call.args) and any(isinstance(x, ast.Name) and x.id == "__name__" for x in ast.walk(call.args[0]))
    return called in ("globals", "exec")


STAR_MODULES = 64   # star-imported modules one lookup reads at most; past them, a name is taken as rebound


def _star_binds(path: Path, node, name: str, visited: set) -> bool:
    """Whether `from X import *` may bind `name`: unless X is a module of path's own top-level package that surely
    exports no such name (one literal __all__ without it; without __all__, no binding of it at its top or through
    its own star imports, or a private name). Each module is read once (`visited`): met again, on a loop of star
    imports or another way to it, it adds nothing (modules that each star-import every one of the next layer made
    the paths, not the modules, exponential)."""
    if not (isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)):
        return False
    source = _imported_module(path, node)
    if source is None or _top_package(source) != _top_package(path) or len(visited) >= STAR_MODULES:
        return True   # another package's: anything
    if source in visited:
        return False
    visited.add(source)
    try:
        tree = parse(source)
    except (OSError, SyntaxError, ValueError):
        return True
    statements = module_level(tree.body)
    named_all = [n for n in statements if any(isinstance(x, ast.Name) and x.id == "__all__" for x in ast.walk(n))]
    if named_all:   # trusted only as one literal list or tuple at the top, never changed after
        listed = _names(named_all[0].value) if len(named_all) == 1 and _assigns(named_all[0], "__all__") and \
            named_all[0] in tree.body else None
        return listed is None or name in listed
    if name.startswith("_"):
        return False
    return _rebinds_any(tree, name) or any(_binds(n, name) or _star_binds(source, n, name, visited)
                                           for n in statements)


def _names(expr) -> list | None:
    """A literal list or tuple of strings (an __all__), else None."""
    try:
        value = ast.literal_eval(expr)
    except ValueError:
        return None
    return list(value) if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value) else None


def module_name(path: Path, root: Path) -> str:
    """kernels/gemm.py under root -> 'kernels.gemm' (what the compiling process imports)."""
    rel = path.resolve().relative_to(root.resolve()).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


BUILD_DIR = "out"   # at the root: kforge's outputs
NOT_PROJECT_DIRS = {"site-packages", "dist-packages", "__pycache__", "node_modules"}   # at any depth


def project_source_problem(path: Path, root: Path) -> str | None:
    """Why `path` is not project source (see the module docstring), or None when it is."""
    try:
        rel = path.resolve().relative_to(root.resolve())
    except ValueError:
        return f"it is outside the project ({root})"
    folders = rel.parts[:-1]
    for i, part in enumerate(folders):
        if part.startswith("."):
            return f"it is inside the hidden directory {'/'.join(folders[:i + 1])}/"
        if part in NOT_PROJECT_DIRS or (i == 0 and part == BUILD_DIR):
            return f"it is inside {'/'.join(folders[:i + 1])}/, which holds no project source"
        if _is_virtualenv(root.resolve().joinpath(*folders[:i + 1])):
            return f"it is inside the virtualenv {'/'.join(folders[:i + 1])}/"
    return None


@functools.lru_cache(maxsize=None)
def _is_virtualenv(directory: Path) -> bool:
    return (directory / "pyvenv.cfg").is_file()


def local_closure(path: Path, root: Path, misses: set[Path] | None = None) -> tuple[Path, ...]:
    """The source and every project module it imports, transitively, with the package __init__.py files importing
    them runs, sorted. `misses` collects the project files an import looked for in vain (<root>/torch.py, ...)."""
    seen: set[Path] = set()
    root = root.resolve()
    todo = [path.resolve()]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        todo += [q for q in (*_local_imports(p, root, misses), *package_inits(p, root))
                 if q not in seen and project_source_problem(q, root) is None]
    return tuple(sorted(seen))


def package_inits(path: Path, root: Path) -> list[Path]:
    """The __init__.py of every package a module lies in, below the project root: importing it runs them."""
    found = []
    for folder in path.parents:
        if folder == root or root not in folder.parents:
            break
        init = folder / "__init__.py"
        if init.is_file() and init != path:   # named under root as path is (a link on the way stays a name)
            found.append(init)
    return found


# calls that import a module named at run time: what they load cannot be read from the source
DYNAMIC_IMPORTS = {"__import__", "import_module", "spec_from_file_location", "run_path", "SourceFileLoader"}


def _local_imports(path: Path, root: Path, misses: set[Path] | None = None) -> list[Path]:
    found = []
    package = path.parent
    if any(isinstance(n, ast.Call) and (getattr(n.func, "id", None) or getattr(n.func, "attr", None))
           in DYNAMIC_IMPORTS for n in ast.walk(parse(path))):
        found += _package_files(path, root)   # a run-time import: every module it could load counts
    for level, names in import_names(path):
        base = root if level == 0 else up(package, level - 1)
        for dotted in names:
            f = _resolve(base, dotted.split("."), misses)
            if f is not None:
                found.append(f)
    return found


@_per_version
def import_names(path: Path) -> tuple[tuple[int, tuple[str, ...]], ...]:
    """(level, dotted names) of each import statement of the file, 0 for absolute; `from x import y` gives both x.y
    and x (y may be a module or a name)."""
    found = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            found.append((0, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            mod = node.module.split(".") if node.module else []
            names = [".".join(mod + [a.name]) for a in node.names] + ([".".join(mod)] if mod else [])
            found.append((node.level, tuple(names)))
    return tuple(found)


def _package_files(path: Path, root: Path) -> list[Path]:
    """Every project .py file of the top-level package `path` lies in (of the whole project for a module at its
    root): what a run-time import in it could load."""
    rel = path.resolve().relative_to(root)
    top = root / rel.parts[0] if len(rel.parts) > 1 else root
    return sorted(f.resolve() for f in top.rglob("*.py") if project_source_problem(f, root) is None)


def up(p: Path, n: int) -> Path:
    for _ in range(n):
        p = p.parent
    return p


def _resolve(base: Path, parts: list[str], misses: set[Path] | None = None) -> Path | None:
    """The project source file a dotted import names under base (package/__init__.py or module.py)."""
    target = base.joinpath(*parts)
    candidates = (target / "__init__.py", target.with_suffix(".py"))   # Python's order: a package first
    for candidate in candidates:
        if candidate.is_file():
            return candidate.resolve()
    if misses is not None:
        misses.update(candidates)
    return None


def digest_files(paths: tuple[Path, ...], root: Path) -> tuple[tuple[str, str], ...]:
    """(relative path, sha256 of content) per file: content, not mtime, so a touch changes nothing."""
    return tuple((str(p.relative_to(root.resolve())), _sha256(p)) for p in paths)


@_per_version
def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
