"""MkDocs hooks: the site shows the version and the repository that `pyproject.toml` and
`runfold.__version__` name, so that neither is written a second time in `mkdocs.yml`."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import runfold

_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def on_config(config: Any) -> Any:
    """Put the version in the site's name and footer, and link the repository in its header."""
    project = tomllib.loads(_PYPROJECT.read_text())["project"]
    repository = project["urls"]["Repository"]
    config["site_name"] = f"runfold {runfold.__version__}"
    config["repo_url"] = repository
    config["repo_name"] = repository.removeprefix("https://github.com/")
    config["copyright"] = f"runfold {runfold.__version__} · {project['license']}"
    return config
