"""The package's own PEP 517 build backend, standard library only.

Why not setuptools: pip builds a project in an isolated environment into
which it first installs the backend's requirements from an index. Where
there is none (an offline machine, a Debian host without PyPI), a backend
that needs setuptools and wheel cannot be installed, and `pip install
./sdk/python` fails before it starts. This backend needs nothing: it zips
the pure-Python package into a wheel (PEP 427) itself. It also makes the
sdist (PEP 517), and editable installs (PEP 660) as a .pth file.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import time
import zipfile
from typing import Any, Dict, List, Optional, Tuple

NAME = "openshell"
SUMMARY = "Python client of the openshell gateway's API (sandboxes for AI agents)"
REQUIRES_PYTHON = ">=3.9"
TAG = "py3-none-any"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, NAME)


def _version() -> str:
    with open(os.path.join(PACKAGE, "__init__.py"), encoding="utf-8") as f:
        found = re.search(r'^__version__ = "([^"]+)"', f.read(), re.MULTILINE)
    if not found:
        raise RuntimeError("openshell/__init__.py has no __version__")
    return found.group(1)


def _metadata() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    return ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\nLicense: Apache-2.0\n"
            "Requires-Python: %s\nClassifier: Programming Language :: Python :: 3\n"
            "Classifier: Operating System :: POSIX :: Linux\nClassifier: Typing :: Typed\n"
            "Description-Content-Type: text/markdown\n\n%s" %
            (NAME, _version(), SUMMARY, REQUIRES_PYTHON, readme))


def _wheel_file() -> str:
    return ("Wheel-Version: 1.0\nGenerator: openshell_build\nRoot-Is-Purelib: true\n"
            "Tag: %s\n" % TAG)


def _package_files() -> List[Tuple[str, str]]:
    """(archive name, path) of every file of the package, sorted."""
    out = []
    for directory, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(directory, name)
            out.append((os.path.relpath(path, ROOT).replace(os.sep, "/"), path))
    return out


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "%s,sha256=%s,%d" % (name, digest.decode("ascii"), len(data))


def _dist_info() -> str:
    return "%s-%s.dist-info" % (NAME, _version())


def _write_wheel(directory: str, contents: List[Tuple[str, bytes]]) -> str:
    wheel_name = "%s-%s-%s.whl" % (NAME, _version(), TAG)
    dist_info = _dist_info()
    contents = contents + [
        (dist_info + "/METADATA", _metadata().encode("utf-8")),
        (dist_info + "/WHEEL", _wheel_file().encode("utf-8")),
    ]
    record = [_record_line(name, data) for name, data in contents]
    record.append(dist_info + "/RECORD,,")
    contents.append((dist_info + "/RECORD", ("\n".join(record) + "\n").encode("utf-8")))
    # Reproducible: a fixed time for every entry (SOURCE_DATE_EPOCH wins).
    stamp = time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", "315532800")))[:6]
    with zipfile.ZipFile(os.path.join(directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in contents:
            info = zipfile.ZipInfo(name, date_time=stamp)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return wheel_name


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# PEP 517 hooks.


def get_requires_for_build_wheel(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def get_requires_for_build_editable(
        config_settings: Optional[Dict[str, Any]] = None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str,
                                     config_settings: Optional[Dict[str, Any]] = None) -> str:
    dist_info = os.path.join(metadata_directory, _dist_info())
    os.makedirs(dist_info, exist_ok=True)
    with open(os.path.join(dist_info, "METADATA"), "w", encoding="utf-8") as f:
        f.write(_metadata())
    with open(os.path.join(dist_info, "WHEEL"), "w", encoding="utf-8") as f:
        f.write(_wheel_file())
    return _dist_info()


prepare_metadata_for_build_editable = prepare_metadata_for_build_wheel


def build_wheel(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                metadata_directory: Optional[str] = None) -> str:
    return _write_wheel(wheel_directory, [(name, _read(path)) for name, path in _package_files()])


def build_editable(wheel_directory: str, config_settings: Optional[Dict[str, Any]] = None,
                   metadata_directory: Optional[str] = None) -> str:
    # The source directory on sys.path: edits take effect without a reinstall.
    return _write_wheel(wheel_directory, [(NAME + ".pth", (ROOT + "\n").encode("utf-8"))])


def build_sdist(sdist_directory: str, config_settings: Optional[Dict[str, Any]] = None) -> str:
    base = "%s-%s" % (NAME, _version())
    paths = ["pyproject.toml", "README.md", "build_backend/openshell_build.py"]
    paths += [name for name, _ in _package_files()]
    tests = os.path.join(ROOT, "tests")
    if os.path.isdir(tests):
        paths += sorted("tests/" + n for n in os.listdir(tests) if n.endswith(".py"))
    out = os.path.join(sdist_directory, base + ".tar.gz")
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        pkg_info = _metadata().encode("utf-8")
        info = tarfile.TarInfo(base + "/PKG-INFO")
        info.size, info.mode, info.mtime = len(pkg_info), 0o644, 315532800
        tar.addfile(info, io.BytesIO(pkg_info))
        for rel in paths:
            data = _read(os.path.join(ROOT, rel))
            info = tarfile.TarInfo(base + "/" + rel)
            info.size, info.mode, info.mtime = len(data), 0o644, 315532800
            tar.addfile(info, io.BytesIO(data))
    return base + ".tar.gz"
