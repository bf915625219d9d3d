"""depthzoo's Hydra launcher plugin: Hydra finds plugins only under the ``hydra_plugins`` namespace package."""
