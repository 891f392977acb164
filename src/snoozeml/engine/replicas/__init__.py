"""The replicas of a model: one loaded instance each, the set that places and routes them,
and the autoscaler."""
