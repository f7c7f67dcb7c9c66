"""The documentation's figures (README.md, docs/*.md) agree with the JSON the benchmarks wrote
(bench.readme_figures)."""

from __future__ import annotations

from bench import readme_figures


def test_readme_headline_table_is_what_the_json_renders():
    page = readme_figures.block_page()
    assert page == readme_figures.README
    block = readme_figures.readme_block(page.read_text())
    assert block == readme_figures.render(), (
        f"{page.name}'s figures table is stale: run python -m bench.readme_figures --write"
    )


def test_the_pages_are_readme_and_docs():
    names = [readme_figures.page_name(page) for page in readme_figures.pages()]
    assert names[0] == "README.md" and "docs/benchmarks.md" in names and "docs/local-engine.md" in names


def test_every_figure_the_pages_link_equals_its_json():
    links = sum(len(list(readme_figures.LINK.finditer(page.read_text()))) for page in readme_figures.pages())
    assert links > 100  # the prose figures are links, not typed numbers
    assert readme_figures.all_link_mismatches() == []


def test_the_pages_state_no_figure_without_its_source():
    assert readme_figures.all_unlinked_figures() == []


def test_a_link_from_docs_must_climb_to_bench_results():
    good = "[3.05](../bench/results/engine_throughput.json#ratio_vs_hf_static)"
    page = readme_figures.DOCS / "benchmarks.md"
    assert readme_figures.link_mismatches(good, page) == []
    wrong = readme_figures.link_mismatches(good.replace("../", ""), page)
    assert len(wrong) == 1 and "docs/benchmarks.md links bench/results/engine_throughput.json" in wrong[0]
    assert readme_figures.link_mismatches(good, readme_figures.README) != []  # from the root, ../ leaves the tree


def test_a_changed_figure_is_caught(monkeypatch):
    real = readme_figures.load

    def shifted(bench: str) -> dict:
        data = real(bench)
        if bench == "prefix_cache":
            data = {**data, "ttft_ratio": data["ttft_ratio"] + 0.01}
        return data

    monkeypatch.setattr(readme_figures, "load", shifted)
    text = readme_figures.block_page().read_text()
    assert readme_figures.readme_block(text) != readme_figures.render()
    caught = [line for line in readme_figures.all_link_mismatches() if "prefix_cache.ttft_ratio" in line]
    assert caught and all(" says " in line for line in caught)


def test_the_checks_see_typed_figures_and_wrong_links():
    typed = "The engine ran at 181.3 tok/s, 3x faster, and used 12% more memory."
    assert len(readme_figures.unlinked_figures(typed + "\n" + readme_figures.START + "\n" + readme_figures.END)) == 3
    settings = (
        "Set `temperature 0.2` and `--step-target-ms 60`; "
        "a [3.05](bench/results/engine_throughput.json#ratio_vs_hf_static)."
    )
    assert readme_figures.unlinked_figures(settings + "\n" + readme_figures.START + "\n" + readme_figures.END) == []
    wrong = (
        "[9.99](bench/results/engine_throughput.json#ratio_vs_hf_static) "
        "[1](bench/results/engine_throughput.json#no_such_key)"
    )
    assert len(readme_figures.link_mismatches(wrong)) == 2
    scaled = "[12.8](bench/results/engine_throughput.json#penalties_b32.off_run_spread*100)"
    assert readme_figures.link_mismatches(scaled) == []


def test_the_block_is_optional_in_a_page():
    assert readme_figures.unlinked_figures("Measured at 181.3 tok/s.") == ["'181.3 tok/s' in: Measured at 181.3 tok/s."]


def _checked(prose: str) -> list[str]:
    return readme_figures.unlinked_figures(prose + "\n" + readme_figures.START + "\n" + readme_figures.END)


def test_a_measured_figure_in_a_code_span_is_caught():
    # What README once said: test durations and ratios typed in code font, with no JSON behind them.
    typed = (
        "Three replicas took `150-170 s` for that test, with one thread each `22 s`.\n"
        "The run before measured `0.75` and a TTFT ratio of `1.71`; APGR `0.50`-`0.52`; the load split within `20%`."
    )
    found = _checked(typed)
    assert [entry.split(" ", 1)[0] for entry in found] == [
        "'`150-170",
        "'`22",
        "'`0.75`'",
        "'`1.71`'",
        "'`0.50`'",
        "'`0.52`'",
        "'`20%`'",
    ], found
    assert all("code span" in entry for entry in found)
    # Linked, the same figure is checked against its JSON instead.
    linked = (
        "The quick run measured "
        "[0.899](bench/results/serve_local_vs_llama_server_quick.json#ratio_output_tps_vs_llama_server_c8)."
    )
    assert _checked(linked) == [] and readme_figures.link_mismatches(linked) == []


def test_settings_targets_and_code_in_spans_are_not_figures():
    settings = (
        "Default `30`, a `256`-token window, `--drain-grace-s 30`, `temperature 0.2, top_p 0.9`, at `threshold 0.5`, "
        "`slow_step_share = 0.05`, `max_body_bytes` (default `4 * 1024 * 1024`), target `<= 1.2`, `≥ 0.95`, `≤ 10 ms`, "
        "`compile p50 <= 50 ms`, `k=8`, `auto:0.35`, `0.5 + gain / 2`, `quantile_0.05`, `1e-4`, llguidance `1.9.1`, "
        "`CPT(50%)`, `python -m bench.soak --num-requests 2000 --prompt-shares 0.5 0.35 0.15`, file `0600`."
    )
    assert _checked(settings) == []
    # A fenced block is code whatever it holds, and the same figure in prose is still caught.
    fenced = "```\n$ time pytest\n22 s\n```\nOne thread each took 22 s."
    assert [entry.split(" in:")[0] for entry in _checked(fenced)] == ["'22 s'"]


def test_relink_rewrites_only_the_named_benches_links_in_their_own_format(monkeypatch):
    data = {"a": {"x": 1234.567, "y": 0.5}, "b": {"x": 2.0}}
    monkeypatch.setattr(readme_figures, "load", lambda bench: data[bench])
    text = (
        "[1,111.1](bench/results/a.json#x) [+9.00](bench/results/a.json#y) [7](../bench/results/a.json#y*100) "
        "[3](bench/results/b.json#x)"
    )
    assert readme_figures.relink(text, {"a"}) == (
        "[1,234.6](bench/results/a.json#x) [+0.50](bench/results/a.json#y) [50](../bench/results/a.json#y*100) "
        "[3](bench/results/b.json#x)"
    )


def test_a_target_against_a_standard_error_reads_the_se(monkeypatch):
    """ "> SE" (a paired difference must beat its own standard error) is judged on the JSON's SE, not a constant."""
    data = {"diff": 0.05, "diff_se": 0.04, "worse": -0.09, "worse_se": 0.08}
    monkeypatch.setattr(readme_figures, "load", lambda bench: data)
    beats = readme_figures.Figure("d", "x", "diff", 3, "> SE", se="diff_se")
    assert beats.met() == "met" and beats.shown_target() == "> SE (0.040)"
    data["diff_se"] = 0.06
    assert beats.met() == "**not met**"
    above = readme_figures.Figure("w", "x", "worse", 3, ">= -SE", se="worse_se")
    assert above.met() == "**not met**" and above.shown_target() == ">= -SE (-0.080)"
    data["worse"] = -0.07
    assert above.met() == "met"
