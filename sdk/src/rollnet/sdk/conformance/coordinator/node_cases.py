"""The coordinator suite's cases: nodes and heartbeats."""

from __future__ import annotations

import os
import time

from rollnet.sdk.conformance.coordinator._base import C, _get_node, _seconds, case, expect
from rollnet.sdk.conformance.target import (
    BAN,
    DEREGISTER,
    EJECT,
    GET_NODE,
    LIST_NODES,
    PULL_TASK,
    REINSTATE,
    Target,
    new_request_id,
)
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2, task_service_pb2


@case("node.heartbeat", "a heartbeat makes a registered node ACTIVE and grants an interval")
async def node_heartbeat(target: Target) -> None:
    worker = await target.worker(heartbeat=False)
    beat = await worker.heartbeat()
    expect(
        beat.state == node_pb2.Node.STATE_ACTIVE,
        f"after a heartbeat the node is {node_pb2.Node.State.Name(beat.state)}, not ACTIVE",
    )
    expect(beat.heartbeat_interval.ToTimedelta().total_seconds() > 0, "no heartbeat_interval")
    expect(abs(_seconds(beat.server_time) - time.time()) < 60, "server_time is more than 60 s off")
    node = await worker.call(GET_NODE, _get_node(), node_service_pb2.GetNodeResponse)
    expect(node.node.node_id == worker.node_id, "GetNode without a node id is not the caller")
    expect(node.node.state == node_pb2.Node.STATE_ACTIVE, "GetNode does not say ACTIVE")


@case(
    "node.deregistered", "after DeregisterNode: heartbeat DEREGISTERED + reregister, work refused"
)
async def node_deregistered(target: Target) -> None:
    worker = await target.worker()
    await worker.call(
        DEREGISTER,
        node_service_pb2.DeregisterNodeRequest(request_id=new_request_id(), reason="conformance"),
        node_service_pb2.DeregisterNodeResponse,
    )
    beat = await worker.heartbeat()
    expect(
        beat.state == node_pb2.Node.STATE_DEREGISTERED,
        f"a deregistered node's heartbeat says {node_pb2.Node.State.Name(beat.state)}",
    )
    expect(
        any(command.HasField("reregister") for command in beat.commands),
        "a deregistered node's heartbeat carries no ReregisterCommand",
    )
    await worker.refused(
        PULL_TASK,
        task_service_pb2.PullTaskRequest(request_id=new_request_id()),
        C.FAILED_PRECONDITION,
        "NODE_DEREGISTERED",
    )
    await target.register(worker)
    beat = await worker.heartbeat()
    expect(beat.state == node_pb2.Node.STATE_ACTIVE, "registering again did not bring it back")


@case("node.ejected", "an ejected node: heartbeat EJECTED + drain, work NODE_EJECTED, reinstate")
async def node_ejected(target: Target) -> None:
    operator = await target.peer("operator")
    worker = await target.worker()
    await operator.call(
        EJECT,
        node_service_pb2.EjectNodeRequest(
            request_id=new_request_id(), node_id=worker.node_id, reason="conformance"
        ),
        node_service_pb2.EjectNodeResponse,
    )
    beat = await worker.heartbeat()
    expect(
        beat.state == node_pb2.Node.STATE_EJECTED,
        f"an ejected node's heartbeat says {node_pb2.Node.State.Name(beat.state)}",
    )
    expect(
        any(command.HasField("drain") for command in beat.commands),
        "an ejected node's heartbeat carries no DrainCommand",
    )
    await worker.refused(
        PULL_TASK,
        task_service_pb2.PullTaskRequest(request_id=new_request_id()),
        C.PERMISSION_DENIED,
        "NODE_EJECTED",
    )
    again = await target.register(worker)
    expect(
        again.node.state == node_pb2.Node.STATE_EJECTED,
        "registering again lifted the ejection",
    )
    reinstated = await operator.call(
        REINSTATE,
        node_service_pb2.ReinstateNodeRequest(request_id=new_request_id(), node_id=worker.node_id),
        node_service_pb2.ReinstateNodeResponse,
    )
    expect(
        reinstated.node.state == node_pb2.Node.STATE_OFFLINE,
        f"a reinstated node is {node_pb2.Node.State.Name(reinstated.node.state)}, not OFFLINE",
    )
    beat = await worker.heartbeat()
    expect(beat.state == node_pb2.Node.STATE_ACTIVE, "a reinstated node's heartbeat is not ACTIVE")


@case("node.others", "a worker reading another node: ROLE_NOT_ALLOWED; the operator may")
async def node_others(target: Target) -> None:
    worker = await target.worker()
    other = await target.worker()
    await worker.refused(
        GET_NODE,
        node_service_pb2.GetNodeRequest(node_id=other.node_id),
        C.PERMISSION_DENIED,
        "ROLE_NOT_ALLOWED",
    )
    operator = await target.peer("operator")
    read = await operator.call(
        GET_NODE,
        node_service_pb2.GetNodeRequest(node_id=other.node_id),
        node_service_pb2.GetNodeResponse,
    )
    expect(read.node.node_id == other.node_id, "the operator's GetNode answered another node")
    unchanged = await operator.call(
        REINSTATE,
        node_service_pb2.ReinstateNodeRequest(request_id=new_request_id(), node_id=other.node_id),
        node_service_pb2.ReinstateNodeResponse,
    )
    expect(
        unchanged.node.state == read.node.state,
        "ReinstateNode changed a node that was not ejected",
    )


@case("node.operator_self", "an operator ejecting or banning its own key: INVALID_FIELDS node_id")
async def node_operator_self(target: Target) -> None:
    operator = await target.peer("operator")
    for method, request in (
        (
            EJECT,
            node_service_pb2.EjectNodeRequest(
                request_id=new_request_id(), node_id=operator.node_id
            ),
        ),
        (
            BAN,
            node_service_pb2.BanNodeRequest(request_id=new_request_id(), node_id=operator.node_id),
        ),
    ):
        await operator.refused(
            method, request, C.INVALID_ARGUMENT, "INVALID_FIELDS", field="node_id"
        )


@case("node.list", "ListNodes (operator) lists a registered worker; GetNode of an unknown id")
async def node_list(target: Target) -> None:
    operator = await target.peer("operator")
    worker = await target.worker()
    found = False
    token = ""
    for _ in range(1000):
        page = await operator.call(
            LIST_NODES,
            node_service_pb2.ListNodesRequest(
                page_size=500, page_token=token, role=common_pb2.ROLE_WORKER
            ),
            node_service_pb2.ListNodesResponse,
        )
        found = found or any(node.node_id == worker.node_id for node in page.nodes)
        token = page.next_page_token
        if found or not token:
            break
    expect(found, f"ListNodes(role=worker) does not list worker {worker.node_id}")
    await operator.refused(
        GET_NODE,
        node_service_pb2.GetNodeRequest(node_id=os.urandom(16).hex()),
        C.NOT_FOUND,
        "NODE_NOT_FOUND",
    )
