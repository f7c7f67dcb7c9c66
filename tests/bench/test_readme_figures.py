"""README's figures agree with the JSON the benchmarks wrote (bench.readme_figures)."""

from __future__ import annotations

from bench import readme_figures


def test_readme_headline_table_is_what_the_json_renders():
    block = readme_figures.readme_block(readme_figures.README.read_text())
    assert block == readme_figures.render(), "README's figures table is stale: run python -m bench.readme_figures --write"


def test_every_figure_readme_links_equals_its_json():
    text = readme_figures.README.read_text()
    assert len(list(readme_figures.LINK.finditer(text))) > 100  # the prose figures are links, not typed numbers
    assert readme_figures.link_mismatches(text) == []


def test_readme_states_no_figure_without_its_source():
    assert readme_figures.unlinked_figures(readme_figures.README.read_text()) == []


def test_a_changed_figure_is_caught(monkeypatch):
    real = readme_figures.load

    def shifted(bench: str) -> dict:
        data = real(bench)
        if bench == "prefix_cache":
            data = {**data, "ttft_ratio": data["ttft_ratio"] + 0.01}
        return data

    monkeypatch.setattr(readme_figures, "load", shifted)
    text = readme_figures.README.read_text()
    assert readme_figures.readme_block(text) != readme_figures.render()
    assert any("prefix_cache.ttft_ratio" in line for line in readme_figures.link_mismatches(text))


def test_the_checks_see_typed_figures_and_wrong_links():
    typed = "The engine ran at 181.3 tok/s, 3x faster, and used 12% more memory."
    assert len(readme_figures.unlinked_figures(typed + "\n" + readme_figures.START + "\n" + readme_figures.END)) == 3
    settings = "Set `temperature 0.2` and `--step-target-ms 60`; a [3.05](bench/results/engine_throughput.json#ratio_vs_hf_static)."
    assert readme_figures.unlinked_figures(settings + "\n" + readme_figures.START + "\n" + readme_figures.END) == []
    wrong = "[9.99](bench/results/engine_throughput.json#ratio_vs_hf_static) [1](bench/results/engine_throughput.json#no_such_key)"
    assert len(readme_figures.link_mismatches(wrong)) == 2
    scaled = "[12.8](bench/results/engine_throughput.json#penalties_b32.off_run_spread*100)"
    assert readme_figures.link_mismatches(scaled) == []
