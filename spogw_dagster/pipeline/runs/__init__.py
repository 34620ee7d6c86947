"""Run control: `spogw run` (the loop), the assets directory's lock and the executors that wait for it, steps
in containers, the pipeline's CLI subcommands, `spogw check` (preflight), `spogw plan` and `spogw gc`."""
