"""The runs behind the command lines, the top layer: nothing else in ``zoo`` imports it.

* :mod:`.entry`: what ``train.py`` and ``prune.py`` share around a run: directory names, run files, signals,
  failure records, exit codes, composition errors;
* :mod:`.runs`: run identity: the fingerprint of a config, ``run.json``, when a directory may be reused;
* :mod:`.train`: a training run from a composed config (``train.py``);
* :mod:`.prune`: a pruning run from a composed config (``prune.py``): baseline, table, importance, search,
  fine-tuning, measurement; :mod:`.prune_results` holds what it reports (``results.json``, the console summary, W&B).
"""
