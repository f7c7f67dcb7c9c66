"""README's figures agree with the JSON the benchmarks wrote (bench.readme_figures)."""

from __future__ import annotations

from bench import readme_figures


def test_readme_headline_table_is_what_the_json_renders():
    block = readme_figures.readme_block(readme_figures.README.read_text())
    assert block == readme_figures.render(), "README's figures table is stale: run python -m bench.readme_figures --write"


def test_figures_readme_quotes_in_prose_equal_their_json():
    assert readme_figures.quote_mismatches(readme_figures.README.read_text()) == []


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
    assert any("prefix_cache.ttft_ratio" in line for line in readme_figures.quote_mismatches(text))
