"""A PEP 517 build backend for this one package, with the standard library
only: a wheel is the gen_durable/ directory plus its metadata, read from
pyproject.toml.  (pip installs it offline: no setuptools to fetch.)  It runs
on every Python the package supports (requires-python), so it reads the
[project] table itself rather than with tomllib (3.11+): keys whose values
are strings or arrays of strings, one to a line, all that table holds."""

import ast
import base64
import hashlib
import os
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "gen_durable"


def _project():
    project, table = {}, None
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                table = line.strip("[]")
            elif table == "project" and "=" in line and not line.startswith("#"):
                key, value = (part.strip() for part in line.split("=", 1))
                project[key] = ast.literal_eval(value)   # a TOML basic string or array of them is a Python literal
    return project


def _dist_name(project):
    return project["name"].replace("-", "_")


def _metadata(project):
    lines = ["Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {project['version']}",
             f"Summary: {project['description']}", f"Requires-Python: {project['requires-python']}"]
    lines += [f"Requires-Dist: {dependency}" for dependency in project.get("dependencies", [])]
    return "\n".join(lines) + "\n"


def _record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory, files):
    project = _project()
    dist = f"{_dist_name(project)}-{project['version']}"
    info = f"{dist}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = _metadata(project).encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: gd_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [_record_line(name, data) for name, data in sorted(files.items())] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel_name = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel_name), "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data in sorted(files.items()):
            wheel.writestr(name, data)
    return wheel_name


def _package_files():
    files = {}
    for directory, _, names in os.walk(os.path.join(ROOT, PACKAGE)):
        for name in sorted(names):
            if name.endswith(".py") or name == "py.typed":
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, ROOT).replace(os.sep, "/")] = f.read()
    return files


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory, _package_files())


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    """An editable install: a .pth file that puts this directory on sys.path."""
    return _write_wheel(wheel_directory, {f"{_dist_name(_project())}.pth": (ROOT + "\n").encode()})
