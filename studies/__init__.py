"""The lab: research protocols and diagnoses, one file per question, apart from the benchmark suites that check the
product's claims (``benchmarks/``). Each is run as ``python -m studies.<name>``; their results are judged by the same
rules as a suite's (``python -m benchmarks judge FILE``).

- ``prune_quality``: which search prunes best, at the measured target, over seeds (+ ``prune_quality_report``).
- ``int8_depth``: do depth pruning and INT8 compose, and which table should plan an INT8 network.
- ``int8_decode``: what 8-bit weights gain in RetNet decode speed and cost in decode perplexity, over trained seeds.
- ``prune_cost``: what the whole default ``prune.py`` costs, cold, against the previous default, in turns.
- ``latency_diagnosis``: where a latency table's error comes from (drift, neighbours, hooks, sessions, parts).
- ``table_error_parts``: which part of a table's error repeats from build to build (a ``latency_table`` run's plans).
- ``runtime_diagnosis``: one network timed whole and segment by segment in a deploy runtime.
- ``timm_prune``: which timm architectures prune to a measured target by ``model=timm``, over seeds, and what
  discovery costs against a declared family.
- ``timm_census``: which of all of timm's architectures discovery makes prunable, and that every unit it offers is
  proven again on another draw and removes to a network that runs.
- ``removal_additivity``: whether the latency savings of removed units add up, as a table assumes (ConvNeXt-atto).
- ``shared_machine``: what two prune jobs cost when a joblib study runs them at once on one machine.
- ``stats``: the paired tests and corrections the studies share; ``jobs``: ``prune.py`` and ``train.py`` run as a
  user runs them.
"""
