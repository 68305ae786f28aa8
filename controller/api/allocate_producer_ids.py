"""AllocateProducerIds' one handler, whichever reader read the request: a broker's block
(ClusterAction), a job's (KIP-730's BrokerId -1: what an idempotent producer needs), a named
job's block or a completed version's commit (what its app id needs:
:meth:`AllocateProducerIdsHandler.app_id_refusal`), authorised and applied."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from kio.schema.errors import ErrorCode

from pidctl.controller.api.access import Access, ConnectionInfo
from pidctl.controller.api.quorum import Now, QuorumController
from pidctl.controller.api.responses import NO_WAIT
from pidctl.controller.core.acl import APP_ID
from pidctl.controller.core.job_commits import parse_commit_key
from pidctl.controller.core.jobs import parse_job_key
from pidctl.controller.core.producer_ids import (
    JOB_BROKER_EPOCH,
    JOB_BROKER_ID,
    LEASE_EXHAUSTED,
    Block,
)
from pidctl.protocol.block_requests import BlockRequested

#: Errors compared on every AllocateProducerIds, looked up once: a member read through its
#: enum class costs ~120 ns (the metaclass is searched first).
_NO_BLOCK: Final = (ErrorCode.unknown_server_error, LEASE_EXHAUSTED)
#: AllocateProducerIds refused before anything is decided: start 0 and length 0 (as Kafka).
_REFUSED_BLOCK: Final = Block(ErrorCode.cluster_authorization_failed, 0, 0)
#: A named job without Write on its app id, as a transactional id without Write on it.
_APP_ID_DENIED: Final = ErrorCode.transactional_id_authorization_failed
_INVALID_BLOCK: Final = Block(ErrorCode.invalid_request, 0, 0)
#: AllocateProducerIds while grants are paused (the disk nearly full): Kafka's retriable
#: storage error.
_PAUSED_BLOCK: Final = Block(ErrorCode.kafka_storage_error, 0, 0)


class AllocateProducerIdsHandler:
    """AllocateProducerIds: authorise, decide (the producer ids, jobs or commits manager),
    apply, answer."""

    def __init__(
        self,
        quorum: QuorumController,
        access: Access,
        on_no_producer_id: Callable[[str, bool], None],
    ) -> None:
        """``on_no_producer_id``: told of each request refused for want of a producer id
        (see :class:`~pidctl.controller.api.handlers.Controller`)."""
        self.state = quorum.state
        self.access = access
        # Bound once: every request that writes calls it.
        self._apply = quorum.apply
        self.on_no_producer_id = on_no_producer_id

    def allocate_producer_ids(
        self, request: BlockRequested, now: Now, conn: ConnectionInfo
    ) -> tuple[Block, int, int]:
        """AllocateProducerIds' handler, whichever reader read the request (``struct`` or
        kio: ``protocol.block_requests``): the block (or refusal), the offset that must be
        durable before it is answered, and the producer ids it created for a job (a new job
        block's 1,000, for the quota on new producer ids; 0 for a broker's block, which is
        the cluster's, and for a job's block answered again). The connection packs the
        answer."""
        broker_id, broker_epoch = request.broker_id, request.broker_epoch
        client_id = request.client_id
        access = self.access
        manager = self.state.producer_ids
        # A job (BrokerId -1, BrokerEpoch -1) is a producer that hands PIDs to its own
        # tasks: it needs what InitProducerId needs, not the brokers' ClusterAction: an
        # idempotent producer's IdempotentWrite (or Write on a topic), or for a named job
        # (app id, version, block in the client id, controller/core/jobs.py) what a
        # transactional id needs, Write on its app id, which it must also own.
        job = broker_id == JOB_BROKER_ID and broker_epoch == JOB_BROKER_EPOCH
        # (No record of it can be too large: a client id is at most 32,767 bytes, an app id
        # at most max_job_app_id_bytes.)
        key = commit = None
        if job:
            try:
                commit = parse_commit_key(client_id)
                key = None if commit is not None else parse_job_key(client_id)
            except ValueError:
                return _INVALID_BLOCK, NO_WAIT, 0
            if commit is not None:
                # A named job's version completed (core/job_commits.py): recorded for the
                # app id's owner, as its blocks are.
                refused = self.app_id_refusal(conn, commit.app_id)
                if refused:
                    return Block(refused, 0, 0), NO_WAIT, 0
            elif key is not None:
                refused = self.app_id_refusal(conn, key.app_id)
                if refused:
                    return Block(refused, 0, 0), NO_WAIT, 0
                committed = self.state.commits.committed_block(key.app_id, key.version, key.block)
                if committed is not None:  # a re-run of a completed version writes nothing
                    return committed, NO_WAIT, 0
            elif not access.may_write_idempotently(conn):
                return _REFUSED_BLOCK, NO_WAIT, 0
        elif not access.may(conn, "ClusterAction"):
            return _REFUSED_BLOCK, NO_WAIT, 0
        if access.paused is not None:
            access.on_paused("AllocateProducerIds")
            return _PAUSED_BLOCK, NO_WAIT, 0
        if commit is not None:
            done, offset = self._apply(
                self.state.commits.commit(commit, principal=conn.principal), now
            )
            return done, offset, 0
        if key is not None:
            result = self.state.jobs.allocate(
                key,
                wall_ms=now.wall_ms,
                mono_ms=now.mono_ms,
                principal=conn.principal,
                client_id=client_id,
            )
        elif job:
            result = manager.allocate_for_job(principal=conn.principal, client_id=client_id)
        else:
            result = manager.allocate(
                broker_id=broker_id,
                broker_epoch=broker_epoch,
                principal=conn.principal,
                client_id=client_id,
            )
        block, offset = self._apply(result, now)
        if block.error in _NO_BLOCK:
            self.on_no_producer_id("AllocateProducerIds", manager.exhausted())
        # A job's block is new when it was recorded now (one answered again writes nothing).
        created = block.length if job and result.records else 0
        return block, offset, created

    def app_id_refusal(self, conn: ConnectionInfo, app_id: str) -> ErrorCode:
        """May this connection's principal act on the job app id ``app_id``? ErrorCode.none
        if so; else the Kafka error to answer, nothing decided: INVALID_REQUEST for an app
        id longer than ``max_job_app_id_bytes``; TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        without an ACL allowing Write on it (resource type ``AppId``, literal or
        prefixed, as a TransactionalId), or when another principal owns it (the one that
        recorded its latest version). For every request that names an app id."""
        if not self.access.may(conn, "Write", APP_ID, app_id):
            return _APP_ID_DENIED
        return self.state.jobs.refusal(app_id, conn.principal)
