"""One answerer per kind of request, what ``protocol/server.py``'s readers yield (whichever
reader read it, whatever the settings): each has its API's one handler decide it
(``api/handlers.py``), unless a strict quota refuses it first, has it accounted for
(``accounting.py``) and adds its encoded answer to the round (``decided.py``)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable
from typing import Final

from pidctl.controller.api.access import ConnectionInfo
from pidctl.controller.api.handlers import Controller
from pidctl.controller.api.init_producer_id import IdempotentRun, InitAnswer
from pidctl.controller.api.quorum import Now
from pidctl.controller.api.responses import NO_WAIT, QUOTA_REFUSALS
from pidctl.controller.core.producer_ids import Block
from pidctl.controller.core.quotas import quota_subject
from pidctl.controller.server.telemetry.metrics import api_name
from pidctl.controller.server.transport.accounting import Accounting
from pidctl.controller.server.transport.decided import Round
from pidctl.protocol.apis import ApiKey
from pidctl.protocol.block_requests import BlockRequested
from pidctl.protocol.codec import (
    allocate_producer_ids_answer,
    encode_response,
    frame_response,
    init_producer_id_answer,
)
from pidctl.protocol.headers import client_id_in
from pidctl.protocol.idempotent_inits import answer_run
from pidctl.protocol.init_requests import InitRequested
from pidctl.protocol.server import IdempotentInits, RequestReceived

_SASL_APIS: Final = (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)
_INIT_PRODUCER_ID: Final = api_name(ApiKey.INIT_PRODUCER_ID)
_ALLOCATE_PRODUCER_IDS: Final = api_name(ApiKey.ALLOCATE_PRODUCER_IDS)
_INIT_PRODUCER_ID_KEY: Final = int(ApiKey.INIT_PRODUCER_ID)
_ALLOCATE_PRODUCER_IDS_KEY: Final = int(ApiKey.ALLOCATE_PRODUCER_IDS)
#: The answers of requests a strict quota refuses undecided (api/responses.py says why
#: these errors): an InitProducerId's, alone or a run of one, and an AllocateProducerIds'.
_OVER_QUOTA_INIT: Final = InitAnswer(QUOTA_REFUSALS[ApiKey.INIT_PRODUCER_ID])
_OVER_QUOTA_RUN: Final = IdempotentRun((), QUOTA_REFUSALS[ApiKey.INIT_PRODUCER_ID], NO_WAIT)
_OVER_QUOTA_BLOCK: Final = Block(QUOTA_REFUSALS[ApiKey.ALLOCATE_PRODUCER_IDS], 0, 0)


class Answerers:
    """Decide and answer one request (or one run of idempotent InitProducerIds) into a
    round; each returns the entries it counts for in the round's budget."""

    def __init__(self, controller: Controller, accounting: Accounting) -> None:
        self.controller = controller
        # The handlers of the APIs read as values of their own, bound once.
        self.inits = controller.inits
        self.allocations = controller.allocations
        self.accounting = accounting

    def answer_request(
        self,
        event: RequestReceived,
        decided_at: Now,
        info: ConnectionInfo,
        decided: Round,
        received: float,
    ) -> int:
        """Decide and answer a request kio read, of an API without a value of its own (not
        InitProducerId or AllocateProducerIds): the controller's :meth:`Controller.handle`.
        The entries it counts for in the round's budget."""
        request = event.request
        if request.api_key in _SASL_APIS:
            decided.sasl = request
            return 1
        header = request.header
        api = api_name(request.api_key)
        # Unpacked at once: one step, where each field read by name is a lookup.
        body, durable_offset, encoded = self.controller.handle(request, decided_at, info)
        # (No API answered here takes a quota: none refuses it.)
        client_id = header.client_id
        delay = self.accounting.accounted(
            api,
            header.api_version,
            getattr(body, "error_code", 0),
            0,
            0.0,
            request.api_key,
            client_id,
            client_id,
            header.correlation_id,
            info,
        )
        if delay:
            millis = datetime.timedelta(milliseconds=round(delay * 1000))
            data = encode_response(header, dataclasses.replace(body, throttle_time=millis))
        elif encoded is None:
            data = encode_response(header, body)
        else:  # (ApiVersions: its body encoded once, by controller/api/responses.py)
            data = frame_response(header, body, encoded)
        decided.answers.add(data, durable_offset, api, received)
        decided.throttle = delay
        return 1 + request.entries

    def answer_init(
        self,
        request: InitRequested,
        decided_at: Now,
        info: ConnectionInfo,
        decided: Round,
        received: float,
    ) -> int:
        """Decide and answer an InitProducerId (read by ``struct`` or kio; not an idempotent
        run's): :meth:`InitProducerIdHandler.init_producer_id`, unless its quota refuses it
        first."""
        version, correlation_id = request.api_version, request.correlation_id
        client_id = request.client_id
        refused = self.accounting.refusal(
            _INIT_PRODUCER_ID, _INIT_PRODUCER_ID_KEY, client_id, True, info
        )
        if refused:
            answer = _OVER_QUOTA_INIT
        else:
            answer = self.inits.init_producer_id(request, decided_at, info)
        error = answer.error
        delay = self.accounting.accounted(
            _INIT_PRODUCER_ID,
            version,
            error,
            answer.created,
            refused,
            _INIT_PRODUCER_ID_KEY,
            client_id,
            client_id,
            correlation_id,
            info,
        )
        data = init_producer_id_answer(
            version,
            correlation_id,
            error,
            answer.producer_id,
            answer.producer_epoch,
            round(delay * 1000) if delay else 0,
        )
        decided.answers.add(data, answer.durable_offset, _INIT_PRODUCER_ID, received)
        decided.throttle = delay
        return 1

    def answer_run(
        self,
        run: IdempotentInits,
        decided_at: Now,
        info: ConnectionInfo,
        decided: Round,
        received: float,
    ) -> int:
        """Decide and answer a run of idempotent InitProducerIds (one version, their
        correlation ids in order): :meth:`InitProducerIdHandler.init_idempotent_run`. A run
        of one (every run while a quota or the request log needs each request alone)
        is refused and accounted for as :meth:`answer_init` does one; how many requests."""
        version, correlation_ids, frame = run
        count = len(correlation_ids)
        if count == 1:
            correlation_id = correlation_ids[0]
            # Read only for what asks for it (a quota, the request log).
            client_id = client_id_in(frame) if self.accounting.one_at_a_time else None
            refused = self.accounting.refusal(
                _INIT_PRODUCER_ID, _INIT_PRODUCER_ID_KEY, client_id, True, info
            )
            if refused:
                answer = _OVER_QUOTA_RUN
            else:
                answer = self.inits.init_idempotent_run(1, decided_at, info)
            pids, error = answer.producer_ids, answer.error
            granted = len(pids)
            delay = self.accounting.accounted(
                _INIT_PRODUCER_ID,
                version,
                0 if granted else error,
                granted,
                refused,
                _INIT_PRODUCER_ID_KEY,
                client_id,
                client_id,
                correlation_id,
                info,
            )
            throttle_ms = round(delay * 1000) if delay else 0
            if granted:
                data = init_producer_id_answer(version, correlation_id, 0, pids[0], 0, throttle_ms)
            else:
                data = init_producer_id_answer(version, correlation_id, error, -1, -1, throttle_ms)
            decided.answers.add(data, answer.durable_offset, _INIT_PRODUCER_ID, received)
            decided.throttle = delay
            return 1
        # (Longer runs only without a quota or the request log: counted, never throttled.)
        answer = self.inits.init_idempotent_run(count, decided_at, info)
        pids, error = answer.producer_ids, answer.error
        granted = len(pids)
        if granted < count:
            self.accounting.tally(_INIT_PRODUCER_ID, version, error, count - granted)
        self.accounting.tally(_INIT_PRODUCER_ID, version, 0, granted)
        if granted:
            self.accounting.new_producer_ids(info.principal, granted)
        decided.answers.add_run(
            answer_run(version, correlation_ids, pids, error),
            answer.durable_offset,
            _INIT_PRODUCER_ID,
            received,
        )
        return count

    def answer_block(
        self,
        request: BlockRequested,
        decided_at: Now,
        info: ConnectionInfo,
        decided: Round,
        received: float,
    ) -> int:
        """Decide and answer an AllocateProducerIds (read by ``struct`` or kio):
        :meth:`AllocateProducerIdsHandler.allocate_producer_ids`, unless its quota refuses
        it first."""
        client_id, correlation_id = request.client_id, request.correlation_id
        subject, creates = quota_subject(_ALLOCATE_PRODUCER_IDS_KEY, client_id, request)
        refused = self.accounting.refusal(
            _ALLOCATE_PRODUCER_IDS, _ALLOCATE_PRODUCER_IDS_KEY, subject, creates, info
        )
        if refused:
            block, offset, created = _OVER_QUOTA_BLOCK, NO_WAIT, 0
        else:
            block, offset, created = self.allocations.allocate_producer_ids(
                request, decided_at, info
            )
        error = block.error
        delay = self.accounting.accounted(
            _ALLOCATE_PRODUCER_IDS,
            0,
            error,
            created,
            refused,
            _ALLOCATE_PRODUCER_IDS_KEY,
            subject,
            client_id,
            correlation_id,
            info,
        )
        throttle_ms = round(delay * 1000) if delay else 0
        data = allocate_producer_ids_answer(
            correlation_id, error, block.first, block.length, throttle_ms
        )
        decided.answers.add(data, offset, _ALLOCATE_PRODUCER_IDS, received)
        decided.throttle = delay
        return 1


#: The requests ``protocol/server.py``'s readers yield, and the one answerer of each kind
#: (whichever reader read it, whatever the settings).
ANSWERERS: Final[dict[type, Callable[..., int]]] = {
    RequestReceived: Answerers.answer_request,
    IdempotentInits: Answerers.answer_run,
    InitRequested: Answerers.answer_init,
    BlockRequested: Answerers.answer_block,
}
