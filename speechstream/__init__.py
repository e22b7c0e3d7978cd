"""speechstream: streaming speech-to-text with decoder-only LLMs and group position encoding."""

from pathlib import Path

__version__ = "0.1.0"


def shipped_dir(package: Path, name: str) -> Path:
    """A folder the project ships (``models``, ``samples``): ``<package>/<name>`` in an installed wheel, else
    ``<name>/`` beside the package (a checkout or an editable install: the repository root)."""
    installed = package / name
    return installed if installed.is_dir() else package.parent / name
