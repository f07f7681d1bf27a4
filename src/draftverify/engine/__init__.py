"""The step engine behind loop.generate: a step's four verbs (step.py: propose, score, verify, commit) and what
lives beside them: the rows joining and leaving (scheduler.py), constraints on the target's logits
(processors.py) and the statistics built from one record per step (stats.py)."""
