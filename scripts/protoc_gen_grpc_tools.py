"""A protoc plugin that runs one of the generators built into the pinned grpcio-tools.

buf hands plugins a CodeGeneratorRequest; grpcio-tools only exposes its generators (``python``,
``grpc_python``, ``pyi``) through its bundled protoc. This shim feeds the request's descriptors
back into that protoc with ``--descriptor_set_in`` and returns what it writes, so ``buf generate``
works with nothing but the packages in requirements/dev.txt and every machine produces the same
bytes. Usage in buf.gen.yaml: ``local: [.venv/bin/python, scripts/protoc_gen_grpc_tools.py, NAME]``.
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from grpc_tools import protoc


def main() -> int:
    generator = sys.argv[1]
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    response = plugin_pb2.CodeGeneratorResponse(
        supported_features=plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    )
    with tempfile.TemporaryDirectory() as tmp:
        descriptors = pathlib.Path(tmp, "descriptors.binpb")
        descriptors.write_bytes(
            descriptor_pb2.FileDescriptorSet(file=request.proto_file).SerializeToString()
        )
        out = pathlib.Path(tmp, "out")
        out.mkdir()
        args = [
            "protoc",
            f"--descriptor_set_in={descriptors}",
            f"--{generator}_out={out}",
            *request.file_to_generate,
        ]
        if protoc.main(args) != 0:
            response.error = f"grpc_tools.protoc failed for generator {generator}"
        else:
            for path in sorted(out.rglob("*")):
                if path.is_file():
                    response.file.add(name=str(path.relative_to(out)), content=path.read_text())
    sys.stdout.buffer.write(response.SerializeToString())
    return 0


if __name__ == "__main__":
    sys.exit(main())
