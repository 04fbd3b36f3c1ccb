"""The built wheel, installed with its dependencies in a fresh venv, works on its own: the SQL
files ship inside it and the ``cce`` command runs (slow: builds and installs packages)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.processes]

CHECK = textwrap.dedent("""
    import json, sys
    from importlib.resources import files
    from pathlib import Path
    import cce_duck
    from cce_duck import Engine, migrations
    from cce_duck.sqlfiles import macro_files, migration_files

    prefix = Path(sys.prefix).resolve()
    assert Path(cce_duck.__file__).resolve().is_relative_to(prefix), cce_duck.__file__
    sql = files("cce_duck.sql")
    assert Path(str(sql)).resolve().is_relative_to(prefix), str(sql)
    manifest = json.loads((sql / "manifest.json").read_text("utf-8"))["files"]
    for name in manifest:
        assert (sql / name).is_file(), name
    assert (sql / "schema.sql").is_file() and (sql / "queries.sql").is_file()
    assert json.loads((sql / "ranking_v1.json").read_text("utf-8"))["version"] == 1
    assert sorted("macros/" + m + ".sql" for m in macro_files()) == sorted(
        n for n in manifest if n.startswith("macros/"))
    assert migrations.SCHEMA_VERSION == len(migration_files()) >= 1
    static = files("cce_duck") / "dashboard" / "static"
    for name in ("index.html", "dashboard.js", "dashboard.css"):
        assert (static / name).is_file(), name
    assert "dashboard.js" in (static / "index.html").read_text("utf-8")

    eng = Engine(data_dir=sys.argv[1], embedder="hash")
    msgs = [{"role": "user" if i % 2 == 0 else "assistant",
             "content": f"Turn {i}: we discussed topic {i // 4} in detail, item {i}."}
            for i in range(30)]
    msgs[3]["content"] = "The office wifi password is ZEBRA-4471."
    eng.ingest("pkg", msgs)
    payload = eng.context("pkg", "what is the wifi password?", max_tokens=200)
    assert payload.tokens <= 200, payload.tokens
    assert "ZEBRA-4471" in payload.to_string(), payload.to_string()
    eng.close()
    print("OK", cce_duck.__version__, len(manifest))
""")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 900
         ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def test_wheel_installs_and_runs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}

    # 1. build from a copy of the sources (the work tree stays untouched)
    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("cce_duck", "sql", "udfs"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    built = _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist)], src, env)
    (wheel,) = dist.glob("cce_duck-*.whl")
    # every shipped folder is a declared package: setuptools has nothing to warn about
    assert "absent from the `packages` configuration" not in built.stdout + built.stderr

    # 2. the wheel holds the SQL, the data and the entry point
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        manifest = json.loads((ROOT / "sql" / "manifest.json").read_text("utf-8"))["files"]
        for rel in [*manifest, "manifest.json", "schema.sql", "queries.sql"]:
            assert f"cce_duck/sql/{rel}" in names, rel
        assert "cce_duck/udfs/__init__.py" in names
        assert "cce_duck/py.typed" in names
        assert "cce_duck/data/sample_conversation.json" in names
        # the dashboard's page, script and style sheet (served by `cce serve ui`, no CDN)
        static = sorted(p.name for p in (ROOT / "cce_duck" / "dashboard" / "static").iterdir())
        assert {"index.html", "dashboard.js", "dashboard.css"} <= set(static)
        for name in static:
            rel = f"cce_duck/dashboard/static/{name}"
            assert zf.read(rel) == (ROOT / rel).read_bytes(), rel
        assert "cce_duck/dashboard/app.py" in names
        (ep,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "cce = cce_duck.cli:main" in zf.read(ep).decode()
        assert "cce-mcp = cce_duck.cli.serve:mcp_main" in zf.read(ep).decode()

    # 3. a fresh venv with the wheel and its dependencies (no source tree on the path)
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    py = venv / "bin" / "python"
    _run([str(py), "-m", "pip", "install", "--quiet", str(wheel)], tmp_path, env)

    work = tmp_path / "cwd"
    work.mkdir()
    env_hash = {**env, "CCE_EMBEDDER": "hash", "CCE_DATA_DIR": str(tmp_path / "data")}
    out = _run([str(py), "-c", CHECK, str(tmp_path / "store")], work, env_hash).stdout
    assert out.startswith("OK 0.1.0")

    # 4. the command line, with the default embedder (the model shipped as a package)
    cce = venv / "bin" / "cce"
    assert "demo" in _run([str(cce), "--help"], work, env_hash).stdout
    env_auto = {k: v for k, v in env_hash.items() if k != "CCE_EMBEDDER"}
    demo = _run([str(cce), "demo"], work, env_auto, timeout=600).stdout
    assert "context:" in demo
    assert "(cap 300)" in demo
    assert "temporary" in demo
    assert "--data-dir" in demo
    assert not (work / ".cce_data").exists(), "the demo keeps its data in a temporary folder"
