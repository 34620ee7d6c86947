"""The methods compared with SPOGW, as pure definitions: each method's configuration (`catalog.py`: SPOGW,
GRPO, ScoreFlow's Score-DPO, W4S's RWR and the ablations, each the loop's configuration with a few fields
changed) and W4S's history-relative reward and state advance (`w4s.py`)."""
