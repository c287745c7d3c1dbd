"""The control plane: what people and scripts use to drive and watch runs — the Python API
(`api`), the `baton` command (`cli`, `cli_inspect`), what a run did (`inspection`, `report`,
`tables`), `baton serve`'s REST API and web UI (`server`), the fleet view of `baton top`
(`fleet`), the Flower launcher (`flower`, `flower_app`) and intake of issues (`intake`).

Built on `orchestrator.core`; the workers never import it (tests/test_architecture.py).
"""
