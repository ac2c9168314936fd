"""sembed's service. Its version is the installed package's: one number, from pyproject.toml."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sembed")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
