"""What every benchmark shares, once: ``bench/run.py NAME`` parses the common options, makes a
scratch folder, runs the scenario ``scenarios/NAME`` and publishes its report.

- :mod:`harness.cli`: the common options (duration, warm-up, rounds, concurrency, ``--out``,
  ``--json``, ``--python``…), parsed once, and :class:`~harness.cli.Bench`, what a scenario
  gets: its options, its scratch folder, the daemon starter and the report header.
- :mod:`harness.daemon`: ``python -m snoozeml serve`` as a child process on ephemeral ports.
- :mod:`harness.status`: readiness, model states and counters from ``/admin/status``.
- :mod:`harness.config`: ``models.toml`` written from plain dicts.
- :mod:`harness.oip`: inputs, the three OIP encodings and their decoders, onnxruntime checks.
- :mod:`harness.load`: the load generators: wrk with ``post.lua`` (or another Lua script) and
  ``grpc_load.py``.
- :mod:`harness.cpu`: CPU and memory accounting of the daemon, wrk and the machine.
- :mod:`harness.timing`: in-process timing.
- :mod:`harness.rounds`: alternating order, paired ratios, medians and ranges.
- :mod:`harness.report`: the machine line, markdown tables, the outcome of a run.
- :mod:`harness.logs`: the daemon's ``key=value`` log lines, parsed.
"""
