"""`tandem serve --draft-on-device` as a new user reaches it (issue 56): README's own example through the
official openai client, only with model `cloud`, against the embedded default with the cloud engine in
float32 and greedy cloud sampling. The answer's text is the cloud's own greedy answer (the same server
setup without drafting), and the `tandem` extension says how many rounds the device drafted and how many
of its tokens the cloud accepted."""

from __future__ import annotations

import contextlib
import io

import pytest

from bench.first_contact import README_BASE_URL, readme_example
from tests.conftest import running_server

pytestmark = pytest.mark.slow

GREEDY_CLOUD = ["--cloud-sampling", "temperature=0", "--threshold", "0.5"]


def readme_answer(base_url: str):
    code = readme_example().replace(README_BASE_URL, f"{base_url}/v1").replace('model="auto"', 'model="cloud"')
    assert 'model="cloud"' in code
    namespace: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(code, "README.md", "exec"), namespace)
    out = namespace["out"]
    return out.choices[0].message.content, out.model_extra["tandem"]


def test_readme_example_drafted_on_the_device_is_the_clouds_own_greedy_answer(tmp_path):
    env = {"TANDEM_CLOUD_DTYPE": "float32"}
    answers = {}
    for drafting in (False, True):
        args = ["serve", *GREEDY_CLOUD] + (["--draft-on-device"] if drafting else [])
        log = tmp_path / f"serve-drafting-{drafting}.log"
        with running_server(args, log, extra_env=env) as (_process, base_url):
            answers[drafting] = readme_answer(base_url)
    (alone, plain), (drafted, routing) = answers[False], answers[True]
    assert routing["tier"] == "cloud" and plain["tier"] == "cloud"
    assert drafted == alone, (drafted, alone)
    drafts = routing["drafts"]
    assert drafts["rounds"] > 0 and drafts["accepted_tokens"] > 0 and drafts["stopped"] is None, routing
    assert "drafts" not in plain and "draft_refused" not in plain
