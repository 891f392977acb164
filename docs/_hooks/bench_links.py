"""MkDocs hook: links inside files included from bench/ resolve as they do on GitHub.

The benchmark pages include `bench/README.md` and `bench/results.md` whole, with
pymdownx.snippets, so that the book shows the recorded numbers themselves. Those files link to
the book's pages as `../docs/PAGE.md`, relative to bench/; once included in a page of docs/,
the same page is `PAGE.md`. This rewrites exactly that prefix, after the snippets are in and
before MkDocs checks the links, so a link that is broken for real still fails the build.
"""

from __future__ import annotations

import re
from typing import Any

from markdown import Extension, Markdown
from markdown.preprocessors import Preprocessor

_FROM_BENCH = re.compile(r"\]\(\.\./docs/")


class _BenchLinks(Preprocessor):
    def run(self, lines: list[str]) -> list[str]:
        return [_FROM_BENCH.sub("](", line) for line in lines]


class _BenchLinksExtension(Extension):
    def extendMarkdown(self, md: Markdown) -> None:  # the name is Markdown's API
        # pymdownx.snippets runs at priority 32: this runs right after it.
        md.preprocessors.register(_BenchLinks(md), "bench_links", 31)


def on_config(config: Any) -> Any:
    config.markdown_extensions.append(_BenchLinksExtension())
    return config
