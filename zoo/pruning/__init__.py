"""Depth pruning: plans and the surgery that applies them (`surgery`), what a segment receives inside the running
network (`capture`), the damage of each removal (`importance`) and the searches over a latency budget (`search`)."""
