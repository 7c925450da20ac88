import os
import sys

sys.path.insert(0, os.path.dirname(__file__))


def series_tree(dest, upto=None):
    """sglang 0.5.23 from PyPI (cached) copied to `dest` with the repo's patch series applied: all of it, or the
    patches before `upto` (a name prefix such as "0017")."""
    import dataclasses
    import subprocess
    from pathlib import Path

    from sglfleet.patches import DEFAULT_CACHE, apply_series, fetch_sglang, load_series

    series = load_series(Path(__file__).resolve().parents[2] / "src" / "sglfleet" / "patches" / "sglang-0.5.23")
    if upto is not None:
        series = dataclasses.replace(series, patches=tuple(p for p in series.patches if p.name < upto))
    upstream = fetch_sglang("0.5.23", DEFAULT_CACHE)
    subprocess.run(["cp", "-a", str(upstream / "sglang"), str(dest)], check=True)
    rep = apply_series(series, dest)
    assert rep.ok, rep
    return dest


def functions_from(src, names, ns):
    """The module-level functions `names` of Python source `src`, compiled into namespace `ns` (the module itself
    is not imported: its imports need a GPU stack). Returns ns."""
    import ast

    body = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name in names]
    exec(compile(ast.Module(body=body, type_ignores=[]), "<patched sglang>", "exec"), ns)
    return ns
