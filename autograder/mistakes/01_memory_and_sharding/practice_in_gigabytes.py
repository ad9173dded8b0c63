"""Mistake: the practice problem's numbers written in GB, while state_bytes returns bytes.

Replaces practice (exercise 1's cell; state_bytes stays the learner's right one).
"""

CAUGHT_BY = {"check_state_bytes": "that is gigabytes"}

practice = {"ddp_per_gpu": 1120, "zero3_per_gpu": 35, "ddp_fits": False, "zero3_fits": True}
