"""Error details a tandem.v1 server attaches to a failed call, and the client reads back.

The status message is for people; this trailing metadata is for programs: the servicer
(sdk.serving.grpc.errors) writes it, the SDK's client (sdk.cloud.grpc_client) rebuilds the
engine exception from it, so clients never parse messages.
"""

from __future__ import annotations

# Trailing metadata keys (gRPC wants lowercase ASCII).
ERROR_TYPE_KEY = "tandem-error-type"  # one of the *_TYPE values below
ERROR_PARAM_KEY = "tandem-error-param"  # the request field at fault (INVALID_ARGUMENT)
RETRY_AFTER_KEY = "retry-after"  # whole seconds (RESOURCE_EXHAUSTED, UNAVAILABLE)

INVALID_REQUEST_TYPE = "invalid_request"
CONTEXT_LENGTH_TYPE = "context_length_exceeded"
OVERLOADED_TYPE = "overloaded"
NOT_READY_TYPE = "not_ready"
MODEL_NOT_FOUND_TYPE = "model_not_found"
STATE_UNAVAILABLE_TYPE = "state_database_unavailable"  # the replicas' state database is unreachable (sdk.state)
INSUFFICIENT_QUOTA_TYPE = (
    "insufficient_quota"  # OpenAI's code: a budget reached; no retry-after (retrying will not help)
)
