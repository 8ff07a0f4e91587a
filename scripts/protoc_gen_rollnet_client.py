"""A protoc plugin writing the SDK's unary client methods: ``rollnet/sdk/_client_generated.py``.

Every unary RPC of every ``rollnet.v1`` service becomes one typed ``async def`` (snake_case of the
RPC name) on a ``<Service>Methods`` base class: the request message in, the response message out,
keyword-only ``timeout``, ``metadata`` and ``retry``, and the RPC's leading proto comment as its
docstring. A request with a ``google.protobuf.Duration wait`` field is a long poll: its default
deadline covers the wait (:meth:`ServiceClient._long_poll_timeout`). :mod:`rollnet.sdk.client`
derives its clients from these classes and hand-writes only the methods that add behaviour:
streams, and the RPCs in :data:`HAND_WRITTEN` (none today). The model is
temporalio/sdk-python's ``services_generated.py``. Output is ``ruff format``-ed, so ``make codegen``
writes the same bytes on every machine and ``make check-codegen`` (CI) fails when the committed file
differs. Usage in buf.gen.yaml: ``local: [.venv/bin/python, scripts/protoc_gen_rollnet_client.py]``.
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2

OUTPUT = "rollnet/sdk/_client_generated.py"

HAND_WRITTEN: dict[str, str] = {}
"""Unary RPCs whose client methods are written by hand in rollnet.sdk.client, and why."""

_DURATION = ".google.protobuf.Duration"

_SERVICE = 6  # FileDescriptorProto.service
_METHOD = 2  # ServiceDescriptorProto.method


def snake_case(name: str) -> str:
    """``GetLatestCheckpoint`` -> ``get_latest_checkpoint``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def comments(proto: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    """Leading comments by source path."""
    return {
        tuple(location.path): location.leading_comments.strip()
        for location in proto.source_code_info.location
        if location.leading_comments.strip()
    }


def docstring(comment: str, fallback: str, indent: str = "        ") -> str:
    text = " ".join(line.strip() for line in comment.splitlines() if line.strip()) or fallback
    text = text.replace("\\", "\\\\").replace('"""', "'''")
    words, lines, line = text.split(), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > 96 - len(indent):
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    body = f"\n{indent}".join(lines)
    closing = f"\n{indent}" if len(lines) > 1 else ""
    return f'{indent}"""{body}{closing}"""'


def render(files: list[descriptor_pb2.FileDescriptorProto]) -> str:
    modules: set[str] = set()
    classes: list[str] = []
    names: list[str] = []
    for proto in files:
        notes = comments(proto)
        for s_index, service in enumerate(proto.service):
            methods: list[str] = []
            for m_index, method in enumerate(service.method):
                full = f"{proto.package}.{service.name}.{method.name}"
                if method.client_streaming or method.server_streaming or full in HAND_WRITTEN:
                    continue
                request = _python_type(method.input_type, files)
                response = _python_type(method.output_type, files)
                # A request without fields may be left out: the method sends an empty one.
                empty = not _message(method.input_type, files).field
                parameter = f"{request} | None = None" if empty else request
                argument = f"request or {request}()" if empty else "request"
                long_poll = _is_long_poll(_message(method.input_type, files))
                deadline = (
                    "            default_timeout=self._long_poll_timeout(request.wait),\n"
                    if long_poll
                    else ""
                )
                modules.update({request.split(".")[0], response.split(".")[0]})
                constant = "_" + snake_case(method.name).upper()
                comment = notes.get((_SERVICE, s_index, _METHOD, m_index), "")
                if long_poll:
                    comment += "\n\nWithout ``timeout`` the deadline covers ``request.wait``."
                doc = docstring(comment, method.name)
                methods.append(
                    f"    {constant} = method_path({service.name!r}, {method.name!r})\n\n"
                    f"    async def {snake_case(method.name)}(\n"
                    f"        self,\n"
                    f"        request: {parameter},\n"
                    f"        *,\n"
                    f"        timeout: float | None = None,\n"
                    f"        metadata: Metadata | None = None,\n"
                    f"        retry: RetryPolicy | None = None,\n"
                    f"    ) -> {response}:\n"
                    f"{doc}\n"
                    f"        return await self._unary(\n"
                    f"            self.{constant},\n"
                    f"            {argument},\n"
                    f"            {response},\n"
                    f"            timeout=timeout,\n"
                    f"            metadata=metadata,\n"
                    f"            retry=retry,\n"
                    f"{deadline}"
                    f"        )\n"
                )
            if not methods:
                continue
            name = f"{service.name}Methods"
            names.append(name)
            about = notes.get((_SERVICE, s_index), "").strip().rstrip(".")
            summary = f"``{proto.package}.{service.name}``'s unary RPCs"
            if about:
                summary += ": " + about[0].lower() + about[1:]
            doc = docstring(summary + ".", name, indent="    ")
            classes.append(f"class {name}(ServiceClient):\n{doc}\n\n" + "\n".join(methods))
    imports = ", ".join(sorted(modules))
    header = (
        "# Generated by scripts/protoc_gen_rollnet_client.py from protos/rollnet/v1"
        " (make codegen).\n"
        "# DO NOT EDIT: make check-codegen fails when this file differs from what it writes.\n"
        "# gRPC deadlines are per call (and per attempt), so the RPC methods take `timeout`.\n"
        "# ruff: noqa: ASYNC109\n"
        '"""The typed unary RPC methods of :mod:`rollnet.sdk.client`, one per RPC, generated from\n'
        'the service descriptors."""\n\n'
        "from __future__ import annotations\n\n"
        "from rollnet.sdk._service_client import Metadata, ServiceClient\n"
        "from rollnet.sdk.methods import method_path\n"
        "from rollnet.sdk.retry import RetryPolicy\n"
        f"from rollnet.v1 import {imports}\n\n\n"
    )
    exports = "".join(f'    "{name}",\n' for name in sorted(names))
    return header + "\n\n".join(classes) + f"\n\n__all__ = [\n{exports}]\n"


def _find(
    full_name: str, files: list[descriptor_pb2.FileDescriptorProto]
) -> tuple[descriptor_pb2.FileDescriptorProto, descriptor_pb2.DescriptorProto]:
    name = full_name.lstrip(".")
    for proto in files:
        prefix = proto.package + "."
        for message in proto.message_type:
            if name == prefix + message.name:
                return proto, message
    raise ValueError(f"no top-level message {full_name} in the request's files")


def _python_type(full_name: str, files: list[descriptor_pb2.FileDescriptorProto]) -> str:
    proto, message = _find(full_name, files)
    return pathlib.PurePosixPath(proto.name).stem + "_pb2." + message.name


def _message(
    full_name: str, files: list[descriptor_pb2.FileDescriptorProto]
) -> descriptor_pb2.DescriptorProto:
    return _find(full_name, files)[1]


def _is_long_poll(request: descriptor_pb2.DescriptorProto) -> bool:
    """Whether the request carries a ``google.protobuf.Duration wait``: how long the server may
    hold the call."""
    return any(f.name == "wait" and f.type_name == _DURATION for f in request.field)


def format_source(source: str) -> str:
    ruff = pathlib.Path(sys.executable).with_name("ruff")
    result = subprocess.run(
        [str(ruff), "format", "--stdin-filename", OUTPUT, "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout


def main() -> int:
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    response = plugin_pb2.CodeGeneratorResponse(
        supported_features=plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    )
    wanted = set(request.file_to_generate)
    services = [p for p in request.proto_file if p.name in wanted and p.service]
    source = render(sorted(services, key=lambda p: p.name) + _messages_only(request, services))
    response.file.add(name=OUTPUT, content=format_source(source))
    sys.stdout.buffer.write(response.SerializeToString())
    return 0


def _messages_only(
    request: plugin_pb2.CodeGeneratorRequest, services: list[descriptor_pb2.FileDescriptorProto]
) -> list[descriptor_pb2.FileDescriptorProto]:
    """The request's other rollnet.v1 files, without services: where messages are looked up."""
    names = {p.name for p in services}
    others = []
    for proto in request.proto_file:
        if proto.package == "rollnet.v1" and proto.name not in names:
            stripped = descriptor_pb2.FileDescriptorProto()
            stripped.CopyFrom(proto)
            del stripped.service[:]
            others.append(stripped)
    return others


if __name__ == "__main__":
    sys.exit(main())
