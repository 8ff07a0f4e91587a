"""A signed call over TLS, through ConnectionConfig(tls=TlsConfig(...))."""

from __future__ import annotations

from pathlib import Path

import grpc
from sdk_testing import NodeServicer
from tls_testing import self_signed

from rollnet.sdk import (
    ConnectionConfig,
    Identity,
    KnownKey,
    NodeClient,
    RequestVerifier,
    TlsConfig,
    VerifierConfig,
    default_method_policy,
    open_channel,
)
from rollnet.sdk.testing import NETWORK_ID
from rollnet.v1 import common_pb2, node_service_pb2, node_service_pb2_grpc


async def test_signed_call_over_tls(tmp_path: Path) -> None:
    identity = Identity.generate()
    known = KnownKey(identity.node_id, common_pb2.ROLE_WORKER)

    async def resolve(public_key: bytes) -> KnownKey | None:
        return known if public_key == identity.public_key else None

    verifier = RequestVerifier(
        VerifierConfig(NETWORK_ID, key_resolver=resolve, method_policy=default_method_policy())
    )
    key_pem, cert_pem = self_signed("rollnet.test")
    server = grpc.aio.server(interceptors=[verifier])
    nodes = NodeServicer()  # type: ignore[abstract]
    node_service_pb2_grpc.add_NodeServiceServicer_to_server(nodes, server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key_pem, cert_pem)]))
    await server.start()
    try:
        roots = tmp_path / "roots.pem"
        roots.write_bytes(cert_pem)
        config = ConnectionConfig(
            target=f"127.0.0.1:{port}",
            network_id=NETWORK_ID,
            tls=TlsConfig(root_certificates=roots, server_name_override="rollnet.test"),
            timeout=5.0,
        )
        async with open_channel(config, identity) as channel:
            response = await NodeClient(channel).get_node(
                node_service_pb2.GetNodeRequest(node_id="tls")
            )
        assert response.node.node_id == "tls"
        assert nodes.observed[0].caller_node_id == identity.node_id
    finally:
        await server.stop(None)
