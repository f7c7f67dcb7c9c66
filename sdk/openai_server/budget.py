"""GET /v1/budget (extension): what the caller's key (and `?user=`) has spent of each budget
this UTC day and month, and what is left (sdk.budgets)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sdk.openai_server.errors import OpenAIError
from sdk.openai_server.serving import ServerState


async def get_budget(request: Request) -> Response:
    state: ServerState = request.app.state.tandem
    budgets = state.cascade.budgets if state.cascade is not None else state.budgets
    if budgets is None:
        return OpenAIError(404, "this server has no budgets (set [server] budgets_file)", code="not_found").response()
    user = request.query_params.get("user") or None
    return JSONResponse(await budgets.status(getattr(request.state, "key_fingerprint", None), user))
