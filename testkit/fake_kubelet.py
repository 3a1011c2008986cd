"""A fake kubelet pod-resources API: a real grpcio server of ``v1.PodResourcesLister``.

It serves ``List`` and ``GetAllocatableResources`` over a unix socket (in a
temporary folder), encoding the answers with trainmon's own codec
(``trainmon.attribution.podresources``) behind gRPC generic handlers, so the
bytes on the wire are what a kubelet sends. A test sets what it answers:

- ``pods`` / ``allocatable``: the device-plugin and DRA allocations;
- ``mode``: ``"ok"``, ``"slow"`` (each call waits ``delay_seconds``, past any
  client deadline), ``"garbage"`` (bytes that are no message), ``"unimplemented"``
  (``GetAllocatableResources`` of a kubelet before 1.21);
- ``stop()``: the kubelet goes away (the socket is removed); ``start()`` again
  brings it back on the same path.

``calls`` counts the calls by method name; ``wait_for_calls`` waits on them.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from trainmon.attribution.podresources_wire import (
    AllocatableResources,
    PodResources,
    encode_allocatable_response,
    encode_list_response,
)

SERVICE = "v1.PodResourcesLister"
#: Not a protobuf message: field 0 with an unknown wire type.
GARBAGE = b"\x07\xff\xff\xff"


class FakeKubelet:
    """``FakeKubelet(folder)``: serves on ``folder/kubelet.sock`` once started."""

    def __init__(self, folder: Path) -> None:
        self.socket = folder / "kubelet.sock"
        self.pods: list[PodResources] = []
        self.allocatable = AllocatableResources()
        self.mode = "ok"
        self.delay_seconds = 5.0
        self.calls: Counter[str] = Counter()
        self._called = threading.Condition()
        self._release = threading.Event()
        self._server: Any = None

    def start(self) -> None:
        self._release.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.method_handlers_generic_handler(SERVICE, {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=_same, response_serializer=_same),
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                self._allocatable, request_deserializer=_same, response_serializer=_same),
        })
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        """The kubelet goes away: the server stops, the socket is removed."""
        self._release.set()
        if self._server is not None:
            self._server.stop(grace=None).wait(5.0)
            self._server = None
        self.socket.unlink(missing_ok=True)

    def wait_for_calls(self, method: str, count: int, timeout: float = 10.0) -> bool:
        with self._called:
            return self._called.wait_for(lambda: self.calls[method] >= count, timeout)

    def _answer(self, method: str, context: grpc.ServicerContext, answer: bytes) -> bytes:
        with self._called:
            self.calls[method] += 1
            self._called.notify_all()
        if self.mode == "slow":
            self._release.wait(self.delay_seconds)
        if self.mode == "garbage":
            return GARBAGE
        return answer

    def _list(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        return self._answer("List", context, encode_list_response(self.pods))

    def _allocatable(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        if self.mode == "unimplemented":
            with self._called:
                self.calls["GetAllocatableResources"] += 1
                self._called.notify_all()
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method")
        return self._answer("GetAllocatableResources", context,
                            encode_allocatable_response(self.allocatable))


def _same(data: bytes) -> bytes:
    return data


@contextmanager
def fake_kubelet(folder: Path) -> Iterator[FakeKubelet]:
    """A started ``FakeKubelet`` in ``folder``, stopped (its socket removed) on exit."""
    kubelet = FakeKubelet(folder)
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()
