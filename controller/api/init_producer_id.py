"""InitProducerId's one handler, whichever reader read the request: a transactional id's
PID and epoch (``core/transactions.init_transactional``), an idempotent producer's PID from
the controller's pool, a run of them at a time (``init_idempotent_run``; one alone is a run
of one), authorised and applied; an idempotent answer waits only for its
PID's block's grant (``pool_grants.py``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from kio.schema.errors import ErrorCode

from pidctl.controller.api.access import Access, ConnectionInfo
from pidctl.controller.api.pool_grants import PoolGrants
from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.api.responses import NO_WAIT
from pidctl.controller.core.transactions import parse_expected
from pidctl.protocol.init_requests import InitRequested

#: Error codes compared on every InitProducerId, looked up once: a member read through its
#: enum class costs ~120 ns (the metaclass is searched first).
_NO_ERROR: Final = ErrorCode.none
_NO_PRODUCER_ID_YET: Final = ErrorCode.coordinator_load_in_progress
_FENCED: Final = ErrorCode.producer_fenced
_DENIED: Final = ErrorCode.cluster_authorization_failed


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final (compiled rule 1)
class InitAnswer:
    """An InitProducerId's answer: the error, the producer id and epoch (-1, -1 with an
    error), the offset to be durable before it is sent, and the producer ids it created (1
    for a new PID, for the quota on them; else 0)."""

    error: Final[ErrorCode]
    producer_id: Final[int]
    producer_epoch: Final[int]
    durable_offset: Final[int]
    created: Final[int]

    def __init__(
        self,
        error: ErrorCode,
        producer_id: int = -1,
        producer_epoch: int = -1,
        durable_offset: int = NO_WAIT,
        created: int = 0,
    ) -> None:
        self.error = error
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.durable_offset = durable_offset
        self.created = created


_TRANSACTIONAL_ID_DENIED: Final = InitAnswer(ErrorCode.transactional_id_authorization_failed)
_IDEMPOTENT_WRITE_DENIED: Final = InitAnswer(ErrorCode.cluster_authorization_failed)
#: InitProducerId while grants are paused: the error every client retries.
_PAUSED_INIT: Final = InitAnswer(ErrorCode.coordinator_load_in_progress)


@dataclass(slots=True, init=False, unsafe_hash=True)  # frozen by Final (compiled rule 1)
class IdempotentRun:
    """The answers to a run of idempotent InitProducerIds: a PID (epoch 0) for each of the
    first ``len(producer_ids)``, ``error`` for the rest; sent once ``durable_offset`` is."""

    producer_ids: Final[Sequence[int]]
    error: Final[ErrorCode]
    durable_offset: Final[int]

    def __init__(self, producer_ids: Sequence[int], error: ErrorCode, durable_offset: int) -> None:
        self.producer_ids = producer_ids
        self.error = error
        self.durable_offset = durable_offset


class InitProducerIdHandler:
    """InitProducerId: authorise, decide (the transactions manager), apply, answer."""

    def __init__(
        self,
        quorum: QuorumController,
        access: Access,
        pool_grants: PoolGrants,
        on_no_producer_id: Callable[[str, bool], None],
    ) -> None:
        """``pool_grants``: what an idempotent answer waits for (its block's grant);
        ``on_no_producer_id``: told of each request refused for want of a producer id (see
        :class:`~pidctl.controller.api.handlers.Controller`)."""
        self.state = quorum.state
        self.access = access
        # Bound once: every request that writes calls it.
        self._apply = quorum.apply
        self._pool_grants = pool_grants
        self.on_no_producer_id = on_no_producer_id

    def init_producer_id(
        self, request: InitRequested, now: Now, conn: ConnectionInfo
    ) -> InitAnswer:
        """InitProducerId's handler: the answer at the request's version, whichever reader
        read it (``struct`` or kio: ``protocol.init_requests``); an idempotent one is
        decided as a run of one (:meth:`init_idempotent_run`, which decides the runs
        ``protocol.idempotent_inits`` reads). The connection packs the answer."""
        access = self.access
        transactional_id = request.transactional_id
        if transactional_id is not None:
            if not access.may(conn, "Write", "TransactionalId", transactional_id):
                return _TRANSACTIONAL_ID_DENIED
        elif not access.may_write_idempotently(conn):
            return _IDEMPOTENT_WRITE_DENIED
        if access.paused is not None:
            access.on_paused("InitProducerId")
            return _PAUSED_INIT
        expected = parse_expected(request.producer_id, request.producer_epoch)
        if isinstance(expected, ErrorCode):
            return InitAnswer(expected)
        if transactional_id is None:
            # The timeout is not looked at (clients send -1, 0, 60000 or 2^31-1).
            run = self._idempotent_run(1, now)
            if not run.producer_ids:
                return InitAnswer(run.error, durable_offset=run.durable_offset)
            return InitAnswer(_NO_ERROR, run.producer_ids[0], 0, run.durable_offset, 1)
        transactions = self.state.transactions
        held = transactions.transactional_ids.producer_id_of(transactional_id)
        # (No record of it can be too large: init_transactional refuses a transactional id
        # over MAX_TRANSACTIONAL_ID_BYTES, INVALID_REQUEST.)
        result = transactions.init_transactional(
            transactional_id,
            timeout_ms=request.timeout_ms,
            expected=expected,
            now_ms=now.wall_ms,
        )
        answer, offset = self._apply(result, now)
        error = answer.error
        if error == _NO_PRODUCER_ID_YET:
            self.on_no_producer_id("InitProducerId", self.state.producer_ids.exhausted())
        if error == _FENCED and request.api_version < 4:
            error = ErrorCode.invalid_producer_epoch  # what clients before v4 understand
        if error:
            return InitAnswer(error, durable_offset=offset)
        created = 1 if answer.producer_id != held else 0
        return InitAnswer(error, answer.producer_id, answer.producer_epoch, offset, created)

    def init_idempotent_run(self, count: int, now: Now, conn: ConnectionInfo) -> IdempotentRun:
        """``count`` idempotent InitProducerIds in a row, from one connection (read by
        ``protocol.idempotent_inits``): decided as that many :meth:`init_producer_id` calls
        would decide them, without a request or response value each. The PIDs go to the
        first requests in order; the rest are answered ``error``."""
        access = self.access
        if not access.may_write_idempotently(conn):
            return IdempotentRun([], _DENIED, NO_WAIT)
        if access.paused is not None:
            for _ in range(count):
                access.on_paused("InitProducerId")
            return IdempotentRun([], _NO_PRODUCER_ID_YET, NO_WAIT)
        return self._idempotent_run(count, now)

    def _idempotent_run(self, count: int, now: Now) -> IdempotentRun:
        """Every idempotent InitProducerId's decision, authorised: :meth:`init_idempotent_run`."""
        transactions, apply = self.state.transactions, self._apply
        taken, offset = apply(transactions.init_idempotent_run(count), now)
        if len(taken) == count:  # (nearly always: the run fits before the next refill)
            return IdempotentRun(taken, _NO_PRODUCER_ID_YET, self._wait_for(taken, offset))
        pids = list(taken)
        while taken and len(pids) < count:
            taken, offset = apply(transactions.init_idempotent_run(count - len(pids)), now)
            pids += taken
        if len(pids) < count:
            exhausted = self.state.producer_ids.exhausted()
            for _ in range(count - len(pids)):
                self.on_no_producer_id("InitProducerId", exhausted)
        return IdempotentRun(pids, _NO_PRODUCER_ID_YET, self._wait_for(pids, offset))

    def _wait_for(self, pids: Sequence[int], offset: int) -> int:
        """The offset idempotent answers with ``pids`` wait for: the grant of the last one's
        block (``pool_grants.py``); ``offset``, everything decided so far, with none."""
        return self._pool_grants.offset_of(pids[-1], offset) if pids else offset
