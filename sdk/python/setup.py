"""Builds kairos-sdk, generating the gRPC stubs from the repository's proto/ (none are committed).

The stubs land in the built package as ``kairos/v1/api_pb2.py``, ``api_pb2.pyi`` and
``api_pb2_grpc.py`` (the proto's package is ``kairos.v1``, so the generated imports resolve
inside this package).
"""

import os
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
# The repository's proto/ (pip install ./sdk/python), or a copy next to setup.py.
CANDIDATES = [HERE.parent.parent / "proto", HERE / "proto"]


def proto_root() -> Path:
    for c in CANDIDATES:
        if (c / "kairos" / "v1" / "api.proto").is_file():
            return c
    raise SystemExit(
        "kairos-sdk: cannot find kairos/v1/api.proto in "
        + " or ".join(str(c) for c in CANDIDATES)
        + ": build from the Kairos repository (pip install ./sdk/python)"
    )


class BuildWithStubs(build_py):
    def run(self) -> None:
        super().run()
        from grpc_tools import protoc  # a build requirement (pyproject.toml)

        root = proto_root()
        out = Path(self.build_lib)
        (out / "kairos" / "v1").mkdir(parents=True, exist_ok=True)
        include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
        args = [
            "grpc_tools.protoc",
            f"-I{root}",
            f"-I{include}",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--grpc_python_out={out}",
            str(root / "kairos" / "v1" / "api.proto"),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("kairos-sdk: grpc_tools.protoc failed on " + str(root))
        (out / "kairos" / "v1" / "__init__.py").write_text(
            '"""Generated from proto/kairos/v1/api.proto at build time."""\n'
        )


class SdistWithProto(sdist):
    """An sdist carries the proto (as ``proto/``), so a wheel can be built from it alone."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        src = proto_root() / "kairos" / "v1" / "api.proto"
        dst = Path(base_dir) / "proto" / "kairos" / "v1" / "api.proto"
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(src.read_bytes())


def runtime_requirements() -> list[str]:
    """The stubs check at import that the protobuf runtime is at least the version of the
    compiler that generated them (same major): require exactly that range."""
    try:
        from google.protobuf import __version__ as gencode
    except ImportError:  # metadata read without the build requirements
        return ["grpcio>=1.60", "protobuf"]
    major = int(gencode.split(".")[0])
    return ["grpcio>=1.60", f"protobuf>={gencode},<{major + 1}"]


setup(cmdclass={"build_py": BuildWithStubs, "sdist": SdistWithProto}, install_requires=runtime_requirements())
