"""The run core: what a run is and how it advances — run records (`models`), pipeline specs
(`pipeline`, the fields their rules read checked by `references`), the facts Baton measures of a
stage's work (`facts`; a pipeline's own output schemas live with its spec, in
`orchestrator/pipelines/`), the run store (`store`, its Redis key
names in `keys`), the conductor that advances a run and the contract of a stage execution
(`conductor`, `execution`), the Celery app and dispatch (`queue`), settings and how Redis is
reached (`settings`, `secret_settings`, `connection`), host-side git (`git`) and the errors.

The reconciler is here too, not in the control plane: the workers run it as the fleet's
housekeeping (`workers/app.py`), so a fleet needs no service beside its workers.

The workers import this package and never `orchestrator.control`; nothing here imports the control
plane either (tests/test_architecture.py). This file imports nothing, so importing one module of
the core loads only what that module needs.
"""
