"""FX graphs: facts about them, and cutting them along a plan.

- ``nodes``: small facts about FX nodes (example values, attributes, what
  counts as a compute node).
- ``export``: a Dynamo graph as the planner's flat arrays.
- ``blocks``: repeated module blocks, piece signatures and grouping, edges.
- ``checkpoints``: activation checkpoints: their bodies as block facts and
  identity, and splitting one that spans several blocks (Note [Checkpoint
  bodies]).
- ``cut``: one GraphModule per piece of a plan.
- ``stitch``: the compiled pieces run as one callable.
- ``frames``: where a graph came from (its frame and graph break).
"""
