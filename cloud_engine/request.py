"""A request's life inside the cloud engine: sdk.engine_common.engine_request's shared state plus
priority, blocks' hashes, preemptions and the speculative draft."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sdk.engine_common.engine_request import EngineRequest
from sdk.protocol.request_status import RequestStatus  # noqa: F401  (re-exported)

if TYPE_CHECKING:
    from cloud_engine.block_pool import BlockHash


@dataclass
class Request(EngineRequest):
    """Everything the scheduler, the KV cache manager and the step loop track for one generation."""

    priority: int = 0  # lower value = more important; ties broken by arrival (FCFS)
    num_preemptions: int = 0
    # Prefix-cache keys of the request's full blocks, each chained over the one before (see
    # block_pool.hash_block); the KV cache manager extends it as blocks fill.
    block_hashes: list[BlockHash] = field(default_factory=list)
    # Speculative decoding: the proposer's draft for the next step (the scheduler moves it
    # into SchedulerOutput.scheduled_spec_token_ids); the running totals are EngineRequest's.
    spec_token_ids: list[int] = field(default_factory=list)
    outside_drafts: bool = False  # another model drafts for it (spec_decode.outside_drafts): no own proposals
    forced: list[bool] = field(default_factory=list)  # per token emitted this step: the grammar allowed that one only
