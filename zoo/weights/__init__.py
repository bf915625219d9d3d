"""Weights: building a registered model with them (`create`), finding published ones (`pretrained`, `tags`) and our own
checkpoint files (`checkpoint`)."""
