"""A request kio read, decided by its API's one handler, as the connection decides it."""

from __future__ import annotations

from typing import Any

from pidctl.controller.api.access import ConnectionInfo
from pidctl.controller.api.handlers import Controller
from pidctl.controller.api.quorum import Now
from pidctl.protocol.apis import ApiKey
from pidctl.protocol.block_requests import block_request_of
from pidctl.protocol.codec import Request
from pidctl.protocol.init_requests import init_request_of


def decide(controller: Controller, request: Request, now: Now, conn: ConnectionInfo) -> Any:
    """What the API's handler answers ``request`` with (InitProducerId's ``InitAnswer``,
    AllocateProducerIds' block, offset and the PIDs it created, the others' ``Reply``)."""
    if request.api_key == ApiKey.INIT_PRODUCER_ID:
        return controller.inits.init_producer_id(init_request_of(request), now, conn)
    if request.api_key == ApiKey.ALLOCATE_PRODUCER_IDS:
        return controller.allocations.allocate_producer_ids(block_request_of(request), now, conn)
    return controller.handle(request, now, conn)
