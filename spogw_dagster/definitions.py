"""The Dagster code location: `dagster dev` in the repo root loads this module through workspace.yaml.

Environment: SPOGW_PROFILE (tiny | ci | paper; default tiny) or SPOGW_CONFIG (a YAML file), and
SPOGW_ASSETS_DIR (default ./assets). See spogw_dagster/pipeline/ for the assets, checks and sensor.
"""

from spogw_dagster.pipeline.defs.wiring import definitions_from_env

defs = definitions_from_env()
